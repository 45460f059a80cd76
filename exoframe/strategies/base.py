"""The Strategy base class: what replaces `optimizer.step()` in distributed training.

A strategy gets the model, a Communicator, rank/world info and an optimizer spec, and
implements `step()`, called after each backward pass. Subclass it in a few lines::

    class AverageEveryH(Strategy):
        '''Average parameters every H steps.'''

        @dataclass
        class Params:
            H: int = 10

        def step(self):
            self.optimizer.step()
            self.optimizer.zero_grad()
            if self.step_num % self.params.H == 0:
                self.average_parameters()

Parameters are a typed dataclass: unknown or mistyped parameters are an error that
lists the valid ones.

Buffers (BatchNorm's running statistics, ...) are part of the model too. Wherever a
strategy averages or mixes weights, the floating-point buffers travel in the same message
(`all_reduce_with_buffers`, `with_buffers` / `take_buffers`); DDP broadcasts rank 0's
buffers each step, as torch's DistributedDataParallel does (`broadcast_buffers`). Gradient
compressors (topk-ef, randomk-ef, powersgd) exchange gradients only: their buffers stay
local, and evaluation and the final model average them like every strategy's.
"""
from __future__ import annotations

import contextlib
import functools
import numbers
from dataclasses import dataclass
from typing import ClassVar

import torch

from ..comm import Communicator, flatten, flatten_bytes, unflatten_bytes_into, unflatten_into
from ..errors import ExoframeError, did_you_mean, shorten
from ..inputs import build_dataclass
from .optimizers import OptimizerSpec, optimizer_tensors
from .spec import StrategyType
from .traits import TRAIT_NAMES, Traits


class Strategy(metaclass=StrategyType):
    """Base class of every strategy. Subclasses set `Params` and implement `step()`."""

    #: What the strategy declares about itself (strategies/traits.py).
    traits: ClassVar[Traits] = Traits()

    @dataclass
    class Params:
        pass

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        flags = sorted(TRAIT_NAMES & set(cls.__dict__))
        if flags:
            raise ExoframeError(
                f"strategy {cls.__name__} sets `{flags[0]} = ...` on its class: declare it in "
                f"its traits instead, e.g. `traits = Traits({flags[0]}=...)` "
                "(from exoframe.strategies import Traits).")
        if "metrics" in cls.__dict__:
            cls.metrics = _checked_metrics(cls.__dict__["metrics"])

    def __init__(self, model: torch.nn.Module, comm: Communicator, optimizer: OptimizerSpec,
                 params=None, seed: int = 0, total_steps: int | None = None):
        """The contract a strategy relies on is written in docs/strategies.md."""
        self.model = model
        self.comm = comm
        self.rank = comm.rank
        self.world_size = comm.world_size
        self.optimizer_spec = optimizer
        self.params = params if params is not None else self.Params()
        self.seed = seed
        self.step_num = 0  # set by the engine: the 1-based number of the step being finished
        self.lr = optimizer.lr  # set by the engine each step: the schedule's current lr
        self.total_steps = total_steps  # steps the run asks for (a stopping rule may end it early)
        self.synced_at = None  # the step_num of the latest synchronization (sync())
        self.optimizer = optimizer.build(self.trainable_parameters(), model=model)
        self.setup()

    @property
    def sim_time(self) -> float:
        """This rank's simulated clock, in seconds (0 on a rank without a simulator)."""
        return self.comm.clock.now

    @classmethod
    def parse_params(cls, values: dict | None, name: str | None = None):
        """The typed Params; a ValueError or TypeError from its checks (__post_init__) is
        one line naming the strategy, like ExoframeError."""
        name = name or cls.__name__
        try:
            return build_dataclass(cls.Params, dict(values or {}), f"strategy '{name}'",
                                   "parameter")
        except (ValueError, TypeError) as e:
            raise ExoframeError(f"strategy '{name}': {e}") from None

    @classmethod
    def params_problem(cls, params, nodes: int, model: torch.nn.Module) -> str | None:
        """What is wrong with these parameters for a run of `nodes` nodes training `model`
        (a phrase naming the parameter and the fix), or None. The launcher asks before any
        folder is made or rank starts: checks that need the run go here, not in setup()."""
        return None

    # -- to override -----------------------------------------------------------------------
    def setup(self):
        """Called once after the optimizer is built; create extra state here."""

    def step(self):
        raise NotImplementedError

    def finish(self):
        """Called once after the last step, before the engine waits for every operation
        still in flight: answer what peers still wait for (e.g. a server's last replies)."""

    def note(self, **values: float):
        """Numbers for the row of the step being finished (e.g. an outer gradient norm),
        which the default metrics() gives once."""
        self.__dict__.setdefault("_noted", {}).update(values)

    def metrics(self) -> dict:
        """Numbers to log for the step just finished: what note() was given during it."""
        return self.__dict__.pop("_noted", None) or {}

    def held_weights(self) -> list[torch.Tensor]:
        """The parameters (model.parameters() order) and float buffers of the model this node
        would deploy now; default: its current weights. DiLoCo gives its last outer step's
        (`weights_with`); the run then also validates the replicas' average."""
        return current_weights(self.model)

    @classmethod
    def held_model_is_replicas_average(cls) -> bool:
        """True when the model the run validates is the mean of the nodes' current weights
        (then no second, replicas' average validation is needed)."""
        return (cls.held_weights is Strategy.held_weights
                and cls.traits.held_model_from == "average")

    def extra_state(self) -> dict:
        return {}

    def load_extra_state(self, state: dict):
        pass

    # -- checkpoints -------------------------------------------------------------------------
    @classmethod
    def checkpoint_problem(cls, params) -> str | None:
        """Why a run with these parameters could never be checkpointed (an exchange in
        flight at every step end), or None."""
        return None

    def state_dict(self) -> dict:
        return {"step_num": self.step_num, "optimizer": self.optimizer.state_dict(),
                "extra": self.extra_state()}

    def load_state_dict(self, state: dict):
        self.step_num = state["step_num"]
        self.optimizer.load_state_dict(state["optimizer"])
        self.load_extra_state(state["extra"])

    # -- failures ------------------------------------------------------------------------------
    @contextlib.contextmanager
    def sync(self):
        """Around a synchronization every rank makes at the same step. Without simulated
        failures it does nothing. With them, the ranks first agree on who is live (a quorum:
        collectives run among the live members, a mean divides by their number), and once
        the synchronization is done, nodes back from a failure receive the live state
        (recovery_tensors) from the lowest live rank."""
        self.comm.quorum(self.recovery_tensors)
        yield
        self.comm.heal()
        self.synced_at = self.step_num

    def recovery_tensors(self) -> list[torch.Tensor]:
        """What a node back from a failure takes from a live one, written in place: the
        model's parameters and buffers and the optimizer's state. Override to add state of
        your own (DiLoCo adds its global weights and outer optimizer). The list is taken at
        the start of the synchronization; state the synchronization itself creates (an
        optimizer's lazily made buffers) is made alike on every rank by it."""
        return [*self.model.state_dict().values(), *optimizer_tensors(self.optimizer)]

    # -- helpers -------------------------------------------------------------------------------
    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        return [p for p in self.model.parameters() if p.requires_grad]

    def average_gradients(self, ranks: tuple | None = None):
        """One all-reduce (mean) over every gradient, as a flat buffer; among `ranks` only
        (Communicator.all_reduce_among), if given."""
        params = self.trainable_parameters()
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        if self.comm.world_size == 1 and params:
            # The mean over one rank is its gradient: no flat copy, no division (a 1-node
            # GPU step's largest cost of its own); the network model still sees the bytes.
            nbytes = sum(p.grad.numel() * p.grad.element_size() for p in params)
            self.comm.all_reduce(params[0].grad.new_empty(0), op="mean", wire_bytes=nbytes)
            return
        flat = flatten(p.grad for p in params)
        if ranks is None:
            self.comm.all_reduce(flat, op="mean")
        else:
            self.comm.all_reduce_among(flat, ranks, op="mean")
        unflatten_into(flat, [p.grad for p in params])

    def average_parameters(self):
        """One all-reduce (mean) over every parameter and floating-point buffer, as a flat
        buffer."""
        params = self.trainable_parameters()
        unflatten_into(self.all_reduce_with_buffers(flatten(params)), params)

    def float_buffers(self) -> list[torch.Tensor]:
        return float_buffers(self.model)

    def weights_with(self, trainable: torch.Tensor, buffers: torch.Tensor | None
                     ) -> list[torch.Tensor]:
        """The model's weights as `held_weights` gives them, from the flat `trainable`
        parameters and flat float `buffers` (None: a model without them)."""
        weights, offset = [], 0
        for p in self.model.parameters():
            if p.requires_grad:
                weights.append(trainable[offset:offset + p.numel()])
                offset += p.numel()
            else:
                weights.append(p)
        return weights + ([buffers] if buffers is not None else [])

    def float_buffers_flat(self) -> torch.Tensor | None:
        """A copy of the floating-point buffers, flat (None without any)."""
        buffers = self.float_buffers()
        return flatten(buffers).detach().clone() if buffers else None

    def with_buffers(self, flat: torch.Tensor) -> torch.Tensor:
        """`flat` followed by the floating-point buffers' values, to send in one message
        (`flat` itself when the model has none)."""
        buffers = self.float_buffers()
        return flatten([flat, *buffers]) if buffers else flat

    def take_buffers(self, joined: torch.Tensor, numel: int, keep: float = 0.0) -> torch.Tensor:
        """Set the floating-point buffers from what follows the first `numel` values of
        `joined` (mixed with their own values by weight `keep`); return those first values."""
        buffers = self.float_buffers()
        if buffers:
            received = joined[numel:]
            if keep:
                received = torch.lerp(received, flatten(buffers), keep)
            unflatten_into(received, buffers)
        return joined[:numel]

    def all_reduce_with_buffers(self, flat: torch.Tensor) -> torch.Tensor:
        """One all-reduce (mean) of `flat` and the floating-point buffers; the buffers take
        their mean. Returns the mean of `flat`."""
        joined = self.with_buffers(flat)
        self.comm.all_reduce(joined, op="mean")
        return self.take_buffers(joined, flat.numel())

    def broadcast_buffers(self, src: int | None = None):
        """Every buffer (floating-point or not) from rank `src` (None: the lowest live rank,
        rank 0 without failures), as one broadcast of their bytes; nothing is sent when the
        model has no buffers."""
        buffers = list(self.model.buffers())
        if not buffers:
            return
        flat = flatten_bytes(buffers)
        self.comm.broadcast(flat, self.comm.leader if src is None else src)
        unflatten_bytes_into(flat, buffers)


def _checked_metrics(metrics):
    """A subclass's metrics(), refusing (in the rank, by name) values that are not numbers:
    the launcher averages them over ranks and writes them as JSON."""
    @functools.wraps(metrics)
    def checked(self) -> dict:
        values = metrics(self)
        if not isinstance(values, dict):
            raise ExoframeError(f"strategy '{type(self).__name__}': metrics() returned "
                                f"{type(values).__name__}, expected a dict of numbers (or None).")
        for key, value in values.items():
            if value is not None and (isinstance(value, bool)
                                      or not isinstance(value, numbers.Real)):
                raise ExoframeError(
                    f"strategy '{type(self).__name__}': metric '{shorten(str(key))}' is "
                    f"{shorten(value)} ({type(value).__name__}), not a number; return numbers "
                    "from metrics(), e.g. float(x).")
        return values
    return checked


def current_weights(model: torch.nn.Module) -> list[torch.Tensor]:
    """Every parameter, then the floating-point buffers: what the run averages or validates."""
    return [*model.parameters(), *float_buffers(model)]


def float_buffers(model: torch.nn.Module) -> list[torch.Tensor]:
    """The model's floating-point buffers (running statistics): averaged wherever weights are.
    Other buffers (counters such as num_batches_tracked) are taken from rank 0."""
    return [b for b in model.buffers() if b.is_floating_point()]


def check_positive(owner: str, **values):
    for key, value in values.items():
        if value <= 0:
            raise ExoframeError(f"{owner}: parameter '{key}' must be positive, got {value}.")


def check_choice(owner: str, key: str, value, choices):
    if value not in choices:
        raise ExoframeError(f"{owner}: parameter '{key}' must be one of {', '.join(choices)}, "
                            f"got '{value}'.{did_you_mean(str(value), choices)}")


def check_fraction(owner: str, **values):
    for key, value in values.items():
        if not 0 <= value <= 1:
            raise ExoframeError(f"{owner}: parameter '{key}' must be in [0, 1], got {value}.")
