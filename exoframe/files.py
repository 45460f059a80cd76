"""Files written so that a crash or a kill never leaves a truncated one: a temporary file in
the same folder, flushed to disk, then renamed over the target."""
from __future__ import annotations

import contextlib
import errno
import os
import tempfile
from pathlib import Path

from .errors import shorten

# What a write fails with when the disk (or the user's quota, or a file-size limit) is full.
FULL_DISK = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


UMASK = _umask()


def sync_folder(path: Path):
    """Flush a folder's entries (files renamed into it, or it renamed) to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, text: str):
    with replacing(path, "w") as f:
        f.write(text)


@contextlib.contextmanager
def replacing(path: Path, mode: str = "w", newline: str | None = None):
    """A new file to write (mode "w" or "wb") that replaces `path` once the block ends
    without error, flushed to disk; on an error `path` is left as it was. A write that
    fails names `path` (the OSError of a write names no file)."""
    path = Path(path)
    fd, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, mode, newline=newline) as f:
            os.fchmod(f.fileno(), 0o666 & ~UMASK)  # as open() would make it, not mkstemp's 0600
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(temp, path)
    except OSError as e:
        os.unlink(temp)
        if e.filename is not None:
            raise
        raise OSError(e.errno, e.strerror, str(path)) from e
    except BaseException:
        os.unlink(temp)
        raise


def disk_full(error: BaseException | None) -> OSError | None:
    """The full-disk OSError behind `error`: itself, or what it was raised from or while
    handling (torch.save turns a failed write into a RuntimeError)."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, OSError) and error.errno in FULL_DISK:
            return error
        error = error.__cause__ or error.__context__
    return None


def describe_os_error(e: OSError) -> str:
    """One line: the file, what went wrong and what to do."""
    name = e.filename if e.filename is not None else "a file"
    fix = ("free some space, or give --out on another disk" if e.errno in FULL_DISK
           else "check that the path exists and can be read and written")
    return f"{shorten(str(name))}: {e.strerror or e}; {fix}."


class AppendOnly:
    """A file that grows by whole records: a write that fails part-way (a full disk) is
    cut back off, so the file never ends in half a record."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o666)
        self._size = os.fstat(self._fd).st_size

    def append(self, data: bytes):
        try:
            written = 0
            while written < len(data):
                written += os.write(self._fd, data[written:])
        except OSError as e:
            os.ftruncate(self._fd, self._size)
            raise OSError(e.errno, e.strerror, str(self.path)) from None
        self._size += len(data)

    def close(self):
        os.close(self._fd)
