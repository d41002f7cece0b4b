"""The ``blizzard`` command (``main``) and its subcommands, one module per family;
``common``: what every command line shares (the servers' too).

The top floor: may use every other part of ``blizzard``.
"""
