"""Plugin manager and registries.

Built-in strategies and workloads are plugin modules registered first, through the same
hooks as third-party packages. Third-party packages are found through the entry-point
group `exoframe`; each is loaded under its own try/except, so one broken plugin is
reported by name and the others keep working.
"""
from __future__ import annotations

import importlib.metadata
import traceback
from dataclasses import dataclass

import pluggy

from . import hookspecs
from .errors import ExoframeError, unknown_name_error

ENTRY_POINT_GROUP = "exoframe"
BUILTIN_PLUGINS = ("exoframe.strategies", "exoframe.workloads", "exoframe.sim")
KINDS = {"strategies": "exoframe_register_strategies", "workloads": "exoframe_register_workloads",
         "networks": "exoframe_register_networks",
         "algorithms": "exoframe_register_algorithms"}
SINGULAR = {"strategies": "strategy", "workloads": "workload", "networks": "network preset",
            "algorithms": "collective algorithm"}


@dataclass
class Entry:
    name: str
    obj: object
    description: str
    source: str  # distribution that registered it
    version: str
    plugin: str  # plugin (module) name that registered it
    aliases: tuple = ()


@dataclass
class PluginInfo:
    name: str
    source: str
    version: str
    status: str = "active"  # or "failed"
    error: str = ""


class Registry:
    """Name -> Entry for one kind of item (strategies, workloads)."""

    def __init__(self, kind: str):
        self.kind = kind
        self.entries: dict[str, Entry] = {}
        self.aliases: dict[str, str] = {}

    def add(self, entry: Entry):
        for name in (entry.name, *entry.aliases):
            existing = self.get_entry_or_none(name)
            if existing is not None:
                raise ExoframeError(
                    f"{SINGULAR[self.kind]} '{name}' is registered twice: by {existing.source} "
                    f"and by {entry.source}."
                )
        self.entries[entry.name] = entry
        for alias in entry.aliases:
            self.aliases[alias] = entry.name

    def get_entry_or_none(self, name):
        return self.entries.get(self.aliases.get(name, name))

    def get(self, name) -> Entry:
        entry = self.get_entry_or_none(name)
        if entry is None:
            raise unknown_name_error(SINGULAR[self.kind], name, [*self.entries, *self.aliases])
        return entry

    def __iter__(self):
        return iter(sorted(self.entries.values(), key=lambda e: e.name))


class PluginManager:
    def __init__(self, load_entry_points: bool = True, builtins: bool = True):
        self.pm = pluggy.PluginManager("exoframe")
        self.pm.add_hookspecs(hookspecs)
        self.plugins: dict[str, PluginInfo] = {}
        self.registries = {kind: Registry(kind) for kind in KINDS}
        if builtins:
            version = _exoframe_version()
            for module_name in BUILTIN_PLUGINS:
                module = importlib.import_module(module_name)
                self.register(module, name=module_name, source="exoframe", version=version)
        if load_entry_points:
            self.load_entry_points()

    def register(self, plugin, name: str, source: str, version: str = ""):
        """Register a plugin object (module or instance) and collect what it registers."""
        info = PluginInfo(name=name, source=source, version=version)
        self.plugins[name] = info
        try:
            self.pm.register(plugin, name=name)
            for kind, hook_name in KINDS.items():
                for impl in getattr(self.pm.hook, hook_name).get_hookimpls():
                    if impl.plugin_name == name:
                        impl.function(register=self._register_callback(kind, info))
        except Exception as e:
            info.status, info.error = "failed", _one_line(e)
            self._forget(name)
            return None
        return info

    def _register_callback(self, kind, info: PluginInfo):
        def register(name, obj, description="", aliases=()):
            self.registries[kind].add(
                Entry(name=name, obj=obj, description=description or _first_doc_line(obj),
                      source=info.source, version=info.version, plugin=info.name,
                      aliases=tuple(aliases))
            )
        return register

    def _forget(self, plugin_name):
        if self.pm.has_plugin(plugin_name):
            self.pm.unregister(name=plugin_name)
        for registry in self.registries.values():
            for entry in [e for e in registry.entries.values() if e.plugin == plugin_name]:
                del registry.entries[entry.name]
                for alias in entry.aliases:
                    registry.aliases.pop(alias, None)

    def load_entry_points(self):
        for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
            source = ep.dist.name if ep.dist else ep.value
            version = ep.dist.version if ep.dist else ""
            if ep.name in self.plugins:
                continue
            try:
                plugin = ep.load()
            except Exception as e:
                self.plugins[ep.name] = PluginInfo(
                    name=ep.name, source=source, version=version, status="failed",
                    error=_one_line(e),
                )
                continue
            self.register(plugin, name=ep.name, source=source, version=version)

    @property
    def strategies(self) -> Registry:
        return self.registries["strategies"]

    @property
    def workloads(self) -> Registry:
        return self.registries["workloads"]

    @property
    def networks(self) -> Registry:
        return self.registries["networks"]

    @property
    def algorithms(self) -> Registry:
        return self.registries["algorithms"]


def _one_line(exc: BaseException) -> str:
    return "".join(traceback.format_exception_only(type(exc), exc)).strip().splitlines()[-1]


def _first_doc_line(obj) -> str:
    doc = (getattr(obj, "__doc__", None) or "").strip()
    return doc.splitlines()[0] if doc else ""


def _exoframe_version() -> str:
    try:
        return importlib.metadata.version("exoframe")
    except importlib.metadata.PackageNotFoundError:
        return "dev"


_manager: PluginManager | None = None


def get_plugin_manager() -> PluginManager:
    """The process-wide manager: built-ins plus installed entry points, loaded once."""
    global _manager
    if _manager is None:
        _manager = PluginManager()
    return _manager
