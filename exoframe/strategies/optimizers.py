"""The optimizers a strategy builds: the local (inner) optimizer's spec, torch.optim's
optimizers by name, and the DiLoCo family's outer optimizer."""
from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch

from ..errors import ExoframeError, shorten, unknown_name_error
from ..optimizer_values import check_optimizer_values


def torch_optimizers() -> dict[str, type]:
    """Every torch.optim optimizer that steps without a closure, by lower-case class name
    (adamw, adam, sgd, rmsprop, adagrad, nadam, radam, adamax, ...). Muon, which takes
    only 2-D parameters, is registered as exoframe's `muon` (strategies/muon.py)."""
    return {name.lower(): cls for name, cls in vars(torch.optim).items()
            if isinstance(cls, type) and issubclass(cls, torch.optim.Optimizer)
            and cls is not torch.optim.Optimizer and name not in ("LBFGS", "Muon")}


@dataclass
class OptimizerSpec:
    """The local (inner) optimizer a strategy builds over its parameters: a torch.optim
    class or a plugin's factory(params, **kwargs), with lr, weight_decay, momentum and any
    other keyword arguments (`params`)."""

    name: str = "adamw"
    lr: float = 1e-3
    weight_decay: float = 0.0
    momentum: float = 0.0
    params: dict = field(default_factory=dict)
    factory: Optional[Callable] = None  # None: torch.optim's class called `name`

    def __post_init__(self):
        if "lr" in self.params:
            raise ExoframeError(f"optimizer '{self.name}': give the learning rate as lr "
                                "(--lr, or outer_lr for an outer optimizer), not among its "
                                "keyword arguments: the schedule sets it every step.")
        if self.factory is None:
            known = torch_optimizers()
            if self.name not in known:
                raise unknown_name_error("optimizer", self.name, known)
            self.factory = known[self.name]
        # Here, in the launcher: torch checks these only when a rank builds the optimizer.
        check_optimizer_values(self.lr, self.weight_decay, self.momentum)
        try:
            self.build([torch.nn.Parameter(torch.zeros(2))])
        except (TypeError, ValueError) as e:
            raise ExoframeError(f"optimizer '{self.name}': {shorten(str(e))} (its keyword "
                                f"arguments: {shorten(self.kwargs())}).") from None

    def kwargs(self) -> dict:
        """lr, then weight_decay and momentum where the optimizer takes them, then `params`."""
        try:
            accepted = inspect.signature(self.factory).parameters
        except (TypeError, ValueError):
            accepted = {}
        open_ended = any(p.kind is p.VAR_KEYWORD for p in accepted.values())
        kwargs = {"lr": self.lr}
        for key in ("weight_decay", "momentum"):
            value = getattr(self, key)
            if key in accepted or (value and open_ended):
                kwargs[key] = value
            elif value:
                raise ExoframeError(f"optimizer '{self.name}' takes no {key}; drop it or use "
                                    "an optimizer that has it (sgd for momentum).")
        return {**kwargs, **self.params}

    def build(self, params, model: torch.nn.Module | None = None) -> torch.optim.Optimizer:
        """The optimizer over `params`; a factory with a `model` keyword (muon, to tell the
        hidden matrices from the embeddings and head) is also given the model."""
        kwargs = self.kwargs()
        if model is not None and _accepts_keyword(self.factory, "model"):
            kwargs["model"] = model
        return self.factory(list(params), **kwargs)


def _accepts_keyword(function, name: str) -> bool:
    try:
        return name in inspect.signature(function).parameters
    except (TypeError, ValueError):
        return False


def optimizer_tensors(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """The tensors of an optimizer's state (moments, step counts), in parameter order."""
    tensors = []
    for group in optimizer.param_groups:
        for p in group["params"]:
            state = optimizer.state.get(p, {})
            tensors.extend(state[k] for k in sorted(state) if isinstance(state[k], torch.Tensor))
    return tensors


def outer_optimizer_spec(owner: str, params) -> OptimizerSpec:
    """The DiLoCo family's outer optimizer from its parameters: Nesterov SGD with outer_lr
    and outer_momentum by default (`outer_optimizer: sgd`), or any torch.optim class by name
    with outer_lr and the keyword arguments in `outer_optimizer_params`. Built here, in the
    launcher, so a bad name or argument is one line before any rank starts."""
    sgd = params.outer_optimizer == "sgd"
    kwargs = (dict(momentum=params.outer_momentum,
                   nesterov=params.nesterov and params.outer_momentum > 0) if sgd else {})
    try:
        return OptimizerSpec(params.outer_optimizer, params.outer_lr,
                             params={**kwargs, **params.outer_optimizer_params})
    except ExoframeError as e:
        raise ExoframeError(f"{owner}: outer_optimizer: {e}") from None
