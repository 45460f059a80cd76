"""One process writes a run folder at a time: a run, or a resume of it.

The lock is an fcntl lock on <run>/.lock, which the kernel releases when the process that
holds it exits, however it exits (a crash, SIGKILL): a lock file left by a dead process is
simply taken. The file names the holder (pid, host, command, since when), so that a second
process can say who has the folder; the holder removes it when done. The ranks, forked from
the launcher, share its lock: a launcher killed outright leaves the folder held until its
ranks, which die with it, are gone. (On NFS, where flock is emulated with POSIX locks,
forked ranks do not share it.)
"""
from __future__ import annotations

import fcntl
import json
import os
import socket
import stat
import sys
import time
from pathlib import Path

from ...errors import ExoframeError
from ...files import disk_full

LOCK_FILE = ".lock"


class RunLock:
    def __init__(self, path: Path, fd: int):
        self.path, self._fd = path, fd

    @classmethod
    def take(cls, folder) -> "RunLock":
        """The folder's lock, or one line naming who holds it."""
        path = Path(folder) / LOCK_FILE
        while True:
            fd = _open_regular(path)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _read_holder(fd)
                os.close(fd)
                raise ExoframeError(
                    f"{folder}: in use by {holder}; a run folder is written by one run at a "
                    "time. Wait for it to end (or stop it), then try again.") from None
            if _same_file(fd, path):
                break
            os.close(fd)  # its holder removed it as we opened it: take the new one
        lock = cls(path, fd)
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps({
                "pid": os.getpid(), "host": socket.gethostname(),
                "command": " ".join(["exoframe", *sys.argv[1:]]),
                "since": time.strftime("%Y-%m-%d %H:%M:%S")}).encode() + b"\n", 0)
        except OSError as e:  # a full disk: the holder stays unnamed, the lock is no less held
            if disk_full(e) is None:
                lock.release()
                raise
        return lock

    def release(self):
        """Remove the file while still holding it (a process that opened it meanwhile sees
        that it is gone, see take), then let go."""
        if self._fd is not None:
            if _same_file(self._fd, self.path):  # (not a file someone put in its place)
                self.path.unlink()
            os.close(self._fd)
            self._fd = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()


def _open_regular(path: Path) -> int:
    """The lock file, opened or made. Anything else at its path (a link, which would have us
    write where it points; a FIFO, whose open would block; a folder) is refused untouched."""
    try:
        regular = stat.S_ISREG(os.lstat(path).st_mode)
    except FileNotFoundError:
        regular = True  # (the open makes it)
    if regular:  # O_NOFOLLOW, O_NONBLOCK: in case it was replaced since
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW
                     | os.O_NONBLOCK, 0o666)
        info = os.fstat(fd)
        if stat.S_ISREG(info.st_mode) and info.st_nlink <= 1:  # (not a hard link to a record)
            return fd
        os.close(fd)
    raise ExoframeError(
        f"{path}: {_kind(path)}, not the plain file exoframe keeps as the run folder's lock; "
        "nothing was changed. Remove it, then try again.")


def _kind(path: Path) -> str:
    try:
        mode = os.lstat(path).st_mode
    except OSError:
        return "replaced as it was opened"
    kinds = [(stat.S_ISLNK, "a symbolic link"), (stat.S_ISDIR, "a folder"),
             (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket")]
    return next((name for test, name in kinds if test(mode)),
                "a hard link to another file" if stat.S_ISREG(mode) else "a device")


def _same_file(fd: int, path: Path) -> bool:
    try:  # (lstat: a link put in its place is not it)
        return os.path.samestat(os.fstat(fd), os.lstat(path))
    except FileNotFoundError:
        return False


NAME_WAIT = 0.5  # seconds a refused process waits for the holder to write its name


def _read_holder(fd: int) -> str:
    """Who holds the lock, as its file names it. A holder that has just taken the lock may
    not have written its name yet (a loaded machine widens that gap): wait a little for it."""
    deadline = time.monotonic() + NAME_WAIT
    while True:
        try:
            holder = json.loads(os.pread(fd, 4096, 0) or b"{}")
            return (f"process {holder['pid']} on {holder['host']} ('{holder['command']}', "
                    f"since {holder['since']})")
        except (OSError, ValueError, KeyError, TypeError):
            if time.monotonic() >= deadline:
                return "another process"  # (it never wrote its name: a full disk)
            time.sleep(0.01)
