"""The network in the loop: a flow-level network model on simpy, simulated clocks, compute
models and stragglers. It imports neither torch nor anything of exoframe but the ground
floor (exoframe/errors.py, exoframe/inputs.py); its presets and algorithms are registered by
exoframe/builtins.py.

The names below load on first use: reading units or a network file needs no simpy."""
import importlib

_HOMES = {"Plan": ".network.plan", "SimSetup": ".setup", "resolve_sim": ".setup",
          "Simulator": ".clocks.simulator", "SimulationError": ".clocks.simulator",
          "LinkSpec": ".network.topology", "Sites": ".network.topology",
          "Topology": ".network.topology"}

__all__ = list(_HOMES)


def __getattr__(name: str):
    if name in _HOMES:
        value = getattr(importlib.import_module(_HOMES[name], __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'exoframe.sim' has no attribute '{name}'")


def __dir__():
    return sorted(__all__)
