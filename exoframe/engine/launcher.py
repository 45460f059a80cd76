"""Start one process per rank, relay their progress, and stop them all if one fails.

Ranks are forked from this process, which has already imported torch, so start-up does not
pay a fresh interpreter and torch import per rank. The launcher owns the rendezvous store on
a free port (two runs at once never collide), watches every rank's pipe and process, and on
a failure or Ctrl-C kills every rank so that no process is left behind.
"""
from __future__ import annotations

import ctypes
import datetime
import multiprocessing as mp
import multiprocessing.connection
import os
import signal
import sys
import time
import traceback
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ..errors import ExoframeError
from .data import Batches, fetch
from .job import Job
from .rank import check_loss, train


class RankFailed(ExoframeError):
    def __init__(self, rank: int, message: str, details: str, user_error: bool):
        super().__init__(f"rank {rank}: {message}")
        self.rank, self.details, self.user_error = rank, details, user_error


class RunInterrupted(ExoframeError):
    pass


@dataclass
class LaunchResult:
    rank_results: list
    startup_seconds: float
    elapsed_seconds: float
    final_parameters: torch.Tensor | None = None


def _die_with_parent():
    if sys.platform.startswith("linux"):
        PR_SET_PDEATHSIG = 1
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def _rank_entry(rank: int, job: Job, data, conn):
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the launcher handles Ctrl-C for everyone
    _die_with_parent()
    code = 0
    try:
        train(rank, job, *data, conn)
    except BaseException as e:  # report, then exit: the launcher stops the other ranks
        code = 1
        user_error = isinstance(e, ExoframeError)
        message = str(e) if user_error else f"{type(e).__name__}: {e}"
        try:
            conn.send(("error", rank, time.time(), message, traceback.format_exc(), user_error))
        except Exception:
            pass
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)  # skip interpreter teardown: a half-open process group can hang in it


class StepAggregator:
    """Turns per-rank step records into one row per step, once every rank reported it."""

    def __init__(self, nodes: int):
        self.nodes = nodes
        self.pending: dict[int, list] = {}

    def add(self, rank: int, step: int, record: dict):
        records = self.pending.setdefault(step, [None] * self.nodes)
        records[rank] = record
        if any(r is None for r in records):
            return None
        del self.pending[step]
        row = {"step": step}
        for key in dict.fromkeys(k for r in records for k in r):  # every key, in first-seen order
            values = [r[key] for r in records if r.get(key) is not None]
            if values:
                row[key] = sum(values) / len(values)
        row["bytes_sent_per_node"] = row.pop("bytes_sent")
        return row


def check_model(job: Job, train_shard):
    """Fail fast, before any fork: one forward pass (eval mode, no grad) must give a scalar."""
    was_training = job.model.training
    job.model.eval()
    try:
        with torch.no_grad():
            batch = fetch(train_shard, torch.arange(min(job.batch_size, len(train_shard))))
            check_loss(job.model(batch), step=0)
    finally:
        job.model.train(was_training)


def preload():
    """Import once, before forking, what every rank would otherwise import on its own.

    torch's optimizers import torch._dynamo on their first step (about 1.3 s and 800
    modules here); done in each of N ranks on 2 cores it would dominate start-up.
    """
    import torch._dynamo  # noqa: F401


def launch(job: Job, on_row=None) -> LaunchResult:
    """Run `job` on job.nodes forked ranks. `on_row(row)` is called for each finished step."""
    start = time.perf_counter()
    data = [(Batches(job.dataset(rank, job.nodes, "train"), job.batch_size, job.seed, rank),
             job.dataset(rank, job.nodes, "val")) for rank in range(job.nodes)]
    check_model(job, data[0][0].dataset)
    preload()
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo0" if sys.platform == "darwin" else "lo")
    context = mp.get_context("fork")
    pipes = [context.Pipe() for _ in range(job.nodes)]
    processes = [context.Process(target=_rank_entry, args=(rank, job, data[rank], child),
                                 daemon=True,
                                 name=f"exoframe-rank-{rank}")
                 for rank, (_, child) in enumerate(pipes)]
    for p in processes:
        p.start()
    conns = [parent for parent, _ in pipes]
    for _, child in pipes:
        child.close()
    try:
        # Created after the fork so that no store thread exists in the children.
        store = dist.TCPStore("127.0.0.1", 0, None, True, datetime.timedelta(seconds=60),
                              wait_for_workers=False)
        for conn in conns:
            conn.send(store.port)
        return _monitor(job, conns, processes, start, on_row)
    except KeyboardInterrupt:
        raise RunInterrupted("interrupted: every rank was stopped.") from None
    finally:
        _stop(processes)


class _Monitor:
    """Reads every rank's messages until all are done; raises on the first failure."""

    def __init__(self, job: Job, conns, processes, on_row):
        self.job, self.conns, self.processes, self.on_row = job, conns, processes, on_row
        self.aggregator = StepAggregator(job.nodes)
        self.results = [None] * job.nodes
        self.errors = []
        self.first_step_at = None

    def handle(self, message):
        kind = message[0]
        if kind == "step":
            _, rank, step, record = message
            if self.first_step_at is None:
                self.first_step_at = time.perf_counter()
            row = self.aggregator.add(rank, step, record)
            if row is not None and self.on_row is not None:
                self.on_row(row)
        elif kind == "done":
            self.results[message[1]] = message[2]
        elif kind == "error":
            self.errors.append(message)

    def read(self, conn) -> bool:
        """Handle one message; False when the pipe is closed."""
        try:
            self.handle(conn.recv())
            return True
        except (EOFError, OSError):
            return False

    def raise_first_error(self):
        if self.errors:  # the earliest failure is the cause; later ones are its echoes
            _, rank, _, text, details, user_error = min(self.errors, key=lambda m: m[2])
            raise RankFailed(rank, text, details, user_error)

    def run(self):
        open_conns = {conn: rank for rank, conn in enumerate(self.conns)}
        sentinels = {p.sentinel: rank for rank, p in enumerate(self.processes)}
        while any(r is None for r in self.results):
            ready = mp.connection.wait([*open_conns, *sentinels], timeout=5.0)
            for obj in ready:
                if obj in open_conns and not self.read(obj):
                    del open_conns[obj]
            self.raise_first_error()
            for obj in ready:
                if obj not in sentinels:
                    continue
                rank = sentinels.pop(obj)
                conn = self.conns[rank]
                while conn in open_conns and conn.poll() and self.read(conn):
                    pass
                self.raise_first_error()
                if self.results[rank] is None:
                    self.processes[rank].join()
                    raise RankFailed(rank, "process died with exit code "
                                     f"{self.processes[rank].exitcode}", "", False)
        return self.results


def _monitor(job, conns, processes, start, on_row) -> LaunchResult:
    monitor = _Monitor(job, conns, processes, on_row)
    results = monitor.run()
    final = results[0].pop("final_parameters")
    for r in results[1:]:
        r.pop("final_parameters")
    end = time.perf_counter()
    return LaunchResult(rank_results=results,
                        startup_seconds=(monitor.first_step_at or end) - start,
                        elapsed_seconds=end - start,
                        final_parameters=torch.from_numpy(final))


def _stop(processes):
    for p in processes:
        if p.is_alive():
            p.kill()
    for p in processes:
        p.join(timeout=5)
