"""Exchanges among nodes packed into worker processes (engine/packing.py), without
torch.distributed: between nodes of one process in memory, between processes as raw bytes
over the pipes the launcher made between every pair of workers.

Every exchange has a key that every node names alike: ("c", n) for a node's n-th collective
(every node makes the same collectives in the same order; the simulator checks it),
("p", src, dst, n) for the n-th transfer from src to dst. Each process gathers the parts of
an exchange (one per rank that contributes) and computes its result once, from every part,
in rank order: a reduction adds rank 0's part, then rank 1's, ..., so the result does not
depend on how the nodes are packed into processes (gloo's ring adds in another order).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Contribution:
    """Parts of exchange `key` sent to another worker process: (rank, raw bytes) each."""
    key: tuple
    parts: tuple


def to_bytes(tensor: torch.Tensor) -> bytes:
    flat = tensor.detach().contiguous().reshape(-1)
    return flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b""


def from_bytes(data: bytes, like: torch.Tensor) -> torch.Tensor:
    if not data:
        return torch.empty_like(like)
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).view(like.dtype).view(like.shape)


class Gather:
    """The parts of one exchange that reached this process, and its result once computed."""

    def __init__(self, consumers: int):
        self.parts: dict = {}  # rank -> tensor (a local node's) or bytes (another process's)
        self.result = None
        self.consumers = consumers  # local nodes still to take the result

    def has(self, needed: int | None, world_size: int) -> bool:
        """needed: the one rank whose part is needed (None: every rank's)."""
        return len(self.parts) == world_size if needed is None else needed in self.parts

    def part(self, rank: int, like: torch.Tensor) -> torch.Tensor:
        part = self.parts[rank]
        return part if isinstance(part, torch.Tensor) else from_bytes(part, like)


class Pack:
    """The exchanges of one worker process's nodes.

    home[rank]: the index of the process that holds it; post(process, Contribution): send
    to another process (the hub's outbox); block(ready): let the process's other nodes run
    until ready() holds."""

    def __init__(self, home: list, index: int, post, block):
        self.home, self.index, self.post, self.block = home, index, post, block
        self.local = [r for r, p in enumerate(home) if p == index]
        self.others = sorted(set(home) - {index})
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
            message = Contribution(key, ((rank, to_bytes(tensor)),))
            for process in to:
                self.post(process, message)

    def receive(self, message: Contribution):
        gather = self.gather(message.key)
        for rank, data in message.parts:
            gather.parts[rank] = data

    def take(self, key: tuple, needed: int | None, compute):
        """Wait until the part of rank `needed` (None: of every rank) is here; the result,
        computed once by compute(gather), for one local node."""
        gather, world_size = self.gather(key), len(self.home)
        self.block(lambda: gather.has(needed, world_size))
        if gather.result is None:
            gather.result = compute(gather)
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


_COMBINE = {"sum": torch.Tensor.add_, "max": lambda a, b: torch.maximum(a, b, out=a),
            "min": lambda a, b: torch.minimum(a, b, out=a)}


def reduce_in_rank_order(gather: Gather, ranks, like: torch.Tensor, op: str) -> torch.Tensor:
    combine = _COMBINE[op]
    total = gather.part(ranks[0], like).clone()
    for rank in ranks[1:]:
        combine(total, gather.part(rank, like))
    return total


class MemoryExchange:
    """One node's exchanges (comm/exchange.py's interface) through its process's Pack."""

    def __init__(self, rank: int, pack: Pack):
        self.rank, self.pack = rank, pack
        self.world = tuple(range(len(pack.home)))
        self._collectives = 0
        self._transfers: dict[tuple, int] = {}

    def ranks(self, world_size: int) -> tuple:
        return self.world

    def exchanges_host_memory(self, world_size: int, p2p: bool = False) -> bool:
        return True

    def _collective(self, tensor: torch.Tensor, contributes: bool = True) -> tuple:
        key = ("c", self._collectives)
        self._collectives += 1
        if contributes:
            self.pack.contribute(key, self.rank, tensor, self.pack.others)
        return key

    def all_reduce(self, tensor: torch.Tensor, op: str):
        key = self._collective(tensor)

        def wait():
            total = self.pack.take(key, None,
                                   lambda g: reduce_in_rank_order(g, self.world, tensor, op))
            with torch.no_grad():
                tensor.copy_(total)
        return MemoryWork(wait)

    def broadcast(self, tensor: torch.Tensor, src: int):
        key = self._collective(tensor, contributes=self.rank == src)

        def wait():
            value = self.pack.take(key, src, lambda g: g.part(src, tensor))
            if self.rank != src:
                with torch.no_grad():
                    tensor.copy_(value)
        return MemoryWork(wait)

    def all_gather(self, output: torch.Tensor, input: torch.Tensor):
        key = self._collective(input)

        def wait():
            gathered = self.pack.take(key, None, lambda g: torch.cat(
                [g.part(r, input).reshape(-1) for r in self.world]))
            with torch.no_grad():
                output.copy_(gathered.view(output.shape))
        return MemoryWork(wait)

    def reduce_scatter(self, output: torch.Tensor, input: torch.Tensor, op: str):
        key = self._collective(input)

        def wait():
            total = self.pack.take(key, None,
                                   lambda g: reduce_in_rank_order(g, self.world, input, op))
            chunk = output.numel()
            with torch.no_grad():
                output.copy_(total.reshape(-1)[self.rank * chunk:(self.rank + 1) * chunk]
                             .view(output.shape))
        return MemoryWork(wait)

    def _transfer_key(self, src: int, dst: int) -> tuple:
        count = self._transfers.get((src, dst), 0)
        self._transfers[(src, dst)] = count + 1
        return ("p", src, dst, count)

    def send(self, tensor: torch.Tensor, dst: int):
        """Done at once: the part is copied (the sender may reuse its tensor)."""
        key = self._transfer_key(self.rank, dst)
        home = self.pack.home[dst]
        if home == self.pack.index:
            self.pack.contribute(key, self.rank, tensor.detach().clone(), ())
        else:
            self.pack.post(home, Contribution(key, ((self.rank, to_bytes(tensor)),)))
        return MemoryWork()

    def recv(self, tensor: torch.Tensor, src: int):
        key = self._transfer_key(src, self.rank)

        def wait():
            value = self.pack.take(key, src, lambda g: g.part(src, tensor))
            with torch.no_grad():
                tensor.copy_(value)
        return MemoryWork(wait)
