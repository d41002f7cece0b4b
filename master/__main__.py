"""``python -m master``: the master server, same options as ``blizzard master``."""

from master.cli import master_command

if __name__ == "__main__":
    master_command(prog_name="python -m master")
