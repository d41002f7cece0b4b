"""The ground floor: the bytes on the wire and the names every part shares.

The codec (``codec``), every message (``protocol``, with the families of ``*_messages``), the
one error tree (``errors``), the limits both sides check (``limits``), a queue's settings and
an item's metadata. Imports nothing of Blizzard above it: the client, the servers, the CLI
and the tools all stand on it.
"""
