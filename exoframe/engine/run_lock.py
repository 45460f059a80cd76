"""One process writes a run folder at a time: a run, or a resume of it.

The lock is an fcntl lock on <run>/.lock, which the kernel releases when the process that
holds it exits, however it exits (a crash, SIGKILL): a lock file left by a dead process is
simply taken. The file names the holder (pid, host, command, since when), so that a second
process can say who has the folder; it is removed when the holder is done. The ranks, forked from the launcher, share its lock: a folder
stays held while any of them could still write into it.
"""
from __future__ import annotations

import fcntl
import json
import os
import socket
import sys
import time
from pathlib import Path

from ..errors import ExoframeError

LOCK_FILE = ".lock"


class RunLock:
    def __init__(self, path: Path, fd: int):
        self.path, self._fd = path, fd

    @classmethod
    def take(cls, folder) -> "RunLock":
        """The folder's lock, or one line naming who holds it."""
        path = Path(folder) / LOCK_FILE
        while True:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
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
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps({
            "pid": os.getpid(), "host": socket.gethostname(),
            "command": " ".join(["exoframe", *sys.argv[1:]]),
            "since": time.strftime("%Y-%m-%d %H:%M:%S")}).encode() + b"\n", 0)
        return cls(path, fd)

    def release(self):
        """Remove the file while still holding it (a process that opened it meanwhile sees
        that it is gone, see take), then let go."""
        if self._fd is not None:
            try:
                self.path.unlink()
            except FileNotFoundError:
                pass
            os.close(self._fd)
            self._fd = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()


def _same_file(fd: int, path: Path) -> bool:
    try:
        return os.path.samestat(os.fstat(fd), os.stat(path))
    except FileNotFoundError:
        return False


def _read_holder(fd: int) -> str:
    try:
        holder = json.loads(os.pread(fd, 4096, 0) or b"{}")
        return (f"process {holder['pid']} on {holder['host']} ('{holder['command']}', "
                f"since {holder['since']})")
    except (OSError, ValueError, KeyError, TypeError):
        return "another process"  # (it has not written its name yet)
