"""The process on its machine: what a server asks of the host rather than of the network.

Its files kept private (``file_modes``), its file descriptors raised, budgeted and told apart
from a failing disk (``fd_limits``), and the log lines an outsider can cause throttled
(``log_limit``). Imports nothing of Blizzard: ``net`` and everything above stand on it.
"""
