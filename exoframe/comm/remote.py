"""Remote calls through the simulated network: the machinery under exoframe.distributed.

A call is a one-sided message to the rank that runs it, holding the function (by reference)
and its arguments; the result comes back the same way. The simulator times both messages
like any flow: every tensor's bytes plus the pickled size of everything else (the
"envelope": the function's name, non-tensor arguments). The contents travel beside the
simulator (through the launcher), handed over with the delivery.

When a rank serves: whenever it waits in exoframe.distributed, for its own calls' results
(`wait()`), in `barrier()` or `serve()`, and, when its strategy's traits declare
`remote_calls`, at each step end and after its last step until every rank is done (the
engine calls `serve()` and a final `barrier()`). A call that arrives while the rank computes waits in
its mailbox until then. Calls are served one at a time in order of arrival; the function's
compute is charged to the serving rank's clock (measured CPU time under `--compute
measured`, plus what it declares with `exoframe.distributed.compute()`), and its result
leaves when it is done. A function that cannot answer yet raises NotYet: it runs again
after each call that rank serves next (a server's pull waiting for the last push).
A rank waiting for results serves meanwhile, so ranks calling each other cannot deadlock;
a call that no rank can ever serve (its target has finished, or sits in a collective its
caller never joins) is reported as a deadlock by the simulator.
"""
from __future__ import annotations

import io
import pickle
import traceback
from dataclasses import dataclass
from typing import Any, Callable

import torch

from ..errors import ExoframeError


@dataclass(frozen=True)
class CallRequest:
    call_id: int  # the caller's own numbering
    func: Callable
    args: tuple
    kwargs: dict


@dataclass(frozen=True)
class CallResult:
    call_id: int
    value: Any = None
    error: str | None = None  # the callee's traceback when the function raised


class NotYet(Exception):
    """Raised by a served function that cannot answer yet (a server waiting for the other
    workers' pushes): the call stays with the serving rank and runs again each time that
    rank has served another call or made one to itself."""


class RemoteCallError(ExoframeError):
    """A remote function raised: its message carries the serving rank's traceback."""


class RemoteCalls:
    """One rank's remote calls: what it sent and awaits, and what it serves."""

    def __init__(self, comm):
        self.comm = comm
        self.results: dict[tuple[int, int], CallResult] = {}  # (callee, call_id) -> result
        self._next_call = 0
        self.declared = False  # the strategy's remote_calls (the engine sets it)
        self.deferred: list[tuple[int, CallRequest]] = []  # (caller, call) that said NotYet
        self.outstanding: set[tuple[int, int]] = set()  # calls made, results not yet taken

    # -- calling ---------------------------------------------------------------------------
    def call(self, parts: list[tuple[int, tuple, dict]], func: Callable) -> list["Reply"]:
        """Start func(*args, **kwargs) on each part's rank. The calls to other ranks leave
        first; then the calls to this rank run here, in order."""
        if self.comm.rank not in self.comm.live:
            raise ExoframeError(f"remote call of {_name(func)} from rank {self.comm.rank}, "
                                "which is down (simulated failure): a down node calls nobody.")
        if not self.declared and self.comm.world_size > 1:
            raise ExoframeError(f"remote call of {_name(func)}: the strategy makes remote "
                                "calls, so declare `traits = Traits(remote_calls=True)` on its "
                                "class (its ranks then serve calls at step ends and until "
                                "every rank is done).")
        for rank, _, _ in parts:
            self._check_target(rank, func)
        replies = []
        for rank, args, kwargs in parts:
            request = CallRequest(self._next_call, func, tuple(args), dict(kwargs))
            self._next_call += 1
            if rank != self.comm.rank:
                self._post(rank, request)
            replies.append(Reply(self, rank, request))
            self.outstanding.add(replies[-1].key)
        for reply in replies:
            if reply.rank == self.comm.rank:
                self._serve(self.comm.rank, reply.request)
        return replies

    def collect(self, keys: list[tuple[int, int]]) -> list[CallResult]:
        """The results of these calls, serving what comes meanwhile."""
        self._await(keys)
        self.outstanding.difference_update(keys)
        return [self.results.pop(key) for key in keys]

    def arrived(self, keys: list[tuple[int, int]]) -> bool:
        return all(key in self.results for key in keys)

    def _await(self, keys):
        while not self.arrived(keys):
            self._open(self.comm.clock.listen())

    # -- serving ---------------------------------------------------------------------------
    def serve(self):
        """Serve the calls that have arrived by this rank's simulated now."""
        if self.comm.world_size > 1:
            self._open(self.comm.clock.listen(block=False))

    def barrier(self):
        """Every rank meets here (a one-element all-reduce), once the results of its own
        calls are in; each serves the calls that reach it until the last one is in."""
        if self.comm.world_size == 1:
            return
        if self.comm.rank in self.comm.live:
            self._await(sorted(self.outstanding))
        token = torch.zeros(1, device=self.comm.exchange.token_device())
        # (a rank that is down takes no part in the simulated one: its handle is done)
        self.comm.all_reduce(token, async_op=True).wait_serving(self._open)

    # -- plumbing --------------------------------------------------------------------------
    def _check_target(self, rank, func):
        name = _name(func)
        if not isinstance(rank, int) or isinstance(rank, bool) or \
                not 0 <= rank < self.comm.world_size:
            raise ExoframeError(f"remote call of {name} to rank {rank!r}, but the run has ranks "
                                f"0 to {self.comm.world_size - 1}: call one of those.")
        if rank not in self.comm.live:
            raise ExoframeError(f"remote call of {name} to rank {rank}, which is down "
                                "(simulated failure): call a live rank (comm.live).")

    def _post(self, rank: int, message: CallRequest | CallResult):
        payload, tensor_bytes, envelope_bytes = encode(message)
        self.comm.clock.post(rank, tensor_bytes + envelope_bytes, payload)
        self.comm.traffic.add("remote", tensor_bytes, 0)
        self.comm.traffic.add("remote_envelope", envelope_bytes, 0)

    def _open(self, mail):
        for (src, _, nbytes), payload in zip(mail.messages, mail.payloads):
            message, tensor_bytes = decode(payload)
            self.comm.traffic.add("remote", 0, tensor_bytes)
            self.comm.traffic.add("remote_envelope", 0, nbytes - tensor_bytes)
            if isinstance(message, CallResult):
                self.results[(src, message.call_id)] = message
            else:
                self.comm.clock.skip()  # unpacking is bookkeeping: only the function is
                # charged, when its result is posted
                self._serve(src, message)

    def _serve(self, src: int, request: CallRequest):
        result = _run(request)
        if result is None:
            self.deferred.append((src, request))
            return
        self._answer(src, result)
        while True:  # what this call changed may let a deferred one answer
            for i in range(len(self.deferred)):
                caller, waiting = self.deferred.pop(i)  # out while it runs: it may serve
                result = _run(waiting)
                if result is None:
                    self.deferred.insert(i, (caller, waiting))
                    continue
                self._answer(caller, result)
                break
            else:
                return

    def _answer(self, src: int, result: CallResult):
        if src == self.comm.rank:
            self.results[(src, result.call_id)] = result
            return
        try:
            self._post(src, result)
        except ExoframeError as e:  # a result that cannot be sent
            self._post(src, CallResult(result.call_id, error=str(e)))


class Reply:
    """One call: in flight until `result` is set."""

    def __init__(self, calls: RemoteCalls, rank: int, request: CallRequest):
        self.calls, self.rank, self.request = calls, rank, request
        self.result: CallResult | None = None

    @property
    def key(self) -> tuple[int, int]:
        return (self.rank, self.request.call_id)

    def value(self):
        if self.result.error is not None:
            raise RemoteCallError(f"remote call of {_name(self.request.func)} on rank "
                                  f"{self.rank} raised:\n{self.result.error.rstrip()}")
        return self.result.value


def _name(func) -> str:
    return getattr(func, "__name__", repr(func))


def _run(request: CallRequest) -> CallResult | None:
    """The call's result, or None when the function says NotYet."""
    try:
        return CallResult(request.call_id, request.func(*request.args, **request.kwargs))
    except NotYet:
        return None
    except Exception:  # the caller gets it, with this rank's traceback
        return CallResult(request.call_id, error=traceback.format_exc())


# -- the wire format ---------------------------------------------------------------------------
class _Pickler(pickle.Pickler):
    """Pickles everything but tensors, which it sets aside: their bytes are counted at
    their size, the rest at its pickled size."""

    def __init__(self, file, tensors: list):
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.tensors = tensors

    def persistent_id(self, obj):
        if isinstance(obj, torch.Tensor):
            # a copy of its own: a view would carry its whole storage
            self.tensors.append(obj.detach().to("cpu", copy=True).contiguous())
            return len(self.tensors) - 1
        return None


class _Unpickler(pickle.Unpickler):
    def __init__(self, file, tensors: list):
        super().__init__(file)
        self.tensors = tensors

    def persistent_load(self, pid):
        return self.tensors[pid]


def encode(message) -> tuple[bytes, int, int]:
    """(payload, tensor bytes, envelope bytes) of a message."""
    tensors: list[torch.Tensor] = []
    envelope = io.BytesIO()
    try:
        _Pickler(envelope, tensors).dump(message)
    except (pickle.PicklingError, AttributeError, TypeError) as e:
        what = getattr(getattr(message, "func", None), "__qualname__", "a remote call's result")
        raise ExoframeError(f"remote call: cannot send {what}: {e}. A remote function must "
                            "be defined at a module's top level, and its arguments and "
                            "result made of tensors and picklable values.") from None
    tensor_bytes = sum(t.numel() * t.element_size() for t in tensors)
    return pickle.dumps((envelope.getvalue(), tensors)), tensor_bytes, len(envelope.getvalue())


def decode(payload: bytes):
    """(message, its tensor bytes)."""
    envelope, tensors = pickle.loads(payload)
    return (_Unpickler(io.BytesIO(envelope), tensors).load(),
            sum(t.numel() * t.element_size() for t in tensors))
