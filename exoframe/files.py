"""Files written so that a crash or a kill never leaves a truncated one: a temporary file in
the same folder, flushed to disk, then renamed over the target."""
from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path


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
def replacing(path: Path, mode: str = "w"):
    """A new file to write (mode "w" or "wb") that replaces `path` once the block ends
    without error, flushed to disk; on an error `path` is left as it was."""
    path = Path(path)
    fd, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, mode) as f:
            os.fchmod(f.fileno(), 0o666 & ~UMASK)  # as open() would make it, not mkstemp's 0600
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(temp, path)
    except BaseException:
        os.unlink(temp)
        raise
