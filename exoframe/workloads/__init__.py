"""Built-in workloads, registered through the same hook as third-party plugins."""
from ..hookspecs import hookimpl
from .base import Workload, shard, shard_factory
from .gpt import gpt
from .mlp import mlp

__all__ = ["Workload", "shard", "shard_factory", "gpt", "mlp"]


@hookimpl
def exoframe_register_workloads(register):
    register("gpt", gpt)
    register("mlp", mlp)
