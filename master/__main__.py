"""``python -m master``: the master server, same options as ``blizzard master``."""

from blizzard.cli import master

if __name__ == "__main__":
    master(prog_name="python -m master")
