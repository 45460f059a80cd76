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
