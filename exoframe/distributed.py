"""Remote calls through the simulated network, with the names a TorchOpt user knows.

    import exoframe.distributed as todist

    @todist.parallelize(partitioner=todist.batch_partitioner, reducer=todist.mean_reducer)
    def loss_on(x, y):  # runs on every rank, each on its share of the batch
        return loss_fn(MODEL(x), y)

World info (`get_world_info`, `get_rank`, `get_world_size`, `get_local_rank`), rank
decorators (`rank_zero_only`, `on_rank`, `not_on_rank`), calls (`remote_async_call`,
`remote_sync_call`, `parallelize`, `parallelize_async`), partitioners (`dim_partitioner`,
`batch_partitioner`, `exclusive_batch_partitioner`) and reducers (`mean_reducer`,
`sum_reducer`) behave as torchopt.distributed's do. Each simulated node is its own machine:
its local rank is 0 of 1. Decorators read the rank when the function is called (ranks are
forked from one process, so a rank read at import would be the launcher's).

A call's function runs on the target rank for real; its request and result travel through
the simulated network and count in the rank's bytes (traffic kinds `remote`, the tensors'
bytes, and `remote_envelope`, the pickled rest). When ranks serve calls, and why they
cannot deadlock, is in exoframe/comm/remote.py; in short: while they wait in this module
(`Future.wait()`, `barrier()`, `serve()`), and, for a strategy whose traits declare
`remote_calls=True`, at each step end and after the last step. A strategy that makes
remote calls must declare it. A served function that cannot answer yet raises `NotYet` and is
run again after the next call that rank serves. `compute(seconds)` charges a served function's simulated compute
where the compute model does not measure it (`fixed`, `flops`).
"""
from __future__ import annotations

import functools
import sys
from typing import Any, Callable, Iterable, NamedTuple, Sequence

import torch

from .comm.remote import NotYet, RemoteCallError, RemoteCalls, Reply
from .errors import ExoframeError

__all__ = ["WorldInfo", "get_world_info", "get_world_rank", "get_rank", "get_world_size",
           "get_local_rank", "get_local_world_size", "get_worker_id", "on_rank",
           "not_on_rank", "rank_all", "rank_zero_only", "rank_non_zero_only",
           "TensorDimensionPartitioner", "dim_partitioner", "batch_partitioner",
           "exclusive_batch_partitioner", "mean_reducer", "sum_reducer", "Future",
           "remote_async_call", "remote_sync_call", "parallelize", "parallelize_async",
           "parallelize_sync", "barrier", "serve", "compute", "NotYet", "RemoteCallError"]

_comm = None  # this rank's Communicator: the engine binds it when the rank starts


def bind(comm) -> None:
    """Make `comm` this process's rank (the engine does, for each rank; engine/node/packing.py
    for each node as it resumes)."""
    global _comm
    _comm = comm


def current():
    """The Communicator bound by bind(), or None."""
    return _comm


# -- world info --------------------------------------------------------------------------------
class WorldInfo(NamedTuple):
    world_rank: int
    world_size: int
    local_rank: int
    local_world_size: int

    @property
    def rank(self) -> int:
        return self.world_rank

    @property
    def worker_name(self) -> str:
        return f"worker{self.world_rank}"


def get_world_info() -> WorldInfo:
    """This rank's place in the run (rank 0 of 1 outside a run)."""
    if _comm is None:
        return WorldInfo(0, 1, 0, 1)
    return WorldInfo(_comm.rank, _comm.world_size, 0, 1)


def get_world_rank() -> int:
    return get_world_info().world_rank


get_rank = get_world_rank


def get_world_size() -> int:
    return get_world_info().world_size


def get_local_rank() -> int:
    return get_world_info().local_rank


def get_local_world_size() -> int:
    return get_world_info().local_world_size


def get_worker_id(id: int | str | None = None) -> int:
    """A rank from a rank or a worker name ("worker3"); None: this rank."""
    if id is None:
        return get_world_rank()
    if isinstance(id, str) and id.startswith("worker") and id[6:].isdigit():
        return int(id[6:])
    if isinstance(id, int) and not isinstance(id, bool):
        return id
    raise ExoframeError(f"unknown worker {id!r}: give a rank or a name like 'worker0'.")


# -- rank decorators ---------------------------------------------------------------------------
def _on_ranks(ranks: Iterable[int], inverse: bool):
    ranks = frozenset(ranks)

    def wrapper(func):
        @functools.wraps(func)
        def wrapped(*args, **kwargs):
            if (get_world_rank() in ranks) != inverse:
                return func(*args, **kwargs)
            return None
        return wrapped
    return wrapper


def on_rank(*ranks: int):
    """Run the decorated function only on these ranks (elsewhere it returns None)."""
    return _on_ranks(ranks, inverse=False)


def not_on_rank(*ranks: int):
    """Run the decorated function on every rank but these."""
    return _on_ranks(ranks, inverse=True)


def rank_all(func):
    return func


def rank_zero_only(func):
    return on_rank(0)(func)


def rank_non_zero_only(func):
    return not_on_rank(0)(func)


# -- partitioners and reducers ------------------------------------------------------------------
Partition = tuple[int, tuple, dict]


class TensorDimensionPartitioner:
    """Splits every tensor argument along `dim` among workers; other arguments go whole
    to every part. exclusive: one part per element of the dimension (else at most one part
    per worker, the last taking the remainder); keepdim=False (with exclusive) selects
    instead of slicing. workers: the ranks to use (default: all)."""

    def __init__(self, dim: int, *, exclusive: bool = False, keepdim: bool = False,
                 workers: Sequence[int | str] | None = None):
        if not keepdim and not exclusive:
            raise ValueError("keepdim=False needs exclusive=True")
        self.dim, self.exclusive, self.keepdim, self.workers = dim, exclusive, keepdim, workers

    def __call__(self, *args, **kwargs) -> list[Partition]:
        workers = list(range(get_world_size())) if self.workers is None else \
            [get_worker_id(w) for w in self.workers]
        sizes = {t.shape[self.dim] for t in _tensors((args, kwargs))}
        if not sizes:
            return [(get_world_rank(), args, dict(kwargs))]
        if len(sizes) > 1:
            raise ValueError(f"tensors of different sizes along dim {self.dim}: "
                             f"{sorted(sizes)}; a partitioner splits them all alike")
        size = sizes.pop()
        if self.exclusive:
            pieces = [slice(i, i + 1) if self.keepdim else i for i in range(size)]
        elif size <= len(workers):
            pieces = [slice(i, i + 1) for i in range(size)]
        else:
            step = size // len(workers)
            ends = [i * step for i in range(len(workers))] + [size]
            pieces = [slice(a, b) for a, b in zip(ends, ends[1:])]
        index = (slice(None),) * self.dim if self.dim >= 0 else (Ellipsis,)
        tail = () if self.dim >= 0 else (slice(None),) * (-self.dim - 1)
        parts = []
        for i, piece in enumerate(pieces):
            part_args, part_kwargs = _map_tensors((args, kwargs),
                                                  lambda t: t[(*index, piece, *tail)])
            parts.append((workers[i % len(workers)], part_args, part_kwargs))
        return parts


def dim_partitioner(dim: int = 0, *, exclusive: bool = False, keepdim: bool = True,
                    workers: Sequence[int | str] | None = None) -> TensorDimensionPartitioner:
    return TensorDimensionPartitioner(dim, exclusive=exclusive, keepdim=keepdim,
                                      workers=workers)


batch_partitioner = dim_partitioner(dim=0, keepdim=True, exclusive=False)
exclusive_batch_partitioner = dim_partitioner(dim=0, keepdim=True, exclusive=True)


def mean_reducer(results: Iterable[torch.Tensor]) -> torch.Tensor:
    return torch.mean(torch.stack(tuple(results), dim=0), dim=0)


def sum_reducer(results: Iterable[torch.Tensor]) -> torch.Tensor:
    return torch.sum(torch.stack(tuple(results), dim=0), dim=0)


def _tensors(tree) -> list[torch.Tensor]:
    found = []
    _map_tensors(tree, lambda t: found.append(t) or t)
    return found


def _map_tensors(tree, fn):
    if isinstance(tree, torch.Tensor):
        return fn(tree)
    if isinstance(tree, (tuple, list)):
        return type(tree)(_map_tensors(x, fn) for x in tree)
    if isinstance(tree, dict):
        return {k: _map_tensors(v, fn) for k, v in tree.items()}
    return tree


# -- calls ---------------------------------------------------------------------------------
class Future:
    """Calls in flight; `wait()` returns their results in partition order, or the reducer's
    value of them. While it waits, this rank serves the calls that reach it."""

    def __init__(self, replies: list[Reply], reducer: Callable | None):
        self.replies, self.reducer = replies, reducer
        self._value, self._done = None, False

    def wait(self) -> Any:
        if not self._done:
            pending = [r for r in self.replies if r.result is None]
            if pending:
                for reply, result in zip(pending, pending[0].calls.collect(
                        [r.key for r in pending])):
                    reply.result = result
            values = [reply.value() for reply in self.replies]
            self._value = values if self.reducer is None else self.reducer(values)
            self._done = True
        return self._value

    def done(self) -> bool:
        """Whether every result is in (this rank's mail is read only while it waits in
        exoframe.distributed: poll with serve(), once per step)."""
        return self._done or self.replies[0].calls.arrived(
            [r.key for r in self.replies if r.result is None])


def remote_async_call(func: Callable, *, args: tuple | None = None, kwargs: dict | None = None,
                      partitioner=None, reducer: Callable | None = None) -> Future:
    """Run func on the ranks the partitioner names (default: batch_partitioner; a rank or
    worker name: that one rank), each with its part of the arguments."""
    args, kwargs = tuple(args or ()), dict(kwargs or {})
    partitioner = batch_partitioner if partitioner is None else partitioner
    if isinstance(partitioner, (int, str)):
        parts = [(get_worker_id(partitioner), args, kwargs)]
    elif callable(partitioner):
        parts = partitioner(*args, **kwargs)
    else:
        raise ExoframeError(f"invalid partitioner {partitioner!r}: give a rank, a worker "
                            "name or a function returning (rank, args, kwargs) parts.")
    parts = [(get_worker_id(rank), a or (), k or {}) for rank, a, k in parts]
    return Future(_calls().call(parts, func), reducer)


def remote_sync_call(func: Callable, *, args: tuple | None = None, kwargs: dict | None = None,
                     partitioner=None, reducer: Callable | None = None) -> Any:
    return remote_async_call(func, args=args, kwargs=kwargs, partitioner=partitioner,
                             reducer=reducer).wait()


def parallelize_async(partitioner=None, reducer: Callable | None = None):
    """Decorator: calling the function runs it remotely (remote_async_call) and returns a
    Future. With no partitioner: batch_partitioner and, unless given, mean_reducer."""
    if partitioner is None:
        partitioner = batch_partitioner
        reducer = mean_reducer if reducer is None else reducer

    def wrapper(func):
        @functools.wraps(func)
        def wrapped(*args, **kwargs):
            return remote_async_call(func, args=args, kwargs=kwargs, partitioner=partitioner,
                                     reducer=reducer)
        return _registered(func, wrapped)
    return wrapper


def parallelize(partitioner=None, reducer: Callable | None = None):
    """Decorator: as parallelize_async, returning the result."""
    run_async = parallelize_async(partitioner, reducer)

    def wrapper(func):
        asynchronous = run_async(func)

        @functools.wraps(func)
        def wrapped(*args, **kwargs):
            return asynchronous(*args, **kwargs).wait()
        return wrapped
    return wrapper


parallelize_sync = parallelize


def _registered(func, wrapped):
    """The decorated name now holds `wrapped`, so `func` itself, which the call sends by
    reference, cannot be found by its name: keep it under another name in its module."""
    if "." in func.__qualname__:
        raise ExoframeError(f"parallelize: {func.__qualname__} must be defined at a module's "
                            "top level: the ranks find a remote function by its name.")
    hidden = f"{func.__name__}__remote__"
    setattr(sys.modules[func.__module__], hidden, func)
    func.__qualname__ = hidden
    return wrapped


# -- serving -------------------------------------------------------------------------------
def barrier() -> None:
    """Every rank meets here; each serves the calls that reach it until all are in."""
    _calls().barrier()


def serve() -> None:
    """Serve the calls that have reached this rank by its simulated now."""
    _calls().serve()


def compute(seconds: float) -> None:
    """Charge `seconds` of simulated compute to this rank now (e.g. a served function's
    cost, where the compute model does not measure it)."""
    if not seconds >= 0:
        raise ExoframeError(f"compute(seconds): must be a non-negative time, got {seconds!r}.")
    if _comm is not None:
        _comm.clock.add_compute(float(seconds))


def _calls() -> RemoteCalls:
    if _comm is None:
        raise ExoframeError("exoframe.distributed: remote calls run inside a run's ranks "
                            "(exoframe run, Trainer.fit), from a strategy's code.")
    return _comm.remote
