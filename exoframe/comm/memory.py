"""Exchanges among nodes packed into worker processes (engine/node/packing.py), without
torch.distributed: between nodes of one process in memory (on their device: a GPU's nodes
fold on the GPU), between processes as raw bytes over the pipes the launcher made between
every pair of workers.

Every exchange has a key that every node names alike: ("c", n) for a node's n-th collective
(every node makes the same collectives in the same order; the simulator checks it),
("p", src, dst, n) for the n-th transfer from src to dst. A process gathers the parts of an
exchange that it needs and computes the result once for its nodes.

A reduction adds the parts in rank order: rank 0's, then rank 1's, ... Workers hold
consecutive ranks, so they fold in a chain: worker 0 folds its nodes' parts and sends the
partial result to worker 1, which goes on with its own, and so on; the last worker sends the
result to all. Every packing thus makes the same additions in the same order, and gives the
same bits (gloo's ring adds in another order), with one tensor-sized message per worker.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Contribution:
    """Parts of exchange `key` sent to another worker process: (rank, raw bytes) each."""
    key: tuple
    parts: tuple


@dataclass(frozen=True)
class Folded:
    """A reduction folded in rank order through some rank, for the next worker (total:
    through the last rank, the result, from the last worker to every other)."""
    key: tuple
    data: bytes
    total: bool


def to_bytes(tensor: torch.Tensor) -> bytes:
    """A tensor's raw bytes (from a GPU through a host copy: they go to another worker)."""
    flat = tensor.detach().contiguous().reshape(-1)
    return flat.view(torch.uint8).cpu().numpy().tobytes() if flat.numel() else b""


def from_bytes(data: bytes, like: torch.Tensor) -> torch.Tensor:
    """Bytes from another worker as a tensor like `like`, on its device."""
    if not data:
        return torch.empty_like(like)
    host = torch.frombuffer(bytearray(data), dtype=torch.uint8).view(like.dtype)
    return host.view(like.shape).to(like.device)


_COMBINE = {"sum": torch.Tensor.add_, "max": lambda a, b: torch.maximum(a, b, out=a),
            "min": lambda a, b: torch.minimum(a, b, out=a)}


@torch.no_grad()  # (a part may require grad: a reduction records nothing, as gloo's)
def fold(total: torch.Tensor | None, parts, op: str) -> torch.Tensor:
    """Combine `parts` into `total` one after another (None: start from the first part)."""
    combine = _COMBINE[op]
    parts = iter(parts)
    if total is None:
        total = next(parts).detach().clone(memory_format=torch.contiguous_format)
    for part in parts:
        combine(total, part)
    return total


class Gather:
    """The parts of one exchange that reached this process, and its result once computed."""

    def __init__(self, consumers: int):
        self.parts: dict = {}  # rank -> tensor (a local node's) or bytes (another process's)
        self.result = None
        self.consumers = consumers  # local nodes still to take the result
        self.op = self.like = None  # a reduction's, once a local node has contributed
        self.folded = None  # a reduction: the previous worker's Folded data

    def part(self, rank: int, like: torch.Tensor) -> torch.Tensor:
        part = self.parts[rank]
        return part if isinstance(part, torch.Tensor) else from_bytes(part, like)


class Pack:
    """The exchanges of one worker process's nodes.

    home[rank]: the index of the process that holds it (consecutive ranks per process, in
    process order); post(process, message): send to another process (the hub's outbox);
    block(ready): let the process's other nodes run until ready() holds; off_clock(): a
    context whose time is not the current node's compute."""

    def __init__(self, home: list, index: int, post, block, off_clock):
        if list(home) != sorted(home):
            raise ValueError("workers must hold consecutive ranks, in order")
        self.home, self.index, self.post, self.block = home, index, post, block
        self.off_clock = off_clock
        self.local = [r for r, p in enumerate(home) if p == index]
        self.others = sorted(set(home) - {index})
        self.last = index == max(home)
        self.gathers: dict[tuple, Gather] = {}

    def gather(self, key: tuple) -> Gather:
        found = self.gathers.get(key)
        if found is None:
            found = self.gathers[key] = Gather(len(self.local) if key[0] == "c" else 1)
        return found

    def contribute(self, key: tuple, rank: int, tensor: torch.Tensor, to):
        """Rank's part of exchange `key`, kept here (a local reference: its node waits for
        the result before touching it) and sent to the processes `to`."""
        self.gather(key).parts[rank] = tensor
        if to:
            self.send_part(to, key, rank, tensor)

    def send_part(self, to, key: tuple, rank: int, tensor: torch.Tensor):
        """Send rank's part of exchange `key` to the processes `to` (and keep it not)."""
        with self.off_clock():
            message = Contribution(key, ((rank, to_bytes(tensor)),))
        for process in to:
            self.post(process, message)

    def reduce(self, key: tuple, rank: int, tensor: torch.Tensor, op: str):
        """Rank's part of a reduction: folded once every local part is here and the
        previous worker's fold has come."""
        gather = self.gather(key)
        gather.parts[rank], gather.op, gather.like = tensor, op, tensor
        with self.off_clock():
            self._fold_if_ready(key, gather)

    def receive(self, message: Contribution | Folded):
        gather = self.gather(message.key)
        if isinstance(message, Contribution):
            for rank, data in message.parts:
                gather.parts[rank] = data
        elif message.total:
            gather.result = message.data
        else:
            gather.folded = message.data
            self._fold_if_ready(message.key, gather)

    def _fold_if_ready(self, key: tuple, gather: Gather):
        if len(gather.parts) < len(self.local) or (self.index > 0 and gather.folded is None):
            return
        start = None if self.index == 0 else from_bytes(gather.folded, gather.like)
        total = fold(start, (gather.parts[r] for r in self.local), gather.op)
        gather.parts.clear()
        gather.folded = None
        if self.last:
            gather.result = total
            if self.others:  # (a lone worker's result stays on its device)
                message = Folded(key, to_bytes(total), total=True)
                for process in self.others:
                    self.post(process, message)
        else:
            self.post(self.index + 1, Folded(key, to_bytes(total), total=False))

    def held_tensors(self):
        """The local tensors this process's exchanges still hold (a node's part, kept by
        reference until every node has taken the result)."""
        for gather in self.gathers.values():
            yield from (p for p in gather.parts.values() if isinstance(p, torch.Tensor))
            if gather.like is not None:
                yield gather.like

    def take(self, key: tuple, ready, compute):
        """Wait until ready(gather) holds; the result, computed once by compute(gather)
        (outside the node's compute), for one local node."""
        gather = self.gather(key)
        self.block(lambda: ready(gather))
        with self.off_clock(), torch.no_grad():
            if gather.result is None:
                gather.result = compute(gather)
            elif isinstance(gather.result, bytes):  # a reduction's, from the last worker
                gather.result = from_bytes(gather.result, gather.like)
        gather.consumers -= 1
        if gather.consumers == 0:
            del self.gathers[key]
        return gather.result


class MemoryWork:
    """A started exchange: wait() waits for its parts and puts the result in place."""

    def __init__(self, wait=None):
        self._wait, self._done = wait, wait is None

    def wait(self):
        if not self._done:
            self._done = True
            self._wait()
        return True

    def is_completed(self) -> bool:
        return self._done


def _has_every_part(world_size: int):
    return lambda gather: len(gather.parts) == world_size


def _has_part_of(rank: int):
    return lambda gather: rank in gather.parts


def _has_result(gather: Gather) -> bool:
    return gather.result is not None


class MemoryExchange:
    """One node's exchanges (an Exchange, comm/exchange.py) through its process's Pack."""

    def __init__(self, rank: int, pack: Pack):
        self.rank, self.pack = rank, pack
        self.world = tuple(range(len(pack.home)))
        self._collectives = 0
        self._transfers: dict[tuple, int] = {}

    def ranks(self, world_size: int) -> tuple:
        return self.world

    def exchanges_host_memory(self, world_size: int, p2p: bool = False) -> bool:
        """No: a worker's nodes exchange their tensors where they are (on their GPU); bytes
        leave the device only between workers (to_bytes)."""
        return False

    def token_device(self) -> str:
        return "cpu"

    def _next_collective(self) -> tuple:
        self._collectives += 1
        return ("c", self._collectives - 1)

    def _copy_into(self, tensor: torch.Tensor, value: torch.Tensor):
        with self.pack.off_clock(), torch.no_grad():
            tensor.copy_(value.view(tensor.shape))

    def _reduction(self, tensor: torch.Tensor, op: str) -> tuple:
        key = self._next_collective()
        self.pack.reduce(key, self.rank, tensor, op)
        return key

    def all_reduce(self, tensor: torch.Tensor, op: str):
        key = self._reduction(tensor, op)
        return MemoryWork(lambda: self._copy_into(
            tensor, self.pack.take(key, _has_result, None)))

    def reduce_scatter(self, output: torch.Tensor, input: torch.Tensor, op: str):
        key = self._reduction(input, op)

        def wait():
            total, chunk = self.pack.take(key, _has_result, None), output.numel()
            self._copy_into(output, total.reshape(-1)[self.rank * chunk:(self.rank + 1) * chunk])
        return MemoryWork(wait)

    def broadcast(self, tensor: torch.Tensor, src: int):
        key = self._next_collective()
        if self.rank == src:
            self.pack.contribute(key, src, tensor, self.pack.others)

        def wait():
            # (a copy: the source may change its tensor once its own wait returns)
            value = self.pack.take(key, _has_part_of(src),
                                   lambda g: g.part(src, tensor).detach().clone())
            if self.rank != src:
                self._copy_into(tensor, value)
        return MemoryWork(wait)

    def all_gather(self, output: torch.Tensor, input: torch.Tensor):
        key = self._next_collective()
        self.pack.contribute(key, self.rank, input, self.pack.others)
        return MemoryWork(lambda: self._copy_into(output, self.pack.take(
            key, _has_every_part(len(self.world)),
            lambda g: torch.cat([g.part(r, input).reshape(-1) for r in self.world]))))

    def _transfer_key(self, src: int, dst: int) -> tuple:
        count = self._transfers.get((src, dst), 0)
        self._transfers[(src, dst)] = count + 1
        return ("p", src, dst, count)

    def send(self, tensor: torch.Tensor, dst: int):
        """Done at once: the part is copied (the sender may reuse its tensor)."""
        key = self._transfer_key(self.rank, dst)
        home = self.pack.home[dst]
        if home == self.pack.index:
            with self.pack.off_clock():
                copy = tensor.detach().clone(memory_format=torch.contiguous_format)
            self.pack.contribute(key, self.rank, copy, ())
        else:
            self.pack.send_part((home,), key, self.rank, tensor)
        return MemoryWork()

    def recv(self, tensor: torch.Tensor, src: int):
        key = self._transfer_key(src, self.rank)
        return MemoryWork(lambda: self._copy_into(
            tensor, self.pack.take(key, _has_part_of(src), lambda g: g.part(src, tensor))))
