"""The network in the loop: a flow-level network model on simpy, simulated clocks, compute
models and stragglers. The bottom layer: it imports neither torch nor anything else of
exoframe (its presets and algorithms are registered by exoframe/builtins.py)."""
from .collectives import Plan
from .setup import SimSetup, resolve_sim
from .simulator import SimulationError, Simulator
from .topology import LinkSpec, Sites, Topology

__all__ = ["Plan", "SimSetup", "resolve_sim", "Simulator", "SimulationError", "LinkSpec",
           "Sites", "Topology"]

