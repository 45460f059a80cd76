"""The child processes of a run: how each starts and reports a failure, and how the launcher
stops them all (SIGTERM and SIGHUP become an interruption: exoframe/engine/ipc/stop_signals.py)."""
from __future__ import annotations

import ctypes
import dataclasses
import faulthandler
import os
import signal
import sys
import time
import traceback

from ...errors import ExoframeError, RunInterrupted
from .messages import ChildFailed
from .stop_signals import STOP_SIGNALS, stopped_by


STACK_SIGNAL = signal.SIGUSR1  # the watchdog asks a stuck child for its stack


def die_with_parent(who):
    if sys.platform.startswith("linux"):
        PR_SET_PDEATHSIG, PR_SET_NAME = 1, 15
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        # ps, top and /proc/PID/comm show which rank a process is
        libc.prctl(PR_SET_NAME, f"exo-{'rank-' if isinstance(who, int) else ''}{who}".encode())


def child_name(who) -> str:
    """A child as messages name it: "rank 3", "evaluator", "simulator", "watchdog"."""
    return who if isinstance(who, str) else f"rank {who}"


class RankFailed(ExoframeError):
    """A child process failed; `who` is its rank, or "evaluator", or "simulator"."""

    def __init__(self, who, message: str, *, details: str = "", user_error: bool = True,
                 host: str = ""):
        """details: the child's traceback; user_error: as ExoframeError's; host: the machine
        of a rank on another one (torchrun)."""
        super().__init__(f"{child_name(who)}{f' on {host}' if host else ''}: {message}",
                         details=details, user_error=user_error)
        self.who = who


class NodeFailed(Exception):
    """A node of a process that runs several failed (engine/node/packing.py): raised from
    the node's own exception, naming its rank (failure() reports the cause as that rank's)."""

    def __init__(self, rank: int):
        super().__init__(f"rank {rank} failed")
        self.rank = rank


def stack_file(folder: str, who) -> str:
    """Where child `who` writes its Python stack when the watchdog asks (SIGUSR1)."""
    return os.path.join(folder, f"stack-{who}")


def child_entry(who, target, args, conn, stack_path: str | None, forked: bool = True):
    """Run target(*args, conn) and exit. forked: a child of the launcher, which handles stop
    signals for everyone; else a rank that torchrun started, whose agent stops it and which
    says its own error too (on its host's terminal). stack_path: where to write the stack
    when the watchdog asks (None: a rank on another machine, out of the watchdog's reach)."""
    if forked:
        for signum in STOP_SIGNALS:
            signal.signal(signum, signal.SIG_IGN)
        die_with_parent(who)
    if stack_path is not None:
        # faulthandler writes from its C signal handler: it answers even when Python code
        # is stuck in a sleep or a C call. The file stays open for the process's life.
        faulthandler.register(STACK_SIGNAL, file=open(stack_path, "w"), all_threads=True)
    code = 0
    try:
        target(*args, conn)
    except BaseException as e:  # report, then exit: the launcher stops the other children
        code = 1
        failed = failure(who, e)
        if not forked and _launcher_gone(conn):  # rank 0's launcher stopped the run, says why
            failed = dataclasses.replace(failed, user_error=True, message=(
                "lost the connection to rank 0's launcher: the run stopped there."))
        if not forked:
            print(f"exoframe: {child_name(failed.who)}: {failed.message}"
                  f"{'' if failed.user_error else chr(10) + failed.details}", file=sys.stderr)
        try:
            conn.send(failed)
        except Exception:
            pass
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)  # skip interpreter teardown: a half-open process group can hang in it


def failure(who, e: BaseException) -> ChildFailed:
    """What a child says of the exception that ended it (inside its `except`)."""
    if isinstance(e, NodeFailed):  # a packed node: its rank, and what it raised
        who, e = e.rank, e.__cause__
    user_error = isinstance(e, ExoframeError)
    return ChildFailed(who, time.time(), str(e) if user_error else f"{type(e).__name__}: {e}",
                       "".join(traceback.format_exception(e)), user_error)


def thread_entry(who, target, args, conn):
    """child_entry for a child that is a thread of the launcher's process (engine/launch/
    hosting.py's InProcess): a failure is reported as a process's is, and the end of the
    thread closes its pipe, which the launcher reads as its exit."""
    try:
        target(*args, conn)
    except BaseException as e:
        try:
            conn.send(failure(who, e))
        except Exception:
            pass  # (the launcher stopped the run: it closed the pipe)
    finally:
        conn.close()


def _launcher_gone(conn) -> bool:
    """Whether the launcher closed this rank's connection (the run stopped there: a rank
    then fails in whatever it was doing, a recv or a collective with a stopped peer)."""
    try:
        while conn.poll(0):
            conn.recv()  # what the launcher sent before it closed
        return False
    except (EOFError, OSError):
        return True


def interrupted(e: KeyboardInterrupt) -> RunInterrupted:
    return RunInterrupted(f"interrupted{stopped_by(e)}: every rank was stopped.")


def stop_all(processes):
    """Kill every child process (None: a thread, which its hosting ends)."""
    processes = [p for p in processes if p is not None]
    for p in processes:
        if p.is_alive():
            p.kill()
    for p in processes:
        p.join(timeout=5)


def closing(ends: list, target):
    """target, in a child that first closes the inherited pipe `ends` it has no use for
    (so that a worker gone is seen as gone by its peers)."""
    def run(*args):
        for end in ends:
            end.close()
        return target(*args)
    return run
