"""The launcher's loop while a run goes: read every child's messages and hand each to the part
whose job it is, run the network simulator for the ranks, and raise on the first failure or
a stall (see watchdog.py).

The parts: sim_service.py (the simulator for the ranks), row_output.py (rows in step order,
validation), verdicts.py (stopping rules), stop_checkpoint.py (a checkpoint at a stop
signal)."""
from __future__ import annotations

import multiprocessing as mp
import multiprocessing.connection
import time
from dataclasses import dataclass

from ..ipc.messages import (AskStop, Bundle, CheckpointLate, Checkpointed, ChildFailed, RankDone,
                            SimRequest, StepDone, Validated)
from ..ipc.processes import RankFailed, child_name, stack_file
from ..ipc.sender import Sender
from ..node.model_state import FoldedModels
from ..plan.job import Job
from ..records.checkpoint import CheckpointFolder, Commits
from .row_output import RowOutput
from .sim_service import SimService
from .stop_checkpoint import StopCheckpoint
from .verdicts import Verdicts
from .watchdog import describe_stall, dump_stacks, thread_stacks

EVALUATOR = "evaluator"


@dataclass(frozen=True)
class Channel:
    """A pipe the monitor reads: a child's, whose members (indices in Monitor.who) speak
    through it; outbox: the packed nodes' outgoing bundle (engine/node/packing.py), else None."""
    conn: object
    members: tuple
    outbox: object = None


class Monitor:
    """Reads every child's messages and dispatches them, runs the simulator for the ranks,
    and raises on the first failure."""

    def __init__(self, job: Job, conns, processes, on_row, watchdog: float, folder: str,
                 hosts: dict | None = None, channels: list | None = None,
                 config: dict | None = None):
        """conns: each rank's connection, then the evaluator's; processes: the same children's
        processes, None for a rank on another machine (torchrun: engine/launch/cluster.py), whose
        host `hosts` names (rank -> host, for those ranks only). folder: the run's private
        temporary folder, where children write their stacks. channels: where packed nodes
        (engine/node/packing.py) share a process, its pipe and its members (Channel each):
        conns[rank] is then a NodeLink (hosting.py) into the pipe's outbox, flushed once per
        pass.
        config: the run's config as logged, which its checkpoints record."""
        self.job, self.conns, self.processes = job, conns, processes
        self.channels = channels or [Channel(conn, (i,)) for i, conn in enumerate(conns)]
        self.watchdog, self.folder, self.hosts = watchdog, folder, hosts or {}
        self.who = [*range(job.nodes), EVALUATOR]
        self.service = SimService(job, self.send)
        commits = Commits(CheckpointFolder(job.run_dir), job, config) \
            if job.checkpoint_every else None
        self.output = RowOutput(job, on_row, commits, self.service.feed.log,
                                lambda: self.verdicts.stop_step)
        self.verdicts = Verdicts(job, self.send)
        self.stop_checkpoint = StopCheckpoint(commits, job.nodes, self.last_step, self.send)
        self.commits = commits
        self.results = [None] * job.nodes
        self.errors = []
        self.first_step_at = None
        self.reported = [0] * job.nodes  # each rank's latest step end
        self.relay = None  # the thread relaying remote ranks' models to the evaluator
        self.handlers = {
            SimRequest: self.service.request,
            StepDone: self.step_done,
            FoldedModels: self.relay_to_evaluator,  # a remote rank's (torchrun)
            Validated: self.validated,
            AskStop: lambda m: self.verdicts.ask(m.rank, m.step),
            Checkpointed: lambda m: commits.rank_saved(
                m.rank, m.step, len(self.service.feed.log[m.rank])),
            CheckpointLate: lambda m: self.stop_checkpoint.late(m.step),
            RankDone: self.rank_done,
            ChildFailed: self.errors.append,
        }

    # What the launcher and the watchdog read of the run.
    @property
    def sim(self):
        return self.service.sim

    @property
    def rows(self):
        return self.output.rows

    @property
    def emitted(self) -> list:
        return self.output.emitted

    def flush(self) -> list:
        return self.output.flush()

    def stopped_by(self) -> str:
        return self.verdicts.stopped_by()

    def last_step(self) -> int:
        return self.verdicts.last_step()

    def send(self, who: int, message):
        """To child `who` (an index in self.who): one that died is left to its sentinel."""
        try:
            self.conns[who].send(message)
        except OSError:
            pass

    def relay_to_evaluator(self, models: FoldedModels):
        """A remote rank's models (torchrun) on to the evaluator, written by a thread: the
        monitor does not wait while the evaluator validates."""
        if self.relay is None:
            self.relay = Sender()
            self.relay.start()
            self._relay = self.relay.sender_for(self.conns[self.job.nodes])
        self._relay(models)

    # -- the messages ------------------------------------------------------------------------
    def handle(self, message):
        handler = self.handlers.get(type(message))
        if handler is not None:
            handler(message)

    def step_done(self, message: StepDone):
        rank, step = message.rank, message.step
        self.reported[rank] = max(self.reported[rank], step)
        if self.first_step_at is None:
            self.first_step_at = time.perf_counter()
        self.service.step_end(rank, message.end)
        row = self.output.add(message)
        if row is not None:
            self.verdicts.step_finished(step, row["sim_time"])

    def validated(self, message: Validated):
        self.output.add_val(message)
        if message.held:
            self.verdicts.validated(message.step, message.loss)

    def rank_done(self, message: RankDone):
        self.results[message.rank] = message.result
        self.service.rank_done(message.rank)

    def read(self, conn) -> bool:
        """Handle one message (or Bundle of them); False when the pipe is closed."""
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return False
        self.last_progress = time.monotonic()
        for one in message.messages if isinstance(message, Bundle) else (message,):
            self.handle(one)
        return True

    def break_stall(self):
        """Where nothing can move but by the launcher (every rank is done or waits for the
        simulator, a verdict, or its worker's other nodes with its clock paused; and no
        validation runs): resume a paused rank first, which an unstacked run would not have
        held there; else let the ranks waiting for a verdict go on (see
        exoframe.engine.plan.target)."""
        if not self.verdicts.asked() or self.rows.awaiting_steps():
            return
        waiting = self.verdicts.waiting
        if self.service.resume_if_held(waiting):
            return
        if all(self.results[r] is not None or self.sim.blocked[r] or r in waiting
               for r in range(self.job.nodes)):
            self.verdicts.release()

    def raise_first_error(self):
        if self.errors:  # the earliest failure is the cause; later ones are its echoes
            first = min(self.errors, key=lambda m: m.at)
            raise RankFailed(first.who, first.message, details=first.details,
                             user_error=first.user_error, host=self.hosts.get(first.who, ""))

    def finished(self) -> bool:
        return all(r is not None for r in self.results) and self.rows.next_step > self.last_step()

    # -- the loop ----------------------------------------------------------------------------
    def run(self):
        open_conns = {channel.conn: channel for channel in self.channels}
        sentinels = {self.processes[channel.members[0]].sentinel: channel
                     for channel in self.channels
                     if self.processes[channel.members[0]] is not None}
        self.last_progress = time.monotonic()
        with self.stop_checkpoint.catching_signals():
            while not self.finished():
                self._pass(open_conns, sentinels)

    def _pass(self, open_conns, sentinels):
        """Wait for messages or exits, handle them, run the simulator."""
        if self.stop_checkpoint.signalled():
            self.stop_checkpoint.ask(max(self.reported) + 1)
            self.flush_outboxes()
        self.stop_checkpoint.stop_once_committed()
        ready = mp.connection.wait([*open_conns, *sentinels],
                                   timeout=min(5.0, self.watchdog / 2))
        if not ready and time.monotonic() - self.last_progress > self.watchdog:
            line, stuck = describe_stall(self, self.watchdog)
            stuck = [channel for channel in self.channels if set(channel.members) & set(stuck)]
            forked = [c for c in stuck if self.processes[c.members[0]] is not None]
            stacks = [dump_stacks([(self.process_name(channel),
                                    self.processes[channel.members[0]].pid,
                                    stack_file(self.folder, self.who[channel.members[0]]))
                                   for channel in forked]),
                      thread_stacks([(self.process_name(channel),
                                      f"exoframe-{self.who[channel.members[0]]}")
                                     for channel in stuck if channel not in forked])]
            raise RankFailed("watchdog", line, details="\n\n".join(filter(None, stacks)),
                             user_error=False)
        for obj in ready:
            if obj in open_conns:
                alive = self.read(obj)
                while alive and obj.poll():  # drain: one simulator pass per batch
                    alive = self.read(obj)
                if not alive:
                    channel = open_conns.pop(obj)
                    if self.processes[channel.members[0]] is None:  # a remote rank: its
                        self._check_exit(channel, open_conns)  # connection is its life
        self.raise_first_error()
        self.service.advance()
        self.output.emit()
        self.break_stall()
        self.flush_outboxes()
        for obj in ready:
            if obj in sentinels:
                self._check_exit(sentinels.pop(obj), open_conns)
        self.flush_outboxes()  # (what the exits' last messages made the monitor say)

    def process_name(self, channel: Channel) -> str:
        """"rank 3", "evaluator", or the worker of packed nodes (engine/node/packing.py)."""
        if len(channel.members) == 1:
            return child_name(self.who[channel.members[0]])
        return f"the worker of ranks {channel.members[0]}-{channel.members[-1]}"

    def flush_outboxes(self):
        for channel in self.channels:
            if channel.outbox is not None:
                channel.outbox.flush()  # (through a thread: a dead worker raises nothing)

    def _check_exit(self, channel, open_conns):
        """A child exited: drain what it said, then fail unless it had finished."""
        conn = channel.conn
        while conn in open_conns and conn.poll() and self.read(conn):
            pass
        self.raise_first_error()
        finished = all(self.results[i] is not None if i < self.job.nodes else self.finished()
                       for i in channel.members)
        i = channel.members[0]
        if not finished and self.processes[i] is None:
            raise RankFailed(self.process_name(channel), "lost the connection to it: its "
                             "process died or its machine stopped", user_error=False,
                             host=self.hosts.get(i, ""))
        if not finished:
            self.processes[i].join()
            raise RankFailed(self.process_name(channel), "process died with exit code "
                             f"{self.processes[i].exitcode}", user_error=False)
