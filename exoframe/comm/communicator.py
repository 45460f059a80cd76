"""The Communicator: the one way strategies exchange data.

Every operation passes through `_submit`. The tensors are exchanged for real through
torch.distributed; the same operation (kind, payload, participants) is reported to the
network simulator through the rank's clock, which decides when it completes in simulated
time. Real operations are always started asynchronously, before the rank waits for the
simulator: a rank never sits in a real exchange that the simulator does not know about.

Under simulated failures (faults.py) the operations run among the live members the last
quorum named (`live`): a down rank still makes every real collective, adding zeros, but
is no participant in the simulated one; a mean divides by the live count.
"""
from __future__ import annotations

import torch

from ..errors import ExoframeError
from ..sim.clocks.clock import Clock, SoloClock
from .exchange import Exchange, TorchExchange
from .flat import flatten_bytes, unflatten_bytes_into
from .remote import RemoteCalls
from .traffic import TrafficStats

_REDUCE_OPS = {"sum": "sum", "mean": "sum", "max": "max", "min": "min"}  # what is exchanged
_NEUTRAL = {"sum": 0.0, "mean": 0.0, "max": -float("inf"), "min": float("inf")}


class Handle:
    """An operation in flight. `wait()` moves the simulated clock to its completion and
    returns its result; `is_completed()` says whether it has completed by the rank's
    simulated now (not whether the bytes happen to have arrived for real)."""

    def __init__(self, comm: "Communicator", op_id: int, work, result=None, finish=None):
        self._comm, self._op_id, self._work = comm, op_id, work
        self._result, self._finish = result, finish
        self._done = False

    def wait(self):
        if not self._done:
            self._comm.clock.wait(self._op_id)
            self._complete()
        return self._result

    def is_completed(self) -> bool:
        if not self._done and self._comm.clock.is_done(self._op_id, self._work):
            self._complete()
        return self._done

    def wait_serving(self, serve):
        """wait(), giving each message that reaches the rank meanwhile to serve(mail) (the
        remote calls a rank serves while it waits at a barrier: comm/remote.py)."""
        if not self._done:
            while (mail := self._comm.clock.listen(self._op_id)) is not None:
                serve(mail)
            self._complete()  # its wait is over: the Listen was answered as a Wait
        return self._result

    def _complete(self):
        if self._work is not None:
            self._work.wait()
            self._comm.clock.waited(self._op_id)  # (RealClock: the wait is not compute)
        if self._finish is not None:
            self._finish()
        self._done = True
        self._comm._pending.discard(self)


class Communicator:
    def __init__(self, rank: int, world_size: int, clock: Clock | None = None, group=None,
                 p2p_group=None, faults=None, exchange: Exchange | None = None):
        """clock: the rank's exoframe.sim.clocks.clock.RankClock (the engine makes it); without
        one, a Communicator serves a single process (world size 1). p2p_group: the group for
        send and recv when it is not `group` (gloo beside NCCL, see engine/node/rank.py).
        faults: the rank's comm.rank_failures.RankFaults under simulated failures, else None.
        exchange: what moves the tensors (comm/exchange.py; default: torch.distributed in
        `group` and `p2p_group`)."""
        self.rank = rank
        self.world_size = world_size
        self.clock: Clock = clock if clock is not None else SoloClock()
        self.exchange: Exchange = exchange if exchange is not None else TorchExchange(group,
                                                                                      p2p_group)
        self.ranks = self.exchange.ranks(world_size)
        self.traffic = TrafficStats()
        self.faults = faults
        self.live = self.ranks  # the members whose contributions count (see quorum())
        self.joining = ()  # ranks back from a failure, healed at the end of this sync
        self._state, self._healing = [], []  # recovery: tensors, the leader's sends
        self._incoming = self._incoming_handle = None  # a joining rank's receive
        self._pending: set[Handle] = set()
        # gloo exchanges host memory: a tensor on a GPU travels through a host copy (ranks
        # may share one GPU, which NCCL refuses); NCCL exchanges GPU memory directly.
        self._staged = self.exchange.exchanges_host_memory(world_size)
        self._p2p_staged = self.exchange.exchanges_host_memory(world_size, p2p=True)
        self.remote = RemoteCalls(self)  # calls through exoframe.distributed

    # -- collectives ---------------------------------------------------------------------
    # Every operation takes `wire_bytes`: the payload as it would travel encoded (a
    # compressed or low-bit exchange simulated with full-precision tensors); the network
    # model and the byte counts use it. Default: the tensor's own size.

    def all_reduce(self, tensor: torch.Tensor, op: str = "sum", async_op: bool = False,
                   wire_bytes: int | None = None):
        """In place. op: sum, mean, max or min."""
        reduce_op = _reduce_op(op)
        self._mask(tensor, op)
        host = self._host(tensor)
        members = len(self.live)
        finish = (lambda: tensor.div_(members)) if op == "mean" else None
        return self._submit("all_reduce", _wire(tensor, wire_bytes), async_op, tensor,
                            _back(host, tensor, finish),
                            lambda: self.exchange.all_reduce(host, reduce_op))

    def broadcast(self, tensor: torch.Tensor, src: int, async_op: bool = False,
                  wire_bytes: int | None = None):
        if src not in self.live:
            raise ExoframeError(f"broadcast from rank {src}, which is down (simulated "
                                "failure): broadcast from a live rank, e.g. comm.leader.")
        host = self._host(tensor)
        return self._submit("broadcast", _wire(tensor, wire_bytes), async_op, tensor,
                            _back(host, tensor),
                            lambda: self.exchange.broadcast(host, src),
                            root=self.ranks.index(src))

    def all_gather(self, output: torch.Tensor, input: torch.Tensor, async_op: bool = False,
                   wire_bytes: int | None = None):
        """output (world_size * input.numel(), flat) receives every rank's input, in rank
        order. wire_bytes: of the whole gathered output."""
        _check_numel(output, input.numel() * self.world_size, "all_gather output")
        self._check_everyone("all_gather")
        host_out, host_in = self._host(output), self._host(input)
        return self._submit("all_gather", _wire(output, wire_bytes), async_op, output,
                            _back(host_out, output),
                            lambda: self.exchange.all_gather(host_out, host_in))

    def reduce_scatter(self, output: torch.Tensor, input: torch.Tensor, op: str = "sum",
                       async_op: bool = False, wire_bytes: int | None = None):
        """output receives this rank's 1/world_size chunk of the reduction of every input.
        wire_bytes: of the whole input."""
        _check_numel(output, input.numel() // self.world_size, "reduce_scatter output")
        self._check_everyone("reduce_scatter")
        reduce_op = _reduce_op(op)
        host_out, host_in = self._host(output), self._host(input)
        finish = (lambda: output.div_(self.world_size)) if op == "mean" else None
        return self._submit(
            "reduce_scatter", _wire(input, wire_bytes), async_op, output,
            _back(host_out, output, finish),
            lambda: self.exchange.reduce_scatter(host_out, host_in, reduce_op))

    # -- point to point ------------------------------------------------------------------
    def send(self, tensor: torch.Tensor, dst: int, async_op: bool = False,
             wire_bytes: int | None = None):
        host = self._host(tensor, self._p2p_staged)
        return self._submit("send", _wire(tensor, wire_bytes), async_op, None, None,
                            lambda: self.exchange.send(host, dst),
                            peers=(self.rank, dst))

    def recv(self, tensor: torch.Tensor, src: int, async_op: bool = False,
             wire_bytes: int | None = None):
        host = self._host(tensor, self._p2p_staged)
        return self._submit("recv", _wire(tensor, wire_bytes), async_op, tensor,
                            _back(host, tensor), lambda: self.exchange.recv(host, src),
                            peers=(src, self.rank))

    # -- groups of ranks -----------------------------------------------------------------
    def sites(self) -> tuple[tuple[int, ...], ...]:
        """The ranks of each site of the network (its YAML's `sites:`), in site order; one
        group of every rank on a network without sites."""
        topology = getattr(getattr(self.clock, "plans", None), "topology", None)
        if topology is None:
            return (self.ranks,)
        groups: dict[int, list[int]] = {}
        for rank in self.ranks:
            groups.setdefault(topology.site_of[rank], []).append(rank)
        return tuple(tuple(groups[site]) for site in sorted(groups))

    def all_reduce_among(self, tensor: torch.Tensor, ranks, op: str = "mean",
                         wire_bytes: int | None = None) -> torch.Tensor:
        """Blocking, in place: the sum or mean of `tensor` over `ranks` only (this rank one
        of them), e.g. one site's. The network model sees one all_reduce among `ranks`; the
        real exchange is point to point: each member sends its tensor to the others and adds
        every member's in rank order, so that all get the same bits. Not under simulated
        failures (whose quorums are of every rank)."""
        ranks = tuple(sorted(ranks))
        if op not in ("sum", "mean") or self.rank not in ranks:
            raise ValueError(f"all_reduce_among: op sum or mean among ranks holding rank "
                             f"{self.rank}, got op {op!r}, ranks {ranks}")
        if self.faults is not None:
            raise ExoframeError("an all-reduce among some ranks does not run under simulated "
                                "failures; run this strategy without --faults.")
        host = self._host(tensor, self._p2p_staged)
        received = {r: torch.empty_like(host) for r in ranks if r != self.rank}

        def start():
            return _AllOf([*(self.exchange.send(host, r) for r in received),
                           *(self.exchange.recv(buffer, r) for r, buffer in received.items())])

        def finish():
            total = sum(received.get(r, host) for r in ranks)
            with torch.no_grad():
                tensor.copy_(total / len(ranks) if op == "mean" else total)
        return self._submit("all_reduce", _wire(tensor, wire_bytes), False, tensor, finish,
                            start, peers=ranks)

    # -- membership under simulated failures -------------------------------------------------
    @property
    def leader(self) -> int:
        """The lowest live rank (rank 0 without failures)."""
        return self.live[0]

    def quorum(self, recovery_tensors=None):
        """Start of a synchronization (Strategy.sync()): wait for the state this rank sent
        at the last one, agree on who takes part, and post a joining rank's receive of the
        state. recovery_tensors(): the tensors a joining rank takes from the leader; the
        list is fixed here, on every rank, their values sent once the synchronization is
        done (heal)."""
        if self.faults is None:
            return
        for handle in self._healing:
            handle.wait()
        self._healing = []
        if self._pending:
            raise ExoframeError(f"rank {self.rank} has {len(self._pending)} exchange(s) in flight "
                                "at a synchronization: under faults every exchange must be "
                                "waited for before the next Strategy.sync().")
        reply = self.faults.quorum(self.clock)
        self.live, self.joining = reply.live, reply.joining
        self._state = list(recovery_tensors()) if self.joining and recovery_tensors else []
        if self.rank in self.joining:
            host = self._incoming = torch.empty(
                sum(t.numel() * t.element_size() for t in self._state), dtype=torch.uint8)
            self._incoming_handle = self._submit(
                "recv", host.numel(), True, host, None,
                lambda: self.exchange.recv(host, self.leader),
                peers=(self.leader, self.rank), recovery=True)

    def heal(self):
        """End of a synchronization: the leader sends the state (its values now) to every
        joining rank, without waiting; a joining rank waits for it and takes it in place."""
        if self.faults is None:
            return
        joining, self.joining = self.joining, ()
        self.faults.synced(self.clock)
        if not joining:
            return
        source = self.leader
        self.live = tuple(sorted((*self.live, *joining)))
        state, self._state = self._state, []
        if self.rank == source:
            flat = flatten_bytes([t.detach().cpu() for t in state])
            self._healing = [self.send(flat, rank, async_op=True) for rank in joining]
        elif self.rank in joining:
            comm_before = self.clock.comm_seconds
            self._incoming_handle.wait()
            unflatten_bytes_into(self._incoming, state)
            self.faults.back(self.clock, source, self._incoming.numel(),
                             self.clock.comm_seconds - comm_before)
            self._incoming = self._incoming_handle = None

    def _mask(self, tensor: torch.Tensor, op: str):
        """A down rank's contribution to a reduction: its neutral element."""
        if self.rank not in self.live:
            neutral = _NEUTRAL[op]
            if not tensor.is_floating_point() and neutral:
                info = torch.iinfo(tensor.dtype)
                neutral = info.min if neutral < 0 else info.max
            with torch.no_grad():
                tensor.fill_(neutral)

    def _check_everyone(self, kind: str):
        if len(self.live) < self.world_size:
            raise ExoframeError(f"{kind} while ranks {sorted(set(self.ranks) - set(self.live))} "
                                "are down (simulated failure): under faults a strategy "
                                "exchanges with all_reduce, broadcast, send and recv.")

    def in_flight(self) -> int:
        """Operations started and not yet waited for, but for the leader's sends of the
        state to joining ranks: they have it already (heal), so a checkpoint keeps only the
        sends' ids (healing_state) for the leader to wait for at its next sync."""
        return len(self._pending - set(self._healing))

    def healing_state(self) -> list[int]:
        return [handle._op_id for handle in self._healing]

    def load_healing_state(self, op_ids: list[int]):
        """The leader's recovery sends a checkpoint kept: waited for in simulated time only
        (the real transfer was done before it)."""
        self._healing = [Handle(self, op_id, None) for op_id in op_ids]
        self._pending.update(self._healing)

    def wait_all(self):
        """Wait for every operation still in flight (the end of training)."""
        for handle in sorted(self._pending, key=lambda h: h._op_id):
            handle.wait()

    def _host(self, tensor: torch.Tensor, staged: bool | None = None) -> torch.Tensor:
        """The tensor an exchange uses: a host copy of a GPU tensor where the group
        exchanges host memory (gloo), else the tensor itself."""
        staged = self._staged if staged is None else staged
        if not staged or tensor.device.type == "cpu":
            return tensor
        return tensor.detach().to("cpu")

    # -- the choke point -----------------------------------------------------------------
    def _submit(self, kind, nbytes, async_op, result, finish, start, root=0, peers=None,
                recovery=False):
        """recovery: a joining rank's receive of the state (quorum), the one exchange with
        a rank not yet live."""
        if peers is not None and not recovery and not set(peers) <= set(self.live):
            raise ExoframeError(f"{kind} between ranks {peers[0]} and {peers[1]}, one of which "
                                "is down (simulated failure).")
        real = peers if peers is not None else self.ranks
        work = start() if len(real) > 1 else None
        participants = peers if peers is not None else self.live
        if self.rank not in participants:  # down: in the real exchange, not the simulated one
            handle = Handle(self, None, work, result, finish)
            handle._complete()
            return handle if async_op else result
        submitted = self.clock.submit(kind, nbytes, participants, root, blocking=not async_op,
                                      work=work)
        self.traffic.add(kind, submitted.bytes_sent, submitted.bytes_received)
        handle = Handle(self, submitted.op_id, work, result, finish)
        if async_op:
            self._pending.add(handle)
            return handle
        handle._complete()  # the clock has already waited for it
        return result


class _AllOf:
    """Several real exchanges waited for as one."""

    def __init__(self, works):
        self.works = works

    def wait(self):
        for work in self.works:
            work.wait()

    def is_completed(self) -> bool:
        return all(work.is_completed() for work in self.works)


def _back(host: torch.Tensor, tensor: torch.Tensor, then=None):
    """What completes an operation whose result landed in `host`: copy it into `tensor`
    (when they differ), then `then()`."""
    if host is tensor:
        return then

    def finish():
        with torch.no_grad():
            tensor.copy_(host)
        if then is not None:
            then()
    return finish


def _reduce_op(op: str):
    try:
        return _REDUCE_OPS[op]
    except KeyError:
        raise ValueError(f"unknown reduce op '{op}'; use one of {', '.join(_REDUCE_OPS)}") from None


def _wire(tensor: torch.Tensor, wire_bytes: int | None) -> int:
    if wire_bytes is None:
        return tensor.numel() * tensor.element_size()
    if wire_bytes < 0:
        raise ValueError(f"wire_bytes must be non-negative, got {wire_bytes}")
    return int(wire_bytes)


def _check_numel(tensor, expected, what):
    if tensor.numel() != expected:
        raise ValueError(f"{what} must have {expected} elements, got {tensor.numel()}")
