"""The one hookspecs module. Every hook takes a `register` callback.

A plugin (built-in or third-party) implements, for example::

    from exoframe import hookimpl

    @hookimpl
    def exoframe_register_strategies(register):
        register("mystrategy", MyStrategy, description="...")
"""
import pluggy

hookspec = pluggy.HookspecMarker("exoframe")
hookimpl = pluggy.HookimplMarker("exoframe")


@hookspec
def exoframe_register_strategies(register):
    """register(name, strategy_class, description="", aliases=())"""


@hookspec
def exoframe_register_workloads(register):
    """register(name, workload_factory, description="", aliases=())

    A workload factory takes keyword parameters and returns an exoframe.Workload.
    """


@hookspec
def exoframe_register_networks(register):
    """register(name, source, description="", aliases=())

    A network preset: `source` is a path to a YAML file, or a dict with the same keys
    (see netmodels/*.yaml).
    """


@hookspec
def exoframe_register_algorithms(register):
    """register(name, plan_function, description="", aliases=())

    A collective algorithm: plan_function(kind, n, root) returns an exoframe.sim.Plan, the
    flows that carry collective `kind` among n participants, or raises ValueError if it
    does not implement `kind`.
    """


@hookspec
def exoframe_register_sinks(register):
    """register(name, sink_factory, description="", aliases=())

    A metrics sink: sink_factory(run_dir) returns an object with `write(row)`, called with
    each step's metrics row (a dict) as the step finishes, and `close()`, called once at the
    end of the run. Chosen per run by RunConfig.sinks / `--sink` (default: jsonl).
    """


@hookspec
def exoframe_register_commands(register):
    """register(name, click_command, description="", aliases=())

    An extra command line command: `exoframe <name>` runs the click.Command.
    """


@hookspec
def exoframe_register_optimizers(register):
    """register(name, optimizer_factory, description="", aliases=())

    A local (inner) optimizer: optimizer_factory(params, lr=..., **kwargs) returns a
    torch.optim.Optimizer (a torch.optim class is one). Chosen per run by
    RunConfig.optimizer / `--optimizer NAME`, with keyword arguments from `-o KEY=VALUE`.
    Every torch.optim optimizer is registered under its lower-case class name.
    """
