"""The launcher's loop while a run goes: read every child's messages, run the network
simulator for the ranks, emit rows in step order, send stop verdicts, and raise on the first
failure or a stall (see watchdog.py).

A stop signal (Ctrl-C, SIGTERM, SIGHUP) in a run that checkpoints asks every rank to save at
the step after the furthest one any rank has reported (CheckpointNow); a rank that has
already ended a later one says so (CheckpointLate) and the launcher asks again for a later
step, so that all save at the same one. The run stops once that checkpoint is committed;
a second signal stops it at once."""
from __future__ import annotations

import multiprocessing as mp
import multiprocessing.connection
import signal
import threading
import time
from dataclasses import dataclass, replace

from ..errors import ExoframeError
from ..sim import SimulationError, Simulator
from ..sim.feed import Feed
from ..sim.protocol import Mail
from .checkpoint import CheckpointFolder, Commits
from .job import Job
from .messages import (AskStop, Bundle, CheckpointLate, CheckpointNow, Checkpointed,
                       ChildFailed, Evaluate, RankDone, SimRequest, StepDone, StepState,
                       StopAnswer, Validated)
from .processes import STOP_SIGNALS, RunInterrupted, child_name, interrupted, stack_file
from .replicas import ReplicaCheck
from .step_rows import StepRows
from .target import StopVerdicts, check_within_a_year
from .watchdog import describe_stall, dump_stacks

EVALUATOR = "evaluator"


@dataclass(frozen=True)
class Channel:
    """A pipe the monitor reads: a child's, whose members (indices in Monitor.who) speak
    through it; outbox: the packed nodes' outgoing bundle (engine/packing.py), else None."""
    conn: object
    members: tuple
    outbox: object = None


class RankFailed(ExoframeError):
    """A child process failed; `who` is its rank, or "evaluator", or "simulator"."""

    def __init__(self, who, message: str, details: str, user_error: bool, host: str = ""):
        """host: the machine of a rank on another one (torchrun)."""
        super().__init__(f"{child_name(who)}{f' on {host}' if host else ''}: {message}")
        self.who, self.details, self.user_error = who, details, user_error


class Monitor:
    """Reads every child's messages, runs the simulator for the ranks, emits rows in step
    order, and raises on the first failure."""

    def __init__(self, job: Job, conns, processes, on_row, watchdog: float, folder: str,
                 hosts: dict | None = None, channels: list | None = None,
                 config: dict | None = None):
        """conns: each rank's connection, then the evaluator's; processes: the same children's
        processes, None for a rank on another machine (torchrun: engine/cluster.py), whose
        host `hosts` names (rank -> host, for those ranks only). folder: the run's private
        temporary folder, where children write their stacks. channels: where packed nodes
        (engine/packing.py) share a process, its pipe and its members (Channel each):
        conns[rank] is then a NodeLink into the pipe's outbox, flushed once per pass.
        config: the run's config as logged, which its checkpoints record."""
        self.job, self.conns, self.processes, self.on_row = job, conns, processes, on_row
        self.channels = channels or [Channel(conn, (i,)) for i, conn in enumerate(conns)]
        self.watchdog, self.folder, self.hosts = watchdog, folder, hosts or {}
        self.who = [*range(job.nodes), EVALUATOR]
        self.sim = Simulator(job.sim.topology, job.sim.algorithms, seed=job.seed)
        self.rows = StepRows(job.nodes, job.strategy_cls.held_model_from)
        self.replicas = ReplicaCheck(job.nodes, job.strategy_name)
        resumed = job.resume_from  # a Checkpoint: its simulator inputs first, its rows kept
        self.feed = Feed(self.sim, resumed.sim_inputs if resumed else None,
                         record=job.checkpoint_every is not None)
        self.emitted = list(resumed.rows) if resumed else []  # every row, in step order
        self.rows.next_step = len(self.emitted) + 1
        self.commits = Commits(CheckpointFolder(job.run_dir), job, config) \
            if job.checkpoint_every else None
        early = job.target_loss is not None or job.time_budget is not None
        self.verdicts = StopVerdicts(job.target_loss, job.time_budget) if early else None
        self.results = [None] * job.nodes
        self.final_state = None  # the latest step's held model: the last step's at the end
        self.errors = []
        self.first_step_at = None
        self.reported = [0] * job.nodes  # each rank's latest step end
        self.stop_signal = None  # the KeyboardInterrupt of a stop signal, while it checkpoints
        self.checkpoint_wanted = None  # the step every rank is asked to save at
        self.payloads = {}  # (rank, msg_id) -> the content of a Post not yet delivered

    def handle(self, message):
        if isinstance(message, SimRequest):
            if message.payload is not None:  # a Post: its content waits for its delivery
                self.payloads[(message.rank, message.message.msg_id)] = message.payload
            self.feed.message(message.rank, message.message)
        elif isinstance(message, StepDone):
            rank, step = message.rank, message.step
            self.reported[rank] = max(self.reported[rank], step)
            if self.first_step_at is None:
                self.first_step_at = time.perf_counter()
            self.feed.step_end(rank, message.record["sim_time"])
            try:
                self.replicas.add(rank, step, message.checksum)
            except ExoframeError as e:
                raise RankFailed("divergence check", str(e), "", True) from None
            averaged = self.rows.add(rank, step, message.record, message.state)
            row = self.rows.rows.get(step)
            if row is not None:  # every rank finished `step`
                check_within_a_year(self.job.steps, self.job.time_budget, step, row["sim_time"])
            if row is not None and self.verdicts is not None:
                self.send_verdicts(self.verdicts.add_finished(step, row["sim_time"]))
                if self.verdicts.stop_step == step and averaged is None:
                    self.rows.hold(step)  # the ranks send its states with the stop (rank.py)
            self.validate(step, averaged)
        elif isinstance(message, StepState):
            self.validate(message.step,
                          self.rows.add_state(message.rank, message.step, message.state))
        elif isinstance(message, Validated):
            self.rows.add_val(message.step, message.loss, message.metrics,
                              message.replicas_loss)
            if self.verdicts is not None:
                self.send_verdicts(self.verdicts.add_val(message.step, message.loss))
        elif isinstance(message, AskStop):
            self.send_verdicts(self.verdicts.ask(message.rank, message.step))
        elif isinstance(message, Checkpointed):
            self.commits.rank_saved(message.rank, message.step, len(self.feed.log[message.rank]))
        elif isinstance(message, CheckpointLate):
            self.ask_checkpoint(message.step + 1)
        elif isinstance(message, RankDone):
            self.results[message.rank] = message.result
            self.feed.rank_done(message.rank)
        elif isinstance(message, ChildFailed):
            self.errors.append(message)

    def validate(self, step: int, averaged):
        if averaged is not None:
            try:
                self.conns[-1].send(Evaluate(step, averaged))
            except OSError:
                pass  # the evaluator died; its sentinel says so
            self.final_state = averaged  # steps complete in order

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

    def simulate(self):
        try:
            replies = self.feed.advance()
            stuck = self.sim.stuck()
        except SimulationError as e:
            raise RankFailed("simulator", str(e), "", True) from None
        for rank, reply in replies:
            if isinstance(reply, Mail):
                reply = replace(reply, payloads=tuple(self.payloads.pop((src, msg_id))
                                                      for src, msg_id, _ in reply.messages))
            try:
                self.conns[rank].send(reply)
            except OSError:
                pass  # the rank died; its sentinel says so
        if stuck:
            raise RankFailed("simulator", stuck, "", True)

    def emit(self, unvalidated=False):
        for row in self.rows.ready(unvalidated):
            self.emitted.append(row)
            if self.on_row is not None:
                self.on_row(row)
        if self.commits is not None and not unvalidated:
            self.commits.commit_ready(len(self.emitted), self.emitted, self.feed.log)

    def flush(self) -> list:
        """The run stops: emit the rows every rank finished, validated or not; return every
        row emitted."""
        try:
            self.emit(unvalidated=True)
        except Exception:
            pass  # a failing sink must not hide the failure that stopped the run
        return self.emitted

    def send_verdicts(self, answers):
        for rank, stop in answers:
            try:
                self.conns[rank].send(StopAnswer(stop))
            except OSError:
                pass  # the rank died; its sentinel says so

    def release_stalled_verdicts(self):
        """Let the ranks waiting for a verdict go on when nothing else can move: every rank
        is done or waits for the simulator or a verdict, and no validation runs (see
        exoframe.engine.target)."""
        if self.verdicts is None or not self.verdicts.waiting or self.rows.awaiting_val:
            return
        if all(self.results[r] is not None or self.sim.blocked[r] or r in self.verdicts.waiting
               for r in range(self.job.nodes)):
            self.send_verdicts(self.verdicts.release())

    def stopped_by(self) -> str:
        if self.verdicts is None or self.verdicts.stop_step is None \
                or self.verdicts.stop_step >= self.job.steps:
            return "steps"
        return self.verdicts.stopped_by

    def last_step(self) -> int:
        stop = self.verdicts.stop_step if self.verdicts is not None else None
        return self.job.steps if stop is None else min(stop, self.job.steps)

    def _on_stop_signal(self, signum, frame):
        """In a run that checkpoints: the first stop signal asks for a checkpoint (acted on
        in the loop, between messages); a second one stops at once."""
        name = signal.Signals(signum).name
        stop = KeyboardInterrupt() if signum == signal.SIGINT else KeyboardInterrupt(name)
        if self.stop_signal is not None:
            raise stop
        self.stop_signal = stop

    def ask_checkpoint(self, step: int):
        if self.checkpoint_wanted is not None and step <= self.checkpoint_wanted:
            return
        if step > self.last_step():
            raise self.stop_signal
        self.checkpoint_wanted = step
        for conn in self.conns[:self.job.nodes]:
            try:
                conn.send(CheckpointNow(step))
            except OSError:
                pass  # the rank died; its sentinel says so

    def checkpointed_stop(self):
        """Once the checkpoint asked for at a stop signal is committed, stop."""
        if self.checkpoint_wanted is not None and self.commits.committed >= self.checkpoint_wanted:
            error = interrupted(self.stop_signal)
            stop = RunInterrupted(f"{error} The run saved a checkpoint at step "
                                  f"{self.commits.committed}: `exoframe resume` goes on from it.")
            stop.names_checkpoint = True
            raise stop

    def raise_first_error(self):
        if self.errors:  # the earliest failure is the cause; later ones are its echoes
            first = min(self.errors, key=lambda m: m.at)
            raise RankFailed(first.who, first.message, first.details, first.user_error,
                             self.hosts.get(first.who, ""))

    def finished(self) -> bool:
        return all(r is not None for r in self.results) and self.rows.next_step > self.last_step()

    def run(self):
        open_conns = {channel.conn: channel for channel in self.channels}
        sentinels = {self.processes[channel.members[0]].sentinel: channel
                     for channel in self.channels
                     if self.processes[channel.members[0]] is not None}
        self.last_progress = time.monotonic()
        checkpoints = self.commits is not None and \
            threading.current_thread() is threading.main_thread()
        previous = {signum: signal.signal(signum, self._on_stop_signal)
                    for signum in STOP_SIGNALS} if checkpoints else {}
        try:
            while not self.finished():
                self._pass(open_conns, sentinels)
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)

    def _pass(self, open_conns, sentinels):
        """Wait for messages or exits, handle them, run the simulator."""
        if self.stop_signal is not None and self.checkpoint_wanted is None:
            self.ask_checkpoint(max(self.reported) + 1)
            self.flush_outboxes()
        self.checkpointed_stop()
        ready = mp.connection.wait([*open_conns, *sentinels],
                                   timeout=min(5.0, self.watchdog / 2))
        if not ready and time.monotonic() - self.last_progress > self.watchdog:
            line, stuck = describe_stall(self, self.watchdog)
            stuck = [channel for channel in self.channels if set(channel.members) & set(stuck)]
            stacks = dump_stacks([(self.process_name(channel),
                                   self.processes[channel.members[0]].pid,
                                   stack_file(self.folder, self.who[channel.members[0]]))
                                  for channel in stuck])
            raise RankFailed("watchdog", line, stacks, False)
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
        self.simulate()
        self.emit()
        self.release_stalled_verdicts()
        self.flush_outboxes()
        for obj in ready:
            if obj in sentinels:
                self._check_exit(sentinels.pop(obj), open_conns)
        self.flush_outboxes()  # (what the exits' last messages made the monitor say)

    def process_name(self, channel: Channel) -> str:
        """"rank 3", "evaluator", or the worker of packed nodes (engine/packing.py)."""
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
            raise RankFailed(self.who[i], "lost the connection to it: its process died or "
                             "its machine stopped", "", False, self.hosts[i])
        if not finished:
            self.processes[i].join()
            raise RankFailed(self.process_name(channel), "process died with exit code "
                             f"{self.processes[i].exitcode}", "", False)
