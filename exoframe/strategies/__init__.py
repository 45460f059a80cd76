"""Built-in strategies, registered through the same hook as third-party plugins."""
from ..hookspecs import hookimpl
from .base import OptimizerSpec, Strategy
from .ddp import DDP
from .diloco import DiLoCo
from .localsgd import LocalSGD
from .sparta import Sparta

__all__ = ["Strategy", "OptimizerSpec", "DDP", "LocalSGD", "DiLoCo", "Sparta"]


@hookimpl
def exoframe_register_strategies(register):
    register("ddp", DDP)
    register("localsgd", LocalSGD, aliases=["fedavg"])
    register("diloco", DiLoCo)
    register("sparta", Sparta)
