"""exoframe: simulate distributed training of PyTorch models on one machine.

The names below are imported on first use, so `import exoframe.sim` (the network model)
and the command line's help do not pay for torch.
"""
import importlib
import importlib.metadata

from .errors import ExoframeError, RunStopped
from .hookspecs import PLUGIN_API, hookimpl

try:
    __version__ = importlib.metadata.version("exoframe")
except importlib.metadata.PackageNotFoundError:  # a source tree that was not installed
    __version__ = "dev"

_LAZY = {"Trainer": ".engine.trainer", "RunResult": ".engine.run",
         "SweepResult": ".report.results",
         "Strategy": ".strategies.base", "Traits": ".strategies.traits",
         "OptimizerSpec": ".strategies.base",
         "Workload": ".workloads.base", "load_run": ".schema"}

__all__ = ["Trainer", "RunResult", "SweepResult", "Strategy", "Traits", "OptimizerSpec",
           "Workload", "load_run", "hookimpl", "ExoframeError", "RunStopped", "PLUGIN_API",
           "__version__"]


def __getattr__(name: str):
    if name == "strategies":  # exoframe.strategies.DiLoCo(H=100), after `import exoframe`
        return importlib.import_module(".strategies", __name__)
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name], __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'exoframe' has no attribute '{name}'")


def __dir__():
    return sorted(__all__)
