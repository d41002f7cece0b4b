"""A listening Unix socket at a path, as a server that owns the path makes one.

The socket file appears with its mode already set: it is bound in a private directory beside
the path, given ``mode``, listened on, and only then renamed to the path, so no client can
connect while it has the default mode. A path where a live server listens is refused; a
stale socket file (its server is gone) is replaced; anything else at the path (a file, a
directory) is refused. ``remove`` takes the file away when the server stops, unless another
server has replaced it meanwhile.
"""

from __future__ import annotations

import errno
import os
import socket
import stat
import tempfile

# sun_path holds 108 bytes with its NUL on Linux; the private directory's name is beside it
MAX_PATH_BYTES = 107


class UnixListener:
    """``sock`` listens at ``path`` (see the module's docstring)."""

    def __init__(self, path: str, mode: int, backlog: int = 128) -> None:
        self.path = os.path.abspath(path)
        if len(os.fsencode(self.path)) > MAX_PATH_BYTES - 16:
            raise ValueError(f"{path!r}: a Unix socket's path must be under "
                             f"{MAX_PATH_BYTES - 16} bytes")
        _clear(self.path)
        private = tempfile.mkdtemp(prefix=".sock-", dir=os.path.dirname(self.path))
        inner = os.path.join(private, "s")
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self.sock.bind(inner)
            os.chmod(inner, mode)
            self.sock.listen(backlog)
            os.rename(inner, self.path)
        except BaseException:
            self.sock.close()
            raise
        finally:
            if os.path.lexists(inner):
                os.unlink(inner)
            os.rmdir(private)
        self.inode = os.lstat(self.path).st_ino

    def remove(self) -> None:
        """Remove the socket file, if it is still this listener's."""
        try:
            if os.lstat(self.path).st_ino == self.inode:
                os.unlink(self.path)
        except FileNotFoundError:
            pass


def _clear(path: str) -> None:
    """Make way at ``path``: nothing there, or a stale socket (removed); else raise."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise FileExistsError(errno.EEXIST, f"{path} exists and is not a socket: not replaced")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.settimeout(1.0)
        probe.connect(path)
    except (ConnectionRefusedError, FileNotFoundError):
        os.unlink(path)  # stale: its server is gone
        return
    except TimeoutError:  # alive, too busy to accept
        pass
    finally:
        probe.close()
    raise OSError(errno.EADDRINUSE, f"a server already listens on {path}")
