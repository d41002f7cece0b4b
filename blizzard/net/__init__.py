"""Connections: ZeroMQ sockets and calls (``transport``), CURVE and its ZAP handler
(``secure``), key pairs and who each key speaks for (``keys``), addresses.

Uses ``blizzard.host`` and ``blizzard.wire`` only; both the client and the servers stand on it.
"""
