"""A strategy with its parameters, as an object: `DiLoCo(H=100)`.

Strategy classes are built by the engine with a model first (rank.py). Called with
parameters alone, a strategy class gives a StrategySpec instead, which Trainer.fit takes as
`strategy=`: `fit(strategy=DiLoCo(H=100))` runs exactly as `fit(strategy="diloco",
strategy_params={"H": 100})`. The parameters are checked when the spec is made.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StrategySpec:
    cls: type  # the Strategy subclass
    params: dict  # its parameters as given (checked against cls.Params)

    def __repr__(self) -> str:
        given = ", ".join(f"{k}={v!r}" for k, v in self.params.items())
        return f"{self.cls.__name__}({given})"


class StrategyType(type):
    """The metaclass of Strategy: `DiLoCo(H=100)`, a call with no model, is a StrategySpec."""

    def __call__(cls, *args, **kwargs):
        if args or "model" in kwargs:
            return super().__call__(*args, **kwargs)
        cls.parse_params(kwargs)  # a wrong name or value is an error here, in one line
        return StrategySpec(cls, dict(kwargs))
