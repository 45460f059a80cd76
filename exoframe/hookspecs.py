"""The one hookspecs module. Every hook takes a `register` callback.

A plugin (built-in or third-party) implements, for example::

    from exoframe import hookimpl

    @hookimpl
    def exoframe_register_strategies(register):
        register("mystrategy", MyStrategy, description="...")

`description` is a string, or a function that returns one: it is called only when the
entry is listed. Without one, the object's first docstring line is shown.
"""
import pluggy

# The version of the contract below (hooks, and what registered objects are called with).
# It grows by one when a change could break a plugin; a plugin module may declare the
# versions it works with, as a version specifier: EXOFRAME_PLUGIN_API = ">=2,<3".
# 2: sinks are opened as factory(run: exoframe.sinks.RunInfo, **options) and may finish(summary).
PLUGIN_API = 2

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
    does not implement `kind`. A plan function that accepts a `topology` keyword (a
    parameter of that name, or **kwargs; read from its signature) is called
    plan_function(kind, n, root, topology=sites) with an exoframe.sim.Sites, in the plan's
    indices: sites.ranks[i] is participant i's global rank, sites.site_of[i] its site (an
    index into sites.names), sites.groups() the participants of each site. Participants
    may be a subgroup of the ranks. A network YAML names an algorithm by its name or any
    alias.
    """


@hookspec
def exoframe_register_sinks(register):
    """register(name, sink_factory, description="", aliases=())

    A metrics sink: sink_factory(run, **options) returns an object with `write(row)`,
    called with each step's metrics row (a dict) as the step finishes, optionally
    `finish(summary)`, called once with summary.json's content (its "status" says whether
    the run completed), and `close()`, called once at the end, whether the run completed or
    not. `run` is an exoframe.sinks.RunInfo (run folder, name, config, strategy, ...);
    options come from `--sink NAME:KEY=VALUE,...` or `sinks: [{NAME: {KEY: VALUE}}]` and are
    checked against the factory's keyword parameters before the run starts. Chosen per run
    by RunConfig.sinks / `--sink` (default: jsonl). See exoframe/sinks.py.
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
