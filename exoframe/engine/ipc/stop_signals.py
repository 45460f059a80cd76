"""SIGTERM and SIGHUP stop a command as Ctrl-C does: they raise KeyboardInterrupt, with the
signal's name, wherever the command is (a run's launcher stops its ranks,
engine/ipc/processes.py). Inside signals_held(), the first stop signal waits for its end;
inside signals_held(strict=True) every one does. A run holds them from its start until its
ranks are up (run_starting(), ranks_forked(), ranks_up()): none may raise inside a fork, where
Python's fork handlers (logging's) would swallow it, nor before its folder holds a summary."""
from __future__ import annotations

import contextlib
import signal
import threading

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class _Hold:
    depth = 0  # signals_held() blocks entered and not yet left
    strict = 0  # of them, those inside which every stop signal waits (a second one too)
    pending = None  # the (first) stop signal that came inside them
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
    signals_held() block it came in; a second one inside it acts at once, unless the block
    is strict."""
    if _Hold.depth and (_Hold.pending is None or _Hold.strict):
        if _Hold.pending is None:
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


def _hold(strict: bool):
    _Hold.depth += 1
    _Hold.strict += strict


def _release(strict: bool, act: bool):
    """Leave a hold; at the outermost one, the signal that came inside is acted on (by its
    handler) where `act` (the block ended normally), else dropped."""
    _Hold.depth -= 1
    _Hold.strict -= strict
    pending = _Hold.pending if _Hold.depth == 0 else None
    if _Hold.depth == 0:
        _Hold.pending = None
    if pending is not None and act:
        signal.raise_signal(pending)  # (its handler runs before this returns)


@contextlib.contextmanager
def signals_held(strict: bool = False):
    """The first stop signal that comes inside is acted on at the end, by its handler (a
    handler of this module's or engine/launch/stop_checkpoint.py's), so that a step's row
    reaches every record of it (the sinks, the summary's rows) or none; a second one acts
    at once, unless `strict` (where none may raise: a fork, an import). No handler is
    swapped: they ask held()."""
    _hold(strict)
    try:
        yield
    except BaseException:
        _release(strict, act=False)
        raise
    _release(strict, act=True)


class _StartUp:
    stage = None  # while a run starts: "forking" (every stop signal waits), then "meeting"


@contextlib.contextmanager
def run_starting():
    """A run, from before its folder is made (engine/run.py): stop signals are caught, and
    held until its ranks are up (the launcher calls ranks_forked(), then ranks_up(), where
    the first one is acted on: the run stops as one stopped later does, with its summary).
    Until the ranks are forked every one waits: until then a second one would end the run
    before its folder holds a summary, or raise inside a fork. Nested, or outside the main
    thread (no signal reaches it), it changes nothing."""
    if _StartUp.stage is not None or threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = catch_stop_signals()
    _hold(strict=True)
    _StartUp.stage = "forking"
    try:
        try:
            yield
        except BaseException:
            _end_start_up(act=False)  # (it stops already: the failure is what it says)
            raise
        _end_start_up(act=True)
    finally:
        restore_signals(previous)


def ranks_forked():
    """The run's children are forked: from now on a second stop signal acts at once (a
    start that hangs, waiting for remote ranks, can still be stopped)."""
    if _StartUp.stage == "forking":
        _StartUp.stage = "meeting"
        _Hold.strict -= 1


def ranks_up():
    """The run's ranks are up: the stop signal held since the run started is acted on."""
    _end_start_up(act=True)


def _end_start_up(act: bool):
    if _StartUp.stage is None:
        return
    strict = _StartUp.stage == "forking"
    _StartUp.stage = None
    _release(strict, act)
