"""A stop signal (Ctrl-C, SIGTERM, SIGHUP) in a run that checkpoints: every rank is asked to
save at the step after the furthest one any rank has reported (CheckpointNow). A rank that
has already ended a later one says so (CheckpointLate) and waits to be asked again, for a
later step, so that all save at the same one; the ranks that were not late go on meanwhile,
so each new ask leaves twice the margin of the last (a run of fast steps is not chased to
its end). The run stops once that checkpoint is committed; a second signal stops it at
once."""
from __future__ import annotations

import contextlib
import signal
import sys
import threading

from ...errors import RunInterrupted
from ..ipc.messages import CheckpointNow
from ..ipc.processes import interrupted
from ..ipc.stop_signals import STOP_SIGNALS, held, interrupt_for, stopped_by


class StopCheckpoint:
    def __init__(self, commits, nodes: int, last_step, send):
        """commits: the run's checkpoint commits (engine/records/checkpoint.py), None when it does
        not checkpoint; last_step(): the run's last step; send(rank, message)."""
        self.commits, self.nodes, self.last_step, self.send = commits, nodes, last_step, send
        self.signal = None  # the KeyboardInterrupt of a stop signal, while it checkpoints
        self.wanted = None  # the step every rank is asked to save at
        self.margin = 1  # steps past a late rank's the next ask leaves

    @contextlib.contextmanager
    def catching_signals(self):
        """While the run goes: a stop signal asks for a checkpoint (in a run that checkpoints,
        on the main thread)."""
        catch = self.commits is not None and \
            threading.current_thread() is threading.main_thread()
        previous = {signum: signal.signal(signum, self._on_stop_signal)
                    for signum in STOP_SIGNALS} if catch else {}
        try:
            yield
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)

    def _on_stop_signal(self, signum, frame):
        """The first stop signal asks for a checkpoint (acted on in the loop, between
        messages); a second one stops at once."""
        if held(signum):
            return
        stop = interrupt_for(signum)
        if self.signal is not None:
            raise stop
        self.signal = stop

    def signalled(self) -> bool:
        """A stop signal came and no checkpoint is asked for yet."""
        return self.signal is not None and self.wanted is None

    def late(self, step: int):
        """A rank had ended `step` when asked for an earlier one."""
        if step + self.margin > self.wanted:
            self.ask(min(step + self.margin, max(step + 1, self.last_step())))
            self.margin *= 2

    def ask(self, step: int):
        if self.wanted is not None and step <= self.wanted:
            return
        if step > self.last_step():
            raise self.signal
        if self.wanted is None:
            print(f"exoframe: stopping{stopped_by(self.signal)}: every rank saves a checkpoint "
                  f"at step {step} first; signal again to stop at once.", file=sys.stderr,
                  flush=True)
        self.wanted = step
        for rank in range(self.nodes):
            self.send(rank, CheckpointNow(step))

    def stop_once_committed(self):
        """Once the checkpoint asked for at a stop signal is committed, stop."""
        if self.wanted is not None and self.commits.committed >= self.wanted:
            error = interrupted(self.signal)
            raise RunInterrupted(f"{error} The run saved a checkpoint at step "
                                 f"{self.commits.committed}: `exoframe resume` goes on from it.",
                                 names_checkpoint=True)
