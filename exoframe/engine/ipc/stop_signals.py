"""SIGTERM and SIGHUP stop a command as Ctrl-C does: they raise KeyboardInterrupt, with the
signal's name, wherever the command is (a run's launcher stops its ranks,
engine/ipc/processes.py). Inside signals_held(), the first stop signal waits for its end."""
from __future__ import annotations

import contextlib
import signal
import threading

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class _Hold:
    depth = 0  # signals_held() blocks entered and not yet left
    pending = None  # the stop signal that came inside them
    # The run failed and is stopping: the next stop signal is that failure's echo (torchrun's
    # agent stops rank 0 once a rank beside it has lost the launcher) and is let pass.
    failing = False


def stopping_for_a_failure():
    """The command stops for a failure, which it reports: the first stop signal from now until
    the next catch_stop_signals() is ignored, so that it cannot put "interrupted" in the
    failure's place; a second one acts (a stop that hangs can still be stopped)."""
    _Hold.failing = True


def interrupt_for(signum: int) -> KeyboardInterrupt:
    """The KeyboardInterrupt a stop signal raises: Ctrl-C's bare, the others named."""
    return KeyboardInterrupt() if signum == signal.SIGINT else \
        KeyboardInterrupt(signal.Signals(signum).name)


def held(signum: int) -> bool:
    """For a stop signal's handler: True when the signal is to wait for the end of the
    signals_held() block it came in; a second one inside it acts at once."""
    if _Hold.depth and _Hold.pending is None:
        _Hold.pending = signum
        return True
    return False


def _raise_interrupt(signum, frame):
    if _Hold.failing:
        _Hold.failing = False
        return
    if not held(signum):
        raise interrupt_for(signum)


def catch_stop_signals():
    """SIGINT, SIGTERM and SIGHUP stop the run as Ctrl-C does. Returns the previous
    handlers."""
    _Hold.failing = False
    if threading.current_thread() is not threading.main_thread():
        return {}
    previous = {}
    for signum in STOP_SIGNALS:
        if signum == signal.SIGINT and signal.getsignal(signum) is not signal.default_int_handler:
            continue  # (Ctrl-C ignored, as in a background job: it stays so)
        previous[signum] = signal.signal(signum, _raise_interrupt)
    return previous


def restore_signals(previous):
    for signum, handler in previous.items():
        signal.signal(signum, handler)


def stopped_by(e: KeyboardInterrupt) -> str:
    """' by SIGTERM' (the signal's name), or '' for Ctrl-C."""
    return f" by {e.args[0]}" if e.args else ""


@contextlib.contextmanager
def signals_held():
    """The first stop signal that comes inside is acted on at the end, by its handler (a
    handler of this module's or engine/launch/stop_checkpoint.py's), so that a step's row
    reaches every record of it (the sinks, the summary's rows) or none; a second one acts
    at once. No handler is swapped: they ask held()."""
    _Hold.depth += 1
    try:
        yield
    finally:
        _Hold.depth -= 1
        pending = _Hold.pending if _Hold.depth == 0 else None
        if _Hold.depth == 0:
            _Hold.pending = None
    if pending is not None:  # (only when the block ended normally)
        signal.raise_signal(pending)
