"""The service's socket: a folder only root controls, a socket file root:GROUP 0660 made through that folder's
descriptor, and an accept that survives running out of descriptors.

The folder. /run/dvfs-mlops (the default, systemd's RuntimeDirectory) is made or set root:GROUP 0750 through its own
descriptor; any other folder must already be root's and writable by root alone (or is made so when missing, its parent
being such a folder). Every folder above is checked the same way, reached without following a link
(`guard.open_trusted_dir`), so nobody but root can swap the socket for a link before or after it is bound.

The socket file. Bound at /proc/self/fd/<folder>/<name> under umask 0117 (so it is 0660 from its first moment and only
root and the owner group can ever connect), then given to GROUP with fchownat(AT_SYMLINK_NOFOLLOW). A socket file
left by a dead service is removed through the folder's descriptor; anything else in its place is refused.

Out of descriptors. accept(2) fails with EMFILE/ENFILE while the connection stays queued (and a client's connect()
blocks once the backlog is full). The listener keeps one spare descriptor: on EMFILE it frees it, accepts the waiting
connection, answers it in one line, closes it and takes the spare again, so the queue drains and the service goes on
(the "reserve descriptor" way of libev's and nginx's accept loops).
"""
from __future__ import annotations

import contextlib
import errno
import logging
import os
import socket
import stat
import time
from collections.abc import Callable
from pathlib import Path

from dvfs_mlops import settings
from dvfs_mlops.errors import DvfsError, StateFolderError
from dvfs_mlops.hw.guard import DIR_FLAGS, open_trusted_dir

log = logging.getLogger(__name__)

SOCKET_DIR_MODE = 0o750
SOCKET_MODE = 0o660
BACKLOG = 128


def _default_folder() -> Path:
    return Path(settings.CLOCKD_SOCKET_DEFAULT).parent


def _open_folder(folder: Path, gid: int) -> int:
    """The socket folder's descriptor, checked (or made, or for the default folder set) root:GROUP 0750.

    Raises:
        DvfsError: the folder cannot exist there, or is not root's alone (one line).
    """
    managed = folder == _default_folder()
    try:
        fd = open_trusted_dir(folder, "socket folder")
    except FileNotFoundError:
        fd = _make_folder(folder)
        managed = True
    except StateFolderError as e:
        raise DvfsError(f"cannot listen in {folder}: {e}") from None
    try:
        st = os.fstat(fd)
        if managed and (st.st_gid != gid or stat.S_IMODE(st.st_mode) != SOCKET_DIR_MODE):
            os.fchown(fd, 0, gid)
            os.fchmod(fd, SOCKET_DIR_MODE)
        return fd
    except BaseException:
        os.close(fd)
        raise


def _make_folder(folder: Path) -> int:
    try:
        parent = open_trusted_dir(folder.parent, "socket folder")
    except (FileNotFoundError, NotADirectoryError):
        raise DvfsError(f"cannot make the socket folder {folder}: {folder.parent} does not exist (create it as root, or "
                        "pick another --socket)") from None
    except StateFolderError as e:
        raise DvfsError(f"cannot make the socket folder {folder}: {e}") from None
    try:
        with contextlib.suppress(FileExistsError):
            os.mkdir(folder.name, 0o700, dir_fd=parent)
        return os.open(folder.name, DIR_FLAGS, dir_fd=parent)
    except OSError as e:
        raise DvfsError(f"cannot make the socket folder {folder}: {e.strerror or e}") from None
    finally:
        os.close(parent)


class Listener:
    """The listening socket at `path`, members of `gid` allowed to connect.

    Args:
        path: the socket file.
        gid: the group that may connect.
    """

    def __init__(self, path: Path, gid: int):
        self.path = Path(os.path.abspath(path))
        self.gid = gid
        self.sock: socket.socket | None = None
        self._dir_fd: int | None = None
        self._spare: int | None = None
        self._last_warning = 0.0

    def open(self) -> None:
        """Check or make the folder, clear a dead service's socket, bind, listen.

        Raises:
            DvfsError: the folder is not safe or cannot exist, another service listens, or something else is in the
                socket's place (one line each).
        """
        self._dir_fd = _open_folder(self.path.parent, self.gid)
        name = self.path.name
        self._clear_stale(name)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o117)  # 0660 from the first moment: root and the group only
        try:
            sock.bind(f"/proc/self/fd/{self._dir_fd}/{name}")
        except OSError as e:
            sock.close()
            raise DvfsError(f"cannot listen on {self.path}: {e.strerror or e}") from None
        finally:
            os.umask(old)
        os.chown(name, 0, self.gid, dir_fd=self._dir_fd, follow_symlinks=False)
        sock.listen(BACKLOG)
        sock.setblocking(False)
        self.sock = sock
        self._spare = os.open("/dev/null", os.O_RDONLY | os.O_CLOEXEC)

    def _clear_stale(self, name: str) -> None:
        assert self._dir_fd is not None
        try:
            st = os.stat(name, dir_fd=self._dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            return
        if not stat.S_ISSOCK(st.st_mode):
            raise DvfsError(f"{self.path} exists and is not a socket: remove it (sudo rm {self.path}) and start again")
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(f"/proc/self/fd/{self._dir_fd}/{name}")
        except OSError:
            os.unlink(name, dir_fd=self._dir_fd)  # a socket file nobody listens on: a service that died
            return
        finally:
            probe.close()
        raise DvfsError(f"a clock service already listens on {self.path}; stop it first (sudo systemctl stop dvfs-clockd)")

    def fileno(self) -> int:
        assert self.sock is not None
        return self.sock.fileno()

    def accept(self, refuse: Callable[[socket.socket, str], None]) -> socket.socket | None:
        """One waiting connection, or None (none waiting, or one refused for want of descriptors).

        Args:
            refuse: answers and closes a connection the service cannot take (`ClockService._refuse`).
        """
        assert self.sock is not None
        try:
            conn, _ = self.sock.accept()
            return conn
        except (BlockingIOError, InterruptedError, ConnectionAbortedError):
            return None
        except OSError as e:
            if e.errno not in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                raise
            self._out_of_descriptors(e, refuse)
            return None

    def _out_of_descriptors(self, err: OSError, refuse: Callable[[socket.socket, str], None]) -> None:
        now = time.monotonic()
        if now - self._last_warning > 10:
            self._last_warning = now
            log.warning("clockd: accept failed (%s): refusing new connections until descriptors free up", err.strerror)
        if self._spare is not None:
            os.close(self._spare)
            self._spare = None
            with contextlib.suppress(OSError):
                conn, _ = self.sock.accept()  # type: ignore[union-attr]
                refuse(conn, "the clock service is out of file descriptors; retry in a moment")
            with contextlib.suppress(OSError):
                self._spare = os.open("/dev/null", os.O_RDONLY | os.O_CLOEXEC)
        time.sleep(0.01)  # back off: whoever holds the descriptors gives some back

    def close(self) -> None:
        """Stop listening and remove the socket file (through the folder's descriptor)."""
        if self.sock is not None:
            with contextlib.suppress(OSError):
                self.sock.close()
            self.sock = None
        if self._dir_fd is not None:
            with contextlib.suppress(OSError):
                st = os.stat(self.path.name, dir_fd=self._dir_fd, follow_symlinks=False)
                if stat.S_ISSOCK(st.st_mode):
                    os.unlink(self.path.name, dir_fd=self._dir_fd)
            os.close(self._dir_fd)
            self._dir_fd = None
        if self._spare is not None:
            os.close(self._spare)
            self._spare = None
