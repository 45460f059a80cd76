"""The network in the loop: a flow-level network model on simpy, simulated clocks, compute
models and stragglers. Knows nothing of torch. Also a built-in plugin: it registers the
network presets of netmodels/ and the collective algorithms through the plugin hooks."""
from ..hookspecs import hookimpl
from .collectives import BUILTIN, Plan
from .presets import exoframe_register_networks  # noqa: F401 - a hook implementation
from .setup import SimSetup, resolve_sim
from .simulator import SimulationError, Simulator
from .topology import LinkSpec, Sites, Topology

__all__ = ["Plan", "SimSetup", "resolve_sim", "Simulator", "SimulationError", "LinkSpec",
           "Sites", "Topology"]


@hookimpl
def exoframe_register_algorithms(register):
    register("ring", BUILTIN["ring"], description="ring: reduce-scatter + all-gather, chain broadcast")
    register("tree", BUILTIN["tree"], description="binomial tree broadcast; reduce + broadcast")
    register("direct", BUILTIN["direct"], description="all pairs at once (butterfly all-reduce)")
    register("ps", BUILTIN["ps"], description="parameter server: push to one rank, pull back")
