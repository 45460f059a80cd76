"""Files written so that a crash or a kill never leaves a truncated one: a temporary file in
the same folder, flushed to disk, then renamed over the target."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


UMASK = _umask()


def write_atomic(path: Path, text: str):
    fd, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            os.fchmod(f.fileno(), 0o666 & ~UMASK)  # as open() would make it, not mkstemp's 0600
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temp, path)
    except BaseException:
        os.unlink(temp)
        raise
