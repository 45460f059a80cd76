"""exoframe-demo: the `demo` strategy (DeMo, decoupled momentum) for exoframe."""
import exoframe

from .demo import DCTChunks, DeMo, payload_bytes

__all__ = ["DeMo", "DCTChunks", "payload_bytes"]


@exoframe.hookimpl
def exoframe_register_strategies(register):
    register("demo", DeMo)
