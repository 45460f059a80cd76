"""exoframe's own strategies, workloads, network presets and collective algorithms,
registered through the same hooks as a third-party plugin's. Strategies and workloads are
registered by name: their modules (and torch) are imported when a run uses one, not when
`exoframe strategies` lists them."""
import functools

from .hookspecs import hookimpl
from .plugins import lazy
from .sim.network.collectives import BUILTIN
from .sim.network.presets import description as preset_description, presets

STRATEGIES = {
    "ddp": "exoframe.strategies.ddp:DDP",
    "localsgd": "exoframe.strategies.localsgd:LocalSGD",
    "diloco": "exoframe.strategies.diloco:DiLoCo",
    "sparta": "exoframe.strategies.sparta:Sparta",
    "streaming-diloco": "exoframe.strategies.streaming_diloco:StreamingDiLoCo",
    "sparta-diloco": "exoframe.strategies.sparta_diloco:SpartaDiLoCo",
    "topk-ef": "exoframe.strategies.topk_ef:TopKEF",
    "randomk-ef": "exoframe.strategies.randomk_ef:RandomKEF",
    "powersgd": "exoframe.strategies.powersgd:PowerSGD",
    "gossip": "exoframe.strategies.gossip:Gossip",
    "noloco": "exoframe.strategies.noloco:NoLoCo",
    "async-localsgd": "exoframe.strategies.async_localsgd:AsyncLocalSGD",
    "param-server": "exoframe.strategies.param_server:ParameterServer",
    "sparseloco": "exoframe.strategies.sparseloco:SparseLoCo",
    "eager-diloco": "exoframe.strategies.eager_diloco:EagerDiLoCo",
    "desloc": "exoframe.strategies.desloc:DESLOC",
    "hier-diloco": "exoframe.strategies.hier_diloco:HierDiLoCo",
    "halos": "exoframe.strategies.halos:HALoS",
}
ALIASES = {"localsgd": ["fedavg"]}
WORKLOADS = {"gpt": "exoframe.workloads.gpt:gpt", "mlp": "exoframe.workloads.mlp:mlp",
             "image": "exoframe.workloads.image:image", "hf-lm": "exoframe.workloads.hf:hf_lm"}


@hookimpl
def exoframe_register_strategies(register):
    for name, target in STRATEGIES.items():
        register(name, lazy(target), aliases=ALIASES.get(name, ()))


@hookimpl
def exoframe_register_workloads(register):
    for name, target in WORKLOADS.items():
        register(name, lazy(target))


@hookimpl
def exoframe_register_networks(register):
    for name, path in presets():
        register(name, path, description=functools.partial(preset_description, path))


@hookimpl
def exoframe_register_algorithms(register):
    register("ring", BUILTIN["ring"], description="ring: reduce-scatter + all-gather, chain broadcast")
    register("tree", BUILTIN["tree"], description="binomial tree broadcast; reduce + broadcast")
    register("direct", BUILTIN["direct"], description="all pairs at once (butterfly all-reduce)")
    register("ps", BUILTIN["ps"], description="parameter server: push to one rank, pull back")
    register("gloo", BUILTIN["gloo"], description="all-reduce as gloo's ring runs it: "
             "segments, two in flight, the receiver says when it is ready (TCP's default)")
