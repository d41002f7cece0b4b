"""``python -m datanode``: a data node, same options as ``blizzard datanode``."""

from datanode.cli import datanode_command

if __name__ == "__main__":
    datanode_command(prog_name="python -m datanode")
