"""``python -m blizzard.cli``: the ``blizzard`` command."""

from blizzard.cli.main import main

main()
