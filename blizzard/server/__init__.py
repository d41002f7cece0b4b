"""What only the servers (``master``, ``datanode``) use: the request loop's socket
(``router``), connection and descriptor guards, capabilities, metrics, logs.

Uses ``blizzard.wire`` and ``blizzard.net``; the client never imports it, so a client
installs without the servers' dependencies (``blizzard[server]``).
"""
