"""Start one process per rank and an evaluator, run the network simulator for them, relay
their progress, and stop them all if one fails.

Ranks are forked from this process, which has already imported torch, so start-up does not
pay a fresh interpreter and torch import per rank. The ranks meet through a FileStore in a
private temporary folder (no port: no other process can reach or disturb it), and gloo
binds to loopback. The launcher runs the simulator, which answers the ranks over their
pipes; it watches every pipe and process, and on a failure, a stall (see watchdog.py),
Ctrl-C, SIGTERM or SIGHUP kills every child so that no process is left behind.
"""
from __future__ import annotations

import ctypes
import multiprocessing as mp
import multiprocessing.connection
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass

import torch

from ..errors import ExoframeError
from ..sim import SimulationError, Simulator
from ..sim.compute import device_from_name
from . import devices
from .data import Batches, has_examples
from .evaluator import evaluate
from .flops import count_step_flops
from .job import Job
from .loop import check_loss
from .messages import (AskStop, ChildFailed, Evaluate, EvaluatorStop, RankDone, Rendezvous,
                       SimRequest, StepDone, StepState, StopAnswer, Validated)
from .model_state import ModelState, average
from .rank import train
from .target import StopVerdicts
from .watchdog import describe_stall

EVALUATOR = "evaluator"


class RankFailed(ExoframeError):
    """A child process failed; `who` is its rank, or "evaluator", or "simulator"."""

    def __init__(self, who, message: str, details: str, user_error: bool):
        super().__init__(f"{who if isinstance(who, str) else f'rank {who}'}: {message}")
        self.who, self.details, self.user_error = who, details, user_error


class RunInterrupted(ExoframeError):
    pass


@dataclass
class LaunchResult:
    rank_results: list
    startup_seconds: float
    elapsed_seconds: float
    final_state: ModelState | None = None  # the last step's averaged model
    steps: int = 0  # steps run: fewer than job.steps when a stopping rule stopped the run
    stopped_by: str = "steps"  # "steps", "target_loss" or "time_budget"


STOP_SIGNALS = [signal.SIGINT, signal.SIGTERM, signal.SIGHUP]


def _die_with_parent(who):
    if sys.platform.startswith("linux"):
        PR_SET_PDEATHSIG, PR_SET_NAME = 1, 15
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        # ps, top and /proc/PID/comm show which rank a process is
        libc.prctl(PR_SET_NAME, f"exo-{'rank-' if isinstance(who, int) else ''}{who}".encode())


def _child_entry(who, target, args, conn):
    for signum in STOP_SIGNALS:  # the launcher handles these for everyone
        signal.signal(signum, signal.SIG_IGN)
    _die_with_parent(who)
    code = 0
    try:
        target(*args, conn)
    except BaseException as e:  # report, then exit: the launcher stops the other children
        code = 1
        user_error = isinstance(e, ExoframeError)
        message = str(e) if user_error else f"{type(e).__name__}: {e}"
        try:
            conn.send(ChildFailed(who, time.time(), message, traceback.format_exc(), user_error))
        except Exception:
            pass
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)  # skip interpreter teardown: a half-open process group can hang in it


class StepRows:
    """Turns per-rank step records into one row per step, in step order.

    A row is ready once every rank reported the step and, at evaluation steps, once the
    evaluator validated the ranks' averaged model. Values are averaged over ranks, except
    the simulated time, where a step ends when its last rank ends it.
    """

    def __init__(self, nodes: int):
        self.nodes = nodes
        self.records: dict[int, list] = {}
        self.states: dict[int, list] = {}
        self.rows: dict[int, dict] = {}
        self.awaiting_val: set[int] = set()
        self.next_step = 1

    def add(self, rank: int, step: int, record: dict, state):
        """Returns the averaged model state of `step` when it is complete, else None."""
        records = self.records.setdefault(step, [None] * self.nodes)
        records[rank] = record
        if state is not None:
            self.states.setdefault(step, [None] * self.nodes)[rank] = state
        if any(r is None for r in records):
            return None
        del self.records[step]
        self.rows[step] = self._row(step, records)
        if step not in self.states:
            return None
        self.awaiting_val.add(step)
        return average(self.states.pop(step))

    def hold(self, step: int):
        """Keep `step`'s row until its states (add_state) come and are validated."""
        self.awaiting_val.add(step)

    def add_state(self, rank: int, step: int, state):
        """A state sent apart from its record (a rank told to stop after a step that was
        not an evaluation step). Returns the averaged state once every rank's is in."""
        states = self.states.setdefault(step, [None] * self.nodes)
        states[rank] = state
        if any(s is None for s in states):
            return None
        return average(self.states.pop(step))

    def add_val(self, step: int, val_loss, metrics: dict):
        self.awaiting_val.discard(step)
        if val_loss is not None:  # None: no validation data
            self.rows[step]["val_loss"] = val_loss
            self.rows[step].update((f"val_{name}", value) for name, value in metrics.items())

    def ready(self, unvalidated=False):
        """Rows that can be emitted now, in order; with `unvalidated`, also the rows whose
        validation has not come (when the run stops: they are kept without val_loss)."""
        while self.next_step in self.rows and (unvalidated
                                               or self.next_step not in self.awaiting_val):
            yield self.rows.pop(self.next_step)
            self.next_step += 1

    @staticmethod
    def _row(step: int, records: list) -> dict:
        row = {"step": step}
        for key in dict.fromkeys(k for r in records for k in r):  # every key, in first-seen order
            values = [r[key] for r in records if r.get(key) is not None]
            if values:
                row[key] = max(values) if key == "sim_time" else sum(values) / len(values)
        row["bytes_sent_per_node"] = row.pop("bytes_sent")
        return row


def check_model(job: Job, batches: Batches):
    """Fail fast, before any fork: one forward pass (eval mode, no grad, on the CPU) over
    rank 0's first batch must give a scalar. Returns the batch."""
    was_training = job.model.training
    job.model.eval()
    try:
        with torch.no_grad():
            batch = batches.first()
            check_loss(job.model(batch), step=0)
    finally:
        job.model.train(was_training)
    return batch


def warn_about_measured_compute(job: Job):
    """`measured` times each rank's own work only where nothing else runs on its device."""
    if job.sim.compute.kind != "measured" or job.device == "cpu":
        return
    if job.device == "mps":
        why = "it reads CPU time, which misses the Apple GPU's work"
    elif job.device == "cuda" and devices.gpu_count() >= job.nodes:
        return
    else:
        why = ("ranks share a GPU, and a rank's GPU time then includes the other ranks' "
               "kernels")
    print(f"warning: --compute measured on {job.device}: {why}; --compute flops:auto or "
          "fixed:<time per step> gives compute that does not depend on it.", file=sys.stderr)


def preload():
    """Import once, before forking, what every rank would otherwise import on its own.

    torch's optimizers import torch._dynamo on their first step (about 1.3 s and 800
    modules here); done in each of N ranks on 2 cores it would dominate start-up.
    """
    import torch._dynamo  # noqa: F401


def launch(job: Job, on_row=None) -> LaunchResult:
    """Run `job` on job.nodes forked ranks. `on_row(row)` is called for each finished step."""
    start = time.perf_counter()
    if job.device.startswith("cuda") and torch.cuda.is_initialized():
        raise ExoframeError(
            "device: CUDA is already initialized in this process (a model or tensor was put on "
            "a GPU before the run), and the ranks, forked from it, could not use it. Keep the "
            "model and data on the CPU: exoframe moves them to --device.")
    batches = [Batches(job.dataset(rank, job.nodes, "train"), job.batch_size, job.seed, rank,
                       job.shuffle, job.drop_last) for rank in range(job.nodes)]
    val_shards = [job.dataset(rank, job.nodes, "val") for rank in range(job.nodes)]
    if job.target_loss is not None and not any(map(has_examples, val_shards)):
        raise ExoframeError("target_loss needs validation data: the time to target is read "
                            "from the validation loss. Give validation data or drop target_loss.")
    warn_about_measured_compute(job)
    first_batch = check_model(job, batches[0])
    if job.sim.compute.needs_flops:
        if job.sim.compute.peak is None:  # flops:auto
            gpu = devices.gpu_model() if job.device.startswith("cuda") else None
            job.sim.compute = job.sim.compute.with_device(device_from_name(gpu))
        flops = count_step_flops(job.model, first_batch) * job.accumulate
        job.sim.compute = job.sim.compute.with_flops(flops)
    preload()
    watchdog = job.hang_timeout
    # gloo and NCCL bind their listening sockets to this interface: loopback only.
    # A user who names an interface (these variables) chooses it; else loopback only.
    loopback = "lo0" if sys.platform == "darwin" else "lo"
    os.environ.setdefault("GLOO_SOCKET_IFNAME", loopback)
    os.environ.setdefault("NCCL_SOCKET_IFNAME", loopback)  # NCCL's bootstrap sockets
    rendezvous = tempfile.mkdtemp(prefix="exoframe-rendezvous-")  # mode 0700: ours alone
    try:
        return _launch(job, on_row, start, batches, val_shards, watchdog,
                       os.path.join(rendezvous, "store"))
    finally:
        shutil.rmtree(rendezvous, ignore_errors=True)


def _launch(job, on_row, start, batches, val_shards, watchdog, store_path) -> LaunchResult:
    context = mp.get_context("fork")
    children = [(rank, train, (rank, job, batches[rank])) for rank in range(job.nodes)]
    children.append((EVALUATOR, evaluate, (job, val_shards)))
    pipes = [context.Pipe() for _ in children]
    processes = [context.Process(target=_child_entry, args=(who, target, args, child),
                                 daemon=True, name=f"exoframe-{who}")
                 for (who, target, args), (_, child) in zip(children, pipes)]
    conns = [parent for parent, _ in pipes]
    monitor = _Monitor(job, conns, processes, on_row, watchdog)
    previous = _catch_stop_signals()
    try:
        for p in processes:
            p.start()
        for _, child in pipes:
            child.close()
        # gloo's own timeout outlasts the watchdog, which sees every rank and names the
        # right one; a rank timing out sees only that its peer is late.
        for conn in conns[:job.nodes]:
            conn.send(Rendezvous(store_path, watchdog + 60))
        try:
            monitor.run()
        except (ExoframeError, KeyboardInterrupt) as e:
            # The error carries what the run did, for the summary (see run.py).
            error = e if isinstance(e, ExoframeError) else _interrupted(e)
            error.status = "interrupted" if isinstance(error, RunInterrupted) else "failed"
            error.rows = monitor.flush()
            raise error from None
        conns[-1].send(EvaluatorStop())
        end = time.perf_counter()
        return LaunchResult(rank_results=monitor.results,
                            startup_seconds=(monitor.first_step_at or end) - start,
                            elapsed_seconds=end - start, final_state=monitor.final_state,
                            steps=monitor.last_step(), stopped_by=monitor.stopped_by())
    except KeyboardInterrupt as e:  # while starting or stopping, outside monitor.run()
        error = _interrupted(e)
        error.status, error.rows = "interrupted", monitor.emitted
        raise error from None
    finally:
        _restore_signals(previous)
        _stop(processes)


def _interrupted(e: KeyboardInterrupt) -> RunInterrupted:
    by = f" by {e.args[0]}" if e.args else ""  # the signal's name, but for Ctrl-C
    return RunInterrupted(f"interrupted{by}: every rank was stopped.")


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt(signal.Signals(signum).name)


def _catch_stop_signals():
    """SIGTERM and SIGHUP stop the run as Ctrl-C does. Returns the previous handlers."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    previous = {}
    for signum in (signal.SIGTERM, signal.SIGHUP):
        previous[signum] = signal.signal(signum, _raise_interrupt)
    return previous


def _restore_signals(previous):
    for signum, handler in previous.items():
        signal.signal(signum, handler)


class _Monitor:
    """Reads every child's messages, runs the simulator for the ranks, emits rows in step
    order, and raises on the first failure."""

    def __init__(self, job: Job, conns, processes, on_row, watchdog: float):
        self.job, self.conns, self.processes, self.on_row = job, conns, processes, on_row
        self.watchdog = watchdog
        self.emitted = []  # every row passed to on_row
        self.who = [*range(job.nodes), EVALUATOR]
        self.sim = Simulator(job.sim.topology, job.sim.algorithms, seed=job.seed)
        self.rows = StepRows(job.nodes)
        early = job.target_loss is not None or job.time_budget is not None
        self.verdicts = StopVerdicts(job.target_loss, job.time_budget) if early else None
        self.results = [None] * job.nodes
        self.final_state = None  # the latest step's averaged model: the last step's at the end
        self.errors = []
        self.first_step_at = None

    def handle(self, message):
        if isinstance(message, SimRequest):
            self.sim.receive(message.rank, message.message)
        elif isinstance(message, StepDone):
            rank, step = message.rank, message.step
            if self.first_step_at is None:
                self.first_step_at = time.perf_counter()
            self.sim.note_clock(rank, message.record["sim_time"])
            averaged = self.rows.add(rank, step, message.record, message.state)
            row = self.rows.rows.get(step)
            if row is not None and self.verdicts is not None:  # every rank finished `step`
                self.send_verdicts(self.verdicts.add_finished(step, row["sim_time"]))
                if self.verdicts.stop_step == step and averaged is None:
                    self.rows.hold(step)  # the ranks send its states with the stop (rank.py)
            self.validate(step, averaged)
        elif isinstance(message, StepState):
            self.validate(message.step,
                          self.rows.add_state(message.rank, message.step, message.state))
        elif isinstance(message, Validated):
            self.rows.add_val(message.step, message.loss, message.metrics)
            if self.verdicts is not None:
                self.send_verdicts(self.verdicts.add_val(message.step, message.loss))
        elif isinstance(message, AskStop):
            self.send_verdicts(self.verdicts.ask(message.rank, message.step))
        elif isinstance(message, RankDone):
            self.results[message.rank] = message.result
            self.sim.rank_done(message.rank)
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
        """Handle one message; False when the pipe is closed."""
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return False
        self.last_progress = time.monotonic()
        self.handle(message)
        return True

    def simulate(self):
        try:
            replies = self.sim.advance()
            stuck = self.sim.stuck()
        except SimulationError as e:
            raise RankFailed("simulator", str(e), "", True) from None
        for rank, reply in replies:
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

    def raise_first_error(self):
        if self.errors:  # the earliest failure is the cause; later ones are its echoes
            first = min(self.errors, key=lambda m: m.at)
            raise RankFailed(first.who, first.message, first.details, first.user_error)

    def finished(self) -> bool:
        return all(r is not None for r in self.results) and self.rows.next_step > self.last_step()

    def run(self):
        open_conns = {conn: i for i, conn in enumerate(self.conns)}
        sentinels = {p.sentinel: i for i, p in enumerate(self.processes)}
        self.last_progress = time.monotonic()
        while not self.finished():
            ready = mp.connection.wait([*open_conns, *sentinels],
                                       timeout=min(5.0, self.watchdog / 2))
            if not ready and time.monotonic() - self.last_progress > self.watchdog:
                raise RankFailed("watchdog", describe_stall(self, self.watchdog), "", False)
            for obj in ready:
                if obj in open_conns:
                    alive = self.read(obj)
                    while alive and obj.poll():  # drain: one simulator pass per batch
                        alive = self.read(obj)
                    if not alive:
                        del open_conns[obj]
            self.raise_first_error()
            self.simulate()
            self.emit()
            self.release_stalled_verdicts()
            for obj in ready:
                if obj in sentinels:
                    self._check_exit(sentinels.pop(obj), open_conns)

    def _check_exit(self, i, open_conns):
        """Child i exited: drain what it said, then fail unless it had finished."""
        conn = self.conns[i]
        while conn in open_conns and conn.poll() and self.read(conn):
            pass
        self.raise_first_error()
        finished = self.results[i] is not None if i < self.job.nodes else self.finished()
        if not finished:
            self.processes[i].join()
            raise RankFailed(self.who[i], "process died with exit code "
                             f"{self.processes[i].exitcode}", "", False)


def _stop(processes):
    for p in processes:
        if p.is_alive():
            p.kill()
    for p in processes:
        p.join(timeout=5)
