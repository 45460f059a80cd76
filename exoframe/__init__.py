"""exoframe: simulate distributed training of PyTorch models on one machine."""
from .engine.run import RunResult
from .engine.trainer import Trainer
from .hookspecs import hookimpl
from .strategies.base import OptimizerSpec, Strategy
from .workloads.base import Workload

__all__ = ["Trainer", "RunResult", "Strategy", "OptimizerSpec", "Workload", "hookimpl"]
