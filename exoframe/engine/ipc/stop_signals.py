"""SIGTERM and SIGHUP stop a command as Ctrl-C does: they raise KeyboardInterrupt, with the
signal's name, wherever the command is (a run's launcher stops its ranks,
engine/ipc/processes.py)."""
from __future__ import annotations

import contextlib
import signal
import threading

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt(signal.Signals(signum).name)


def catch_stop_signals():
    """SIGTERM and SIGHUP stop the run as Ctrl-C does. Returns the previous handlers."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    previous = {}
    for signum in (signal.SIGTERM, signal.SIGHUP):
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
    """A stop signal that comes inside is acted on at the end, by the handler it would have
    met: a step's row reaches every record of it (the sinks, the summary's rows) or none."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending = []
    previous = {signum: signal.signal(signum, lambda signum, frame: pending.append(signum))
                for signum in STOP_SIGNALS}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        for signum in pending:
            signal.raise_signal(signum)
