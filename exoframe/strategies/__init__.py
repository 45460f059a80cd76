"""Built-in strategies (registered by name in exoframe/builtins.py) and torch's optimizers."""
from ..hookspecs import hookimpl
from .async_localsgd import AsyncLocalSGD
from .base import Strategy
from .optimizers import OptimizerSpec, torch_optimizers
from .ddp import DDP
from .diloco import DiLoCo
from .gossip import Gossip
from .localsgd import LocalSGD
from .muon import hidden_matrices, muon_with_rule
from .noloco import NoLoCo
from .powersgd import PowerSGD
from .randomk_ef import RandomKEF
from .sparta import Sparta
from .sparta_diloco import SpartaDiLoCo
from .streaming_diloco import StreamingDiLoCo
from .topk_ef import TopKEF

__all__ = ["Strategy", "OptimizerSpec", "DDP", "LocalSGD", "DiLoCo", "Sparta",
           "StreamingDiLoCo", "SpartaDiLoCo", "TopKEF", "RandomKEF", "PowerSGD", "Gossip",
           "NoLoCo", "AsyncLocalSGD"]


@hookimpl
def exoframe_register_optimizers(register):
    for name, cls in torch_optimizers().items():
        register(name, cls, description=f"torch.optim.{cls.__name__}")
    register("muon", muon_with_rule(hidden_matrices),
             description="torch.optim.Muon on the hidden matrices, AdamW on the rest")
