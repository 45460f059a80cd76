"""What one rank does, in a process of its own or packed with others (node_host.py): build
its clock, communicator and strategy, train, and report each step to the launcher."""
from __future__ import annotations

import math
import random
import resource
import time
from dataclasses import dataclass

import numpy
import torch

from ... import distributed
from ...comm import Communicator
from ...comm.exchange import Exchange
from ...comm.rank_failures import RankFaults
from ...errors import ExoframeError
from ...schema import FailureRecord, RankResult, Traffic
from ...sim.clocks.clock import RankClock, StepClock
from ...sim.clocks.compute import ComputeClock
from ...sim.clocks.measured import RealClock
from ...sim.clocks.protocol import StepEnd
from ...sim.clocks.transport import Conn
from ...strategies.seeds import derive
from ..ipc.messages import AskStop, CheckpointLate, Checkpointed, PipeSimPort, RankDone, StepDone
from ..plan import devices
from ..plan.job import Job
from ..records import rank_state
from .data import Batches
from .loop import Precision, set_lr
from .node_host import NodeHost, OwnProcess
from .replicas import checksum
from .schedule import lr_at


def check_finite(value: float, step: int, rank: int, on_nonfinite: str):
    if not math.isfinite(value) and on_nonfinite == "stop":
        shown = "NaN" if math.isnan(value) else value
        raise ExoframeError(
            f"loss became {shown} at step {step} on rank {rank}. Lower the learning rate or "
            "fix the model, or train on anyway with --on-nonfinite continue.")


def make_clock(rank: int, job: Job, port: PipeSimPort, device: torch.device,
               timer=None) -> StepClock:
    """timer: the compute timer (default: the thread's CPU time, or a GPU timer where the
    compute is measured on a GPU: it synchronizes, so only then)."""
    sim = job.sim
    if timer is None:
        timer = (devices.gpu_timer(device) if device.type == "cuda" and measures(job)
                 else time.thread_time)
    if sim.real:
        return RealClock(rank, timer, sim.topology.algorithms, sim.algorithms, sim.topology)
    compute = ComputeClock(sim.compute, sim.stragglers.for_rank(rank, job.seed), timer)
    return RankClock(rank, port, compute, sim.topology.algorithms,
                     sim.algorithms, topology=sim.topology)


def measures(job: Job) -> bool:
    """Whether a rank's compute is measured (--compute measured, or --net real)."""
    return job.sim.real or job.sim.compute.kind == "measured"


def stop_after(port: PipeSimPort, rank: int, step: int) -> bool:
    """Whether to stop after `step`, as the launcher answers once it has validated step
    `step` − LAG: the same answer for every rank (see engine/plan/target.py)."""
    port.conn.send(AskStop(rank, step))
    return port.recv().stop


def run_rank(rank: int, job: Job, batches: Batches, evaluator: Conn, conn: Conn):
    """A rank that is a process of its own (node_host.OwnProcess); evaluator: its pipe to
    the evaluator (None: its models go through `conn`, which the launcher relays)."""
    train(rank, job, batches, conn, OwnProcess(conn, evaluator))


def train(rank: int, job: Job, batches: Batches, conn: Conn, host: NodeHost):
    """batches: this rank's data, made by the launcher before the fork. Every rank inherits
    the launcher's model through the fork (a packed node copies it), so all start identical.

    At evaluation steps the rank sends its models (engine/node/model_state.py) through its host
    to the evaluator process, which folds every rank's and validates, so no rank waits for
    another outside the simulated network. With a target loss, every step is evaluated and
    the rank asks the launcher whether to stop (see engine/plan/target.py)."""
    device, exchange, model = host.join(rank, job)
    seed_rank(job.seed, rank, device)
    me = Rank(rank, job, model, device, exchange, batches, conn, host)
    host.keeps(me.state_tensors)
    first = me.resume()
    model.train()
    me.clock.skip()
    for step in range(first, job.steps + 1):
        trained = me.train_step(step)
        stop = me.report(step, trained)
        me.checkpoint(step)
        me.clock.skip()
        if stop:
            break
    host.close()
    me.finish()


def seed_rank(seed: int, rank: int, device: torch.device):
    """Per-rank randomness (dropout, a user's draws), the same in every run of this seed
    (a forked process's Python generator is reseeded from the OS at the fork). A rank on
    the CPU seeds the CPU's generator alone: torch.manual_seed also queues a seed for every
    GPU kind, a hundred times the cost, paid by each of 1024 packed nodes (a CPU rank that
    draws on a GPU anyway draws from the run's seed, the same in every rank)."""
    seed = derive(seed, rank)
    if device.type == "cpu":
        torch.default_generator.manual_seed(seed)
    else:
        torch.manual_seed(seed)
    random.seed(seed)
    numpy.random.seed(seed % 2**32)


@dataclass
class Trained:
    """What a step's compute gave: the loss and gradient norm (None on a down node)."""
    lr: float
    loss: float | None = None
    grad_norm: float | None = None
    down: bool = False  # a simulated failure: the node computed nothing


class Rank:
    """One rank's pieces (clock, communicator, strategy, precision, checkpoints) and the
    phases of its steps: train, report to the launcher, checkpoint, finish."""

    def __init__(self, rank: int, job: Job, model, device: torch.device, exchange: Exchange,
                 batches: Batches, conn, host: NodeHost):
        self.rank, self.job, self.model, self.device = rank, job, model, device
        self.batches, self.conn, self.add_models = batches, conn, host.add_models
        self.forward_backward = host.forward_backward
        self.moving_seconds = 0.0  # folding and sending its models for validation
        self.port = PipeSimPort(conn, rank)
        self.clock = make_clock(rank, job, self.port, device, host.timer)
        traits = job.strategy_cls.traits
        self.faults = RankFaults(rank, job.faults.plan(job.nodes, job.seed), job.strategy_name,
                                 traits.survives_failures) if job.faults.active else None
        self.comm = Communicator(rank, job.nodes, self.clock, faults=self.faults,
                                 exchange=exchange)
        self.comm.remote.declared = traits.remote_calls
        distributed.bind(self.comm)
        self.strategy = job.strategy_cls(model, self.comm, job.optimizer, job.strategy_params,
                                         seed=job.seed, total_steps=job.steps)
        self.precision = Precision(job.precision, device)
        self.checkpoints = rank_state.RankCheckpoints(job.checkpoint_every, job.run_dir, rank)
        # Under simulated failures a rank that is down misses synchronizations: no check.
        self.check_replicas = (traits.replicas_equal_after_sync and job.nodes > 1
                               and not job.faults.active)

    @property
    def pieces(self) -> tuple:
        """What a checkpoint of the rank holds (engine/records/rank_state.py)."""
        return (self.model, self.strategy, self.batches, self.clock, self.comm, self.precision)

    def state_tensors(self) -> list:
        """What the node keeps between its steps: the strategy's state as a node back from
        a failure takes it (weights, buffers, optimizer and strategy state), and gradients."""
        return [*self.strategy.recovery_tensors(), *(p.grad for p in self.model.parameters())]

    def resume(self) -> int:
        """The first step to train: 1, or the one after a resumed run's checkpoint."""
        job = self.job
        if job.resume_from is None:
            return 1
        state = rank_state.load(job.resume_from.rank_file(self.rank), self.device)
        return rank_state.restore(state, *self.pieces) + 1

    def train_step(self, step: int) -> Trained:
        """Compute, then the strategy's step."""
        job, clock, strategy, precision = self.job, self.clock, self.strategy, self.precision
        # A failed node computes nothing; it still steps, so its collectives stay matched.
        down = self.faults is not None and self.faults.at_step_start(step, clock)
        clock.start_step()
        trained = Trained(set_lr(strategy, lr_at(step, job.optimizer.lr, job.schedule,
                                                 job.steps, job.warmup_steps,
                                                 job.min_lr_ratio)), down=down)
        if not down:
            trained.loss = self.forward_backward(self.model, self.batches, job.accumulate,
                                                 precision, self.device, step, clock)
            check_finite(trained.loss, step, self.rank, job.on_nonfinite)
            trained.grad_norm = precision.unscale_and_clip(strategy.optimizer,
                                                           self.model.parameters(),
                                                           job.clip_grad_norm)
        strategy.step_num = step
        strategy.step()
        if job.strategy_cls.traits.remote_calls and not trained.down:
            self.comm.remote.serve()
        if not trained.down:  # a down rank unscaled nothing
            precision.update()
        clock.charge()
        clock.end_step(step)
        return trained

    def record(self, end: StepEnd, trained: Trained) -> dict:
        """The step's row as this rank saw it."""
        record = {"loss": trained.loss, "lr": trained.lr,
                  "bytes_sent": self.comm.traffic.bytes_sent, "sim_time": end.t,
                  **self.precision.metrics(), **self.strategy.metrics()}
        if self.job.clip_grad_norm is not None:
            record["grad_norm"] = trained.grad_norm  # before clipping
        if self.faults is not None:
            record["nodes_down"] = int(trained.down)
        return record

    def report(self, step: int, trained: Trained) -> bool:
        """Send the step's end, record and (at evaluation steps) model state to the launcher;
        whether the launcher says to stop after it. (Bookkeeping, as what follows up to the
        next step: the clock.skip() after it leaves its time out.)"""
        job, rank, conn, strategy = self.job, self.rank, self.conn, self.strategy
        end = StepEnd(self.clock.now, step)
        synced = (checksum(self.model) if self.check_replicas and strategy.synced_at == step
                  else None)
        record = self.record(end, trained)
        evaluate = job.evaluates(step)
        if evaluate:
            self.send_models(step, trained.down, True, job.replicas_at(step))
        conn.send(StepDone(rank, step, end, record, evaluate, synced))
        stop = job.asks_to_stop(step) and stop_after(self.port, rank, step)
        if stop:  # what the final model and its validation still need of this step
            held, replicas = job.at_stop(step)
            if held or replicas:
                self.send_models(step, trained.down, held, replicas)
        return stop

    def send_models(self, step: int, down: bool, held: bool, replicas: bool):
        start = time.perf_counter()
        self.add_models(self.strategy, self.rank, step, not down, held, replicas, self.device)
        self.moving_seconds += time.perf_counter() - start

    def checkpoint(self, step: int):
        """Save at `step` where the run checkpoints then, or where a stop signal asked for it.
        A rank asked for a step it has passed says so and waits for a later one; one that
        saved the asked step waits too: the launcher stops the run once every rank has, or
        asks for a later step (a rank was late). Going on, ranks would outrun each ask."""
        late = False
        for wanted in self.port.checkpoint_requests():  # the run was asked to stop
            late |= not self.checkpoints.request(wanted, step)
        if late:
            self.conn.send(CheckpointLate(self.rank, step))
            self.wait_for_a_later_ask(step)
        asked = self.checkpoints.requested is not None
        if self.checkpoints.save_now(step, self.comm):
            rank_state.save(self.checkpoints.folder.rank_file(step, self.rank),
                            rank_state.capture(step, *self.pieces))
            self.conn.send(Checkpointed(self.rank, step))
            if asked and self.checkpoints.requested is None:
                self.wait_for_a_later_ask(step)

    def wait_for_a_later_ask(self, step: int):
        while not self.checkpoints.request(self.port.next_checkpoint_request(), step + 1):
            pass

    def finish(self):
        """End training, serve peers' remote calls until every rank is done, and send what
        the rank did (RankDone)."""
        comm, clock, faults = self.comm, self.clock, self.faults
        self.strategy.finish()
        comm.wait_all()
        stats = clock.stats()  # training ends here; what follows only serves the others
        if self.job.strategy_cls.traits.remote_calls:
            comm.remote.barrier()  # serve what peers still ask until every rank is here
        result = RankResult(
            traffic={kind: Traffic(**counts) for kind, counts in comm.traffic.as_dict().items()},
            bytes_sent=comm.traffic.bytes_sent,
            bytes_received=comm.traffic.bytes_received,
            peak_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            samples=self.batches.samples,
            moving_models_seconds=self.moving_seconds,
            **stats,
            failures=[FailureRecord(**f) for f in faults.records] if faults is not None else [],
            trace=clock.trace)
        # (as its mapping: the launcher and engine/run.py read it by key)
        self.conn.send(RankDone(self.rank, result.to_json()))
