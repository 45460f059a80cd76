"""Built-in workloads (registered by name in exoframe/builtins.py)."""
from .base import Workload, shard, shard_factory
from .gpt import gpt
from .mlp import mlp

__all__ = ["Workload", "shard", "shard_factory", "gpt", "mlp"]
