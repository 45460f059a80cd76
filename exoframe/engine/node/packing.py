"""Many simulated nodes per worker process: each node is a greenlet running the same rank
code (rank.py's train) with its own model, optimizer, strategy, data and simulated clock;
the process's hub resumes them in turn.

Why greenlets: a node gives way only where it waits (for the simulator, a verdict, an
exchange's parts) and after a turn of STEPS_PER_TURN steps, so nodes step one after another
as a plain loop over N models would
(benchmarks/node_packing.py: ×1.00 of that loop; threads handing a baton ×1.8, free threads
×3–7.5 on 2 cores), and no process per node, no gloo full mesh: 1024 nodes fit one machine.

What a node holds of the process's globals is swapped in and out with it: torch's and
Python's random generators (dropout, a user's random draws), torch's grad mode, and the
rank that exoframe.distributed serves. numpy's global generator is not (its state costs
~60 µs to swap, a tenth of a small model's step): the nodes of a worker share it. Its
compute, under `--compute measured`, is the CPU time of the process's thread while it runs
(its `timer`), less the time its exchanges take (`off_clock`), not the process's.

The hub talks to the launcher over one pipe, messages for many nodes bundled per round
(Bundle, NodeMessage), and to the other workers over a pipe per pair (comm/memory.py's
Contributions). One thread sends everything, so that a worker never blocks in a send while
its peer blocks in one to it.
"""
from __future__ import annotations

import contextlib
import faulthandler
import multiprocessing.connection
import select
import signal
import time
import traceback
from collections import deque

import torch
from greenlet import greenlet

from ...comm.memory import Contribution, Pack
from ...files import write_atomic
from ..ipc.messages import CheckpointLate, NodeMessage, StepDone
from ..ipc.processes import STACK_SIGNAL, NodeFailed
from ..ipc.sender import Outbox, Sender
from . import model_state
from .loop import warm_up
from .node_globals import TURNS, NodeGlobals
from .node_host import PackedNode
from .offload import OffloadedState, storage_ids
from .rank import measures, train
from .stacked import StackedReplicas

# A node that does not wait runs up to this many steps before the next node's turn: each
# turn costs a switch and a swap of the node's globals (~30 µs), and its model stays in the
# cache.
STEPS_PER_TURN = 10
FLUSH_SECONDS = 1.0  # what the nodes said reaches the launcher at least this often


def _always() -> bool:
    return True


class Node:
    """One simulated node of a worker: its greenlet and what it keeps of the globals."""

    def __init__(self, rank: int, run, hub: "Hub"):
        """run(node): the node's life."""
        self.rank, self.hub = rank, hub
        self.glet = greenlet(lambda: run(self), parent=hub.main)
        self.inbox: deque = deque()
        self.ready = None  # while it waits: what must hold for it to go on
        self.cpu, self.resumed_at = 0.0, None
        # Its first turn is one step (unless it waits in it): the launcher hears of every
        # node's first step at once.
        self.steps_this_turn = STEPS_PER_TURN - 1
        self.globals = NodeGlobals(hub.cuda)
        self.gpu_seconds, self.turn_start = 0.0, None  # its GPU time (hub.gpu_timing)
        self.off_spans: list = []  # its exchanges' GPU work this turn: (start, end) events
        self.state = None  # () -> its state's tensors (Rank.state_tensors), once it has one
        self.offloaded = OffloadedState(hub.device) if hub.offload else None

    def timer(self) -> float:
        """The CPU time this node has run (its compute under --compute measured)."""
        running = time.thread_time() - self.resumed_at if self.resumed_at is not None else 0.0
        return self.cpu + running

    def gpu_timer(self) -> float:
        """The GPU time of this node's turns (its compute under --compute measured on a
        GPU: the worker's stream runs one node's kernels at a time), read with CUDA events."""
        if self.turn_start is None:
            return self.gpu_seconds
        now = torch.cuda.Event(enable_timing=True)
        now.record()
        now.synchronize()
        exchanges = sum(start.elapsed_time(end) for start, end in self.off_spans)
        self.off_spans = []
        self.gpu_seconds -= exchanges / 1000
        return self.gpu_seconds + self.turn_start.elapsed_time(now) / 1000

    def add_compute(self, seconds: float):
        """A share of compute done for it in another node's turn (a stacked step)."""
        if self.hub.gpu_timing:
            self.gpu_seconds += seconds
        else:
            self.cpu += seconds


class NodeConn:
    """A node's side of its connection to the launcher: a Conn (sim/clocks/transport.py), as
    a rank's pipe is."""

    def __init__(self, node: Node):
        self.node = node

    def send(self, message):
        self.node.hub.launcher.pending.append(message)
        if isinstance(message, StepDone):
            self.node.hub.step_ended()
        elif isinstance(message, CheckpointLate):  # the node waits for the answer
            self.node.hub.launcher.flush()

    def recv(self):
        inbox = self.node.inbox
        self.node.hub.block(lambda: bool(inbox))
        return inbox.popleft()

    def poll(self, timeout=0) -> bool:
        return bool(self.node.inbox)

    def close(self):
        pass  # (the worker's pipe stays open for its other nodes)


class Hub:
    """Runs a worker's nodes until all are done: resumes every node that can go on, sends
    what they said, reads what came, and again."""

    def __init__(self, conn, peers: dict, index: int, home: list, evaluator, ranks: list,
                 device: torch.device = torch.device("cpu"), gpu_timing: bool = False,
                 offload: bool = False):
        """conn: the pipe to the launcher; peers: worker index -> pipe to it; evaluator:
        the pipe to the evaluator; ranks: the worker's nodes; device: theirs; gpu_timing:
        time each node's turns on the GPU (measured compute on a GPU); offload: keep each
        node's state in host memory between its turns (engine/node/offload.py)."""
        self.main = greenlet.getcurrent()
        self.device, self.offload = device, offload
        self.cuda, self.gpu_timing = device.type == "cuda", gpu_timing
        self.sender = Sender()
        self.sender.start()
        self.launcher = Outbox(conn, self.sender.sender_for(conn))
        # Models have a thread of their own: a fold outgrows the pipe, and the evaluator may
        # be validating; the worker's other messages must not wait behind it.
        self.models_sender = Sender()
        self.models_sender.start()
        self.to_evaluator = self.models_sender.sender_for(evaluator)
        self.ranks = ranks
        self.folds: dict[tuple, model_state.FoldedModels] = {}  # (step, held?) -> the nodes'
        self.last_held = None  # (weights, exact buffers) of the last held model sent
        self.peers = {i: Outbox(c, self.sender.sender_for(c)) for i, c in peers.items()}
        self.reading = [conn, *peers.values()]
        self.pack = Pack(home, index, self.post, self.block, self.off_clock)
        self.nodes: dict[int, Node] = {}
        self.current: Node | None = None
        self.flushed_at = time.monotonic()
        self.launcher_poll = select.poll()  # whether the launcher said something, in 0.4 µs
        self.launcher_poll.register(conn.fileno(), select.POLLIN)

    def post(self, process: int, message: Contribution):
        self.peers[process].pending.append(message)

    def add(self, rank: int, run):
        """run(node): what the node does, in its greenlet."""
        # (Node reads the process's generators: under --in-process the evaluator's thread may
        # read them at once, and two threads in torch.get_rng_state can deadlock when a
        # garbage collection between them runs a finalizer that gives up the GIL.)
        with TURNS:
            self.nodes[rank] = Node(rank, run, self)

    @contextlib.contextmanager
    def off_clock(self):
        """Leave what runs inside out of the current node's compute: the work of an
        exchange (gloo does it in its own threads), its CPU time and, on a GPU under
        gpu_timing, its kernels' time. Nothing inside may give way."""
        start = time.thread_time()
        spans = self.current.off_spans if self.gpu_timing and self.current is not None else None
        if spans is not None:  # (on a GPU: the exchange's kernels, timed by events)
            spans.append((torch.cuda.Event(enable_timing=True),
                          torch.cuda.Event(enable_timing=True)))
            spans[-1][0].record()
        try:
            yield
        finally:
            if spans is not None:
                spans[-1][1].record()
            if self.current is not None:
                self.current.cpu -= time.thread_time() - start

    @contextlib.contextmanager
    def shared_compute(self, ranks: list):
        """What runs inside is the compute of the nodes `ranks`, in equal shares (a stacked
        step, engine/node/stacked.py), not the current node's alone. Nothing inside may
        give way."""
        if self.gpu_timing:
            start = torch.cuda.Event(enable_timing=True)
            start.record()
        else:
            start = time.thread_time()
        with self.off_clock():
            yield
        if self.gpu_timing:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            end.synchronize()
            seconds = start.elapsed_time(end) / 1000
        else:
            seconds = time.thread_time() - start
        for rank in ranks:
            self.nodes[rank].add_compute(seconds / len(ranks))

    def add_models(self, strategy, rank: int, step: int, live: bool, held: bool,
                   replicas: bool, device):
        """A node's models at an evaluation step, added into its worker's fold (on the nodes'
        device: model_state.add_models); the fold goes to the evaluator once every node of
        the worker is in."""
        key = (step, held)
        folded = model_state.add_models(self.folds.get(key), strategy, rank, step, live, held,
                                        replicas, device)
        self.folds[key] = folded
        if folded.ranks == len(self.ranks):
            del self.folds[key]
            if len(self.ranks) == len(self.pack.home):  # every node is here
                self.finish(folded)
            self.to_evaluator(folded)

    def finish(self, folded: model_state.FoldedModels):
        """A fold of every node: only its result goes, and a held model equal to the one
        sent last (DiLoCo between outer steps) goes as a mark (FoldedModels.held_same)."""
        for fold in (folded.held, folded.replicas):
            if fold is not None:
                fold.collapse()
        if folded.held is None:
            return
        held, last = folded.held.result(), self.last_held
        if last is not None and torch.equal(last[0], held) and \
                model_state.same_buffers(last[1], folded.exact):
            folded.held, folded.held_same = None, True
        else:
            self.last_held = (held, folded.exact)

    def step_ended(self):
        """The current node ended a step. Its turn ends after STEPS_PER_TURN steps, once the
        launcher has said something (a checkpoint request is for the step after the furthest
        reported one) or once the last flush is FLUSH_SECONDS old (the watchdog hears from
        every worker)."""
        node = self.current
        node.steps_this_turn += 1
        if node.steps_this_turn >= STEPS_PER_TURN or self.launcher_said() \
                or time.monotonic() - self.flushed_at > FLUSH_SECONDS:
            self.block(_always, give_way=True)

    def launcher_said(self) -> bool:
        return bool(self.launcher_poll.poll(0))

    def block(self, ready, give_way: bool = False):
        """Called by a node: give way until ready() holds (give_way: even if it does)."""
        if ready() and not give_way:
            return
        node = self.current
        node.ready, node.steps_this_turn = ready, 0
        self.main.switch()

    def run(self):
        try:
            while self.nodes:
                ran = self._run_ready()
                self._flush()
                self._receive(block=not ran)
        except BaseException:
            # What the nodes said goes to the launcher; nothing more to peers, which may
            # not be reading either (a bug on every node): the failure is reported at once.
            self.launcher.flush()
            self.sender.close(timeout=5)
            self.models_sender.close(timeout=5)  # (a worker that is a thread: InProcess)
            raise
        self.models_sender.close()
        self.sender.close()

    def _run_ready(self) -> bool:
        ran = False
        for node in list(self.nodes.values()):
            if node.ready is None or node.ready():
                node.ready = None
                self._resume(node)
                ran = True
                if time.monotonic() - self.flushed_at > FLUSH_SECONDS or self.launcher_said():
                    self._flush()  # within a long round
                    self._receive(block=False)
        return ran

    def _resume(self, node: Node):
        with TURNS:  # (uncontended unless the evaluator is a thread beside: --in-process)
            self._turn(node)

    def _turn(self, node: Node):
        self.current = node
        if node.offloaded is not None:
            node.offloaded.unpark()
        node.globals.swap_in()
        if self.gpu_timing:
            node.turn_start = torch.cuda.Event(enable_timing=True)
            node.turn_start.record()
        node.resumed_at = time.thread_time()
        try:
            node.glet.switch()
        except BaseException as e:
            raise NodeFailed(node.rank) from e  # (processes.failure names it)
        finally:
            node.cpu += time.thread_time() - node.resumed_at
            node.resumed_at = None
            self.current = None
        if self.gpu_timing:
            node.gpu_seconds, node.turn_start = node.gpu_timer(), None
        node.globals.swap_out()
        if node.glet.dead:
            del self.nodes[node.rank]
        elif node.offloaded is not None and node.state is not None:
            node.offloaded.park(node.state(), storage_ids(self.pack.held_tensors()))

    def _flush(self):
        self.flushed_at = time.monotonic()
        self.launcher.flush()
        for outbox in self.peers.values():
            outbox.flush()

    def _receive(self, block: bool):
        ready = multiprocessing.connection.wait(self.reading, timeout=None if block else 0)
        for conn in ready:
            while conn.poll():
                try:
                    bundle = conn.recv()
                except EOFError:
                    if conn is self.launcher.conn:
                        raise
                    self.reading.remove(conn)  # a peer whose nodes are all done
                    break
                for message in bundle.messages:
                    if isinstance(message, NodeMessage):
                        node = self.nodes.get(message.rank)
                        if node is not None:  # (a finished node needs nothing more)
                            node.inbox.append(message.message)
                    else:
                        self.pack.receive(message)


def write_stacks_on(signum: int, path: str, hub: Hub):
    """On `signum` (the watchdog's), write every node's Python stack to `path`: where each
    waits, which a dump of the process's thread (the hub's) would not show."""
    def stack(node: Node, frame) -> str:
        if node is hub.current:
            return f"rank {node.rank} (running):\n" + "".join(traceback.format_stack(frame))
        if node.glet.gr_frame is None:
            return f"rank {node.rank} (not started)\n"
        return f"rank {node.rank} (waiting):\n" + "".join(
            traceback.format_stack(node.glet.gr_frame))

    def write(_signum, frame):
        write_atomic(path, "\n".join(stack(node, frame) for node in hub.nodes.values())
                     or "no node left\n")
    faulthandler.unregister(signum)
    signal.signal(signum, write)


def run_nodes(ranks: list, job, batches: dict, home: list, index: int, peers: dict,
              stack_path: str, evaluator, conn):
    """A worker process: train `ranks` as nodes of one hub (see train in rank.py). peers:
    worker index -> the pipe to it; stack_path: where the watchdog reads the stacks;
    evaluator: the pipe to the evaluator."""
    torch.set_num_threads(job.threads)
    device = job.placement.device_of(ranks[0])
    if device.type == "cuda":
        torch.cuda.set_device(device)
    gpu_timing = device.type == "cuda" and measures(job)
    if gpu_timing:
        with TURNS:  # (its generators are the process's: no evaluator thread draws meanwhile)
            warm_up(job, batches[ranks[0]], device)
    hub = Hub(conn, peers, index, home, evaluator, list(ranks), device, gpu_timing,
              job.placement.offload)
    if stack_path is not None:  # (None: a thread of the launcher's process, InProcess)
        write_stacks_on(STACK_SIGNAL, stack_path, hub)
    stacked = (StackedReplicas(job.model, ranks, device, job.seed, hub.block,
                               hub.shared_compute) if job.placement.stacked else None)
    for rank in ranks:
        hub.add(rank, lambda node: train(node.rank, job, batches[node.rank], NodeConn(node),
                                         PackedNode(node, gpu_timing, stacked)))
    hub.run()

