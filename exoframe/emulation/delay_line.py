"""The delay line (delayline.c): built once per source version with the machine's C
compiler, started in a network namespace between pairs of interfaces, asked for its counts.
One process serves every pair of an emulation; each direction has its own one-way delay,
jitter (uniform, never reordering) and seeded random loss."""
from __future__ import annotations

import hashlib
import json
import os
import select
import shutil
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

SOURCE = Path(__file__).with_name("delayline.c")


class EmulationError(Exception):
    """What went wrong with an emulated network, in one line."""


class DelayLineError(EmulationError):
    """What went wrong with the delay line, in one line."""


@dataclass(frozen=True)
class Direction:
    """What one direction of a delayed pair does to each frame: seconds and a fraction."""
    delay: float = 0.0
    jitter: float = 0.0
    loss: float = 0.0

    @property
    def idle(self) -> bool:
        return self.delay == 0 and self.loss == 0


@dataclass(frozen=True)
class Pair:
    """Frames from interface a go out of b after a_to_b, and the other way after b_to_a."""
    a: str
    b: str
    a_to_b: Direction
    b_to_a: Direction

    def argument(self) -> str:
        there, back = self.a_to_b, self.b_to_a
        return ",".join(str(x) for x in (self.a, self.b, there.delay, back.delay, there.jitter,
                                         back.jitter, there.loss, back.loss))


def binary() -> Path:
    """The compiled delay line, built on first use into the user's cache (keyed by the
    source's hash, so an edited source is rebuilt)."""
    source = SOURCE.read_bytes()
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "exoframe"
    path = cache / f"delayline-{hashlib.sha256(source).hexdigest()[:16]}"
    if path.exists():
        return path
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise DelayLineError("the delay line is C and needs a C compiler: install gcc "
                             "(apt-get install gcc), or set CC.")
    cache.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(f".{os.getpid()}.tmp")
    built = subprocess.run([compiler, "-O2", "-o", str(partial), str(SOURCE)],
                           capture_output=True, text=True)
    if built.returncode:
        said = [line for line in built.stderr.splitlines() if "error" in line] or \
            built.stderr.strip().splitlines() or ["no output"]
        raise DelayLineError(f"compiling {SOURCE} with {compiler} failed: {said[0].strip()}")
    partial.replace(path)
    return path


class DelayLine:
    """The delay line process inside namespace `ns`, serving `pairs`; stop() ends it and
    returns its last counts."""

    def __init__(self, ns: str, pairs: list[Pair], seed: int = 0):
        command = ["ip", "netns", "exec", ns, str(binary()), "--seed", str(seed),
                   *(pair.argument() for pair in pairs)]
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, text=True)
        said = self.process.stdout.readline().strip()
        if said != "ready":
            self.process.wait()
            raise DelayLineError(f"the delay line did not start: "
                                 f"{self.process.stderr.read().strip() or said}")

    def counts(self) -> dict:
        """Per direction ('a>b'): frames and bytes seen, frames lost on purpose, sends the
        outgoing queue refused, the most frames held at once."""
        self.process.send_signal(signal.SIGUSR1)
        ready, _, _ = select.select([self.process.stdout], [], [], 10)
        line = self.process.stdout.readline() if ready else ""
        if not line:
            raise DelayLineError(f"the delay line did not answer for its counts: "
                                 f"{self.process.stderr.read().strip() or 'it stopped'}")
        return json.loads(line)

    def stop(self) -> dict:
        if self.process.poll() is not None:
            return {}
        self.process.send_signal(signal.SIGTERM)
        try:
            out, _ = self.process.communicate(timeout=5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            return {}
        lines = out.strip().splitlines()
        try:
            return json.loads(lines[-1]) if lines else {}
        except ValueError:  # (its last words cut short: nothing to count)
            return {}
