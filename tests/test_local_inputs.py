"""Local inputs a command must not trust: a config "file" without end, and a key export's
destination that someone else controls (blizzard/cli/config.py, blizzard/net/keys.py)."""

from __future__ import annotations

import os
import resource
import subprocess
import sys

import pytest

from blizzard.net import keys as k
from blizzard.wire.errors import AuthenticationFailed

pytestmark = pytest.mark.cluster  # the real commands, in processes of their own

MEMORY_BYTES = 1 << 30  # the command's address space: reading /dev/zero whole would pass it


def _bounded_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_BYTES, MEMORY_BYTES))


@pytest.mark.parametrize("command", [["-m", "master"], ["-m", "blizzard.cli", "master"]],
                         ids=["python-m-master", "blizzard-master"])
def test_a_config_without_end_is_refused_in_one_line(tmp_path, command):
    proc = subprocess.run([sys.executable, *command, "--config", "/dev/zero",
                           "--data-dir", str(tmp_path / "m")], capture_output=True, text=True,
                          timeout=60, preexec_fn=_bounded_memory)
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "/dev/zero" in lines[0] and "KiB" in lines[0], proc.stderr[-2000:]


def _export(keys: str, out: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "blizzard.cli", "keys", "export-client", keys,
                           out], capture_output=True, text=True, timeout=60)


def test_export_client_writes_only_into_a_directory_of_the_callers_own(tmp_path):
    """A destination others may write to, that another user owns, or that is a symbolic
    link is refused, and nothing is written there; a new one is made 0700 with files 0600."""
    keys = str(tmp_path / "keys")
    k.generate(keys)

    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    proc = _export(keys, str(shared))
    assert proc.returncode != 0 and "written by other users" in proc.stderr
    assert os.listdir(shared) == []

    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o700)
    if os.geteuid() == 0:  # another user's, as only root can make it here
        os.chown(theirs, 65534, 65534)
        with pytest.raises(AuthenticationFailed, match="belongs to another user"):
            k.export_client(keys, str(theirs))
        assert os.listdir(theirs) == []

    target = tmp_path / "target"
    target.mkdir(mode=0o700)
    link = tmp_path / "link"
    link.symlink_to(target)
    proc = _export(keys, str(link))
    assert proc.returncode != 0 and "symbolic link" in proc.stderr
    assert os.listdir(target) == []

    made = tmp_path / "client-machine"
    proc = _export(keys, str(made))
    assert proc.returncode == 0, proc.stderr
    assert oct(made.stat().st_mode & 0o777) == oct(0o700)
    assert sorted(os.listdir(made)) == ["client.key", "client.key_secret", "datanode.key",
                                        "master.key"]
    assert {oct(p.stat().st_mode & 0o777) for p in made.iterdir()} == {oct(0o600)}
    assert k.ClientKeys.from_dir(str(made)) == k.ClientKeys.from_dir(keys)
