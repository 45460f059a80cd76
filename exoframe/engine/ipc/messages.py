"""What the launcher and its children (ranks, evaluator) say over their pipes: typed messages.

A rank on another machine (torchrun, engine/launch/cluster.py) first says Hello over TCP and is
answered Welcome or Refused. Launcher -> rank: Rendezvous once, the simulator's replies
(exoframe.sim.clocks.protocol), and
StopAnswer to an AskStop, CheckpointNow (at any time: a stop signal came). Rank -> launcher:
SimRequest (a rank clock's message for the simulator), StepDone, AskStop, Checkpointed,
CheckpointLate, RankDone. A worker of packed nodes and the launcher bundle them (Bundle;
NodeMessage names the node a launcher's message is for). Rank or worker -> evaluator, over a
pipe of its own (a rank on another machine: through the launcher): its models at evaluation
steps (engine.model_state.FoldedModels). Launcher -> evaluator: EvaluatorStop; evaluator ->
launcher: Validated, then EvaluatorDone. Any child -> launcher: ChildFailed.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from ...sim.clocks.protocol import Resume, StepEnd
from ...sim.clocks.transport import Conn


@dataclass(frozen=True)
class Rendezvous:
    """Where the ranks meet to make their process group: a FileStore in the launcher's
    private folder (`store_path`), or under torchrun the rendezvous's TCPStore
    (`tcp_store`: host, port, key prefix)."""
    store_path: Optional[str]
    timeout_seconds: float
    backend: str  # gloo or nccl, as the launcher chose for every rank
    tcp_store: Optional[tuple] = None


@dataclass(frozen=True)
class Hello:
    """A rank started by torchrun introduces itself to the launcher on rank 0's host."""
    rank: int
    world_size: int
    host: str
    version: str  # exoframe's
    config: dict  # the run's configuration as this rank resolved it
    device: str  # the device it resolved to on this rank's machine


@dataclass(frozen=True)
class Welcome:
    pass


@dataclass(frozen=True)
class Refused:
    message: str  # why, and the fix


@dataclass(frozen=True)
class SimRequest:
    rank: int
    message: Any  # a message of exoframe.sim.clocks.protocol
    payload: Optional[bytes] = None  # a Post's content (a remote call or its result)


@dataclass(frozen=True)
class StepDone:
    rank: int
    step: int
    end: StepEnd  # for the simulator: the rank sends nothing earlier than end.t from now on
    record: dict  # loss, lr, bytes_sent, sim_time, the strategy's metrics
    evaluated: bool  # it sent its models to the evaluator (engine/node/model_state.py)
    checksum: Optional[int] = None  # its parameters' after a synchronization (replicas.py)


@dataclass(frozen=True)
class AskStop:
    rank: int
    step: int


@dataclass(frozen=True)
class StopAnswer:
    stop: bool


@dataclass(frozen=True)
class Checkpointed:
    """The rank saved its state at the end of `step` (engine/records/checkpoint.py)."""
    rank: int
    step: int


@dataclass(frozen=True)
class CheckpointNow:
    """Save at the first step end at or after `step` with no exchange in flight (the run
    was asked to stop: it stops once that checkpoint is committed)."""
    step: int


@dataclass(frozen=True)
class CheckpointLate:
    """The rank had already ended `step`, past the one a CheckpointNow asked for."""
    rank: int
    step: int


@dataclass(frozen=True)
class RankDone:
    rank: int
    result: dict  # traffic, bytes, clock stats, peak memory, trace


@dataclass(frozen=True)
class EvaluatorStop:
    pass


@dataclass(frozen=True)
class Validated:
    step: int
    loss: Optional[float]  # None without validation data
    metrics: dict  # the workload's metrics, averaged over examples
    replicas_loss: Optional[float] = None  # the replicas' average's, where not the held model
    held: bool = True  # loss and metrics are the held model's (else a replicas-only answer)


@dataclass(frozen=True)
class EvaluatorDone:
    """The evaluator's last word: the latest step's held model, and what validation cost."""
    final_state: Optional[Any]  # engine.model_state.ModelState
    validating_seconds: float
    moving_seconds: float  # folding the ranks' models here (the ranks count theirs)


@dataclass(frozen=True)
class Bundle:
    """Messages sent together over one pipe: a worker of packed nodes (engine/node/packing.py)
    and the launcher write one per round."""
    messages: tuple


@dataclass(frozen=True)
class NodeMessage:
    """A message from the launcher for one node of a worker of packed nodes."""
    rank: int
    message: object


@dataclass(frozen=True)
class ChildFailed:
    who: Any  # a rank number or "evaluator"
    at: float  # wall-clock time: the earliest failure is the cause
    message: str
    details: str  # the traceback
    user_error: bool


class PipeSimPort:
    """A rank clock's way to the simulator over the rank's pipe (see sim/clocks/clock.py). A
    CheckpointNow may come while the rank waits for the simulator: it is kept for the
    rank's next step end (checkpoint_requests). A Resume comes to a rank that paused (a
    stacked node waiting for its worker's others: engine/node/stacked.py); one for a step
    the rank no longer waits at (its wait ended first) is dropped."""

    def __init__(self, conn: Conn, rank: int):
        self.conn, self.rank = conn, rank
        self.kept: list[CheckpointNow] = []
        self.resumes: set[int] = set()  # the steps a Resume came for

    def send(self, message, payload: bytes | None = None):
        self.conn.send(SimRequest(self.rank, message, payload))

    def recv(self):
        while True:
            message = self.conn.recv()
            if not self._kept(message):
                return message

    def _kept(self, message) -> bool:
        """Keep a message that may come at any time; whether it was one."""
        if isinstance(message, CheckpointNow):
            self.kept.append(message)
        elif isinstance(message, Resume):
            self.resumes.add(message.step)
        else:
            return False
        return True

    def _read_unasked(self, block: bool = False):
        """Read what came unasked (all of it; block: at least one message)."""
        while block or self.conn.poll():
            message = self.conn.recv()
            if not self._kept(message):
                raise RuntimeError(f"rank {self.rank}: {message!r} came unasked")
            block = False

    def resumed(self, step: int) -> bool:
        """Whether the simulator said to go on at `step` (it waits for this rank)."""
        self._read_unasked()
        resumed = step in self.resumes
        self.resumes = set()  # (one for an earlier step came after that wait ended)
        return resumed

    def checkpoint_requests(self) -> list[int]:
        """The steps asked for since the last call. At a step end the rank waits for no
        answer: whatever is in the pipe was sent unasked."""
        self._read_unasked()
        steps, self.kept = [m.step for m in self.kept], []
        return steps

    def next_checkpoint_request(self) -> int:
        """Wait for the step the launcher asks next (a rank that said CheckpointLate)."""
        while not self.kept:
            self._read_unasked(block=True)
        return self.kept.pop(0).step
