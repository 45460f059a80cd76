"""exoframe-demo: the `demo` strategy (DeMo, decoupled momentum) for exoframe."""
import importlib

import exoframe
from exoframe.plugins import lazy

EXOFRAME_PLUGIN_API = ">=2,<3"

__all__ = ["DeMo", "DCTChunks", "payload_bytes"]


def __getattr__(name):  # torch is imported with .demo, when a run uses it, not when listing
    if name in __all__:
        return getattr(importlib.import_module(".demo", __name__), name)
    raise AttributeError(f"module 'exoframe_demo' has no attribute '{name}'")


@exoframe.hookimpl
def exoframe_register_strategies(register):
    register("demo", lazy("exoframe_demo.demo:DeMo"))
