"""``python -m datanode``: a data node, same options as ``blizzard datanode``."""

from blizzard.cli import datanode

if __name__ == "__main__":
    datanode(prog_name="python -m datanode")
