"""The release this process runs: the package's version, read once from its installed metadata.

``setup.cfg``'s ``version`` is the one place it is written; ``blizzard --version``,
``blizzard.__version__`` and the beanstalkd gateway's ``stats`` all say this. It is not the wire
version (``codec.VERSION``), which changes only when the frame layout does: releases of one
wire version talk to each other (docs/operations.md, Upgrades).
"""

from __future__ import annotations

import importlib.metadata

DISTRIBUTION = "blizzard"
UNKNOWN = "unknown"  # run from a checkout that was never installed (no metadata to read)


def installed_release() -> str:
    """The installed package's version, or ``UNKNOWN`` when it is not installed."""
    try:
        return importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return UNKNOWN


RELEASE = installed_release()
