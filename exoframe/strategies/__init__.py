"""Built-in strategies (registered by name in exoframe/builtins.py) and torch's optimizers."""
from ..hookspecs import hookimpl
from .async_localsgd import AsyncLocalSGD
from .base import Strategy
from .ddp import DDP
from .desloc import DESLOC
from .diloco import DiLoCo
from .eager_diloco import EagerDiLoCo
from .gossip import Gossip
from .halos import HALoS
from .hier_diloco import HierDiLoCo
from .localsgd import LocalSGD
from .muon import hidden_matrices, muon_with_rule
from .noloco import NoLoCo
from .optimizers import OptimizerSpec, torch_optimizers
from .param_server import ParameterServer
from .powersgd import PowerSGD
from .randomk_ef import RandomKEF
from .sparseloco import SparseLoCo
from .sparta import Sparta
from .sparta_diloco import SpartaDiLoCo
from .streaming_diloco import StreamingDiLoCo
from .topk_ef import TopKEF
from .traits import Traits

__all__ = ["Strategy", "Traits", "OptimizerSpec", "DDP", "LocalSGD", "DiLoCo", "Sparta",
           "StreamingDiLoCo", "SpartaDiLoCo", "TopKEF", "RandomKEF", "PowerSGD", "Gossip",
           "NoLoCo", "AsyncLocalSGD", "ParameterServer", "SparseLoCo", "EagerDiLoCo", "DESLOC",
           "HierDiLoCo", "HALoS"]


@hookimpl
def exoframe_register_optimizers(register):
    for name, cls in torch_optimizers().items():
        register(name, cls, description=f"torch.optim.{cls.__name__}")
    register("muon", muon_with_rule(hidden_matrices),
             description="torch.optim.Muon on the hidden matrices, AdamW on the rest")
