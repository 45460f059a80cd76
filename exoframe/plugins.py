"""Plugin manager and registries.

Built-in strategies, workloads, network presets, metrics sinks and commands are plugin
modules registered first, through the same hooks as third-party packages. Third-party
packages are found through the entry-point group `exoframe`; each is loaded under its own
try/except, so one broken plugin is reported by name and the others keep working.

EXOFRAME_DISABLE_PLUGINS (comma-separated entry-point or package names) skips plugins
without importing them; EXOFRAME_STRICT_PLUGINS=1 (or `exoframe --strict-plugins`) makes a
plugin that fails to load an error instead of a warning in `exoframe plugins`.
"""
from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import os
import sys
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import pluggy

from . import hookspecs
from .errors import ExoframeError, did_you_mean, shorten, unknown_name_error

ENTRY_POINT_GROUP = "exoframe"
DISABLE_ENV = "EXOFRAME_DISABLE_PLUGINS"
STRICT_ENV = "EXOFRAME_STRICT_PLUGINS"
# Built-in plugin modules and the kinds of item each registers.
BUILTIN_PLUGINS = {"exoframe.builtins": {"strategies", "workloads", "networks", "algorithms"},
                   "exoframe.strategies": {"optimizers"}, "exoframe.sinks": {"sinks"},
                   "exoframe.cli.commands": {"commands"}}
KINDS = {"strategies": "exoframe_register_strategies", "workloads": "exoframe_register_workloads",
         "networks": "exoframe_register_networks",
         "algorithms": "exoframe_register_algorithms", "sinks": "exoframe_register_sinks",
         "commands": "exoframe_register_commands",
         "optimizers": "exoframe_register_optimizers"}
SINGULAR = {"strategies": "strategy", "workloads": "workload", "networks": "network preset",
            "algorithms": "collective algorithm", "sinks": "metrics sink", "commands": "command",
            "optimizers": "optimizer"}


class Lazy:
    """An object named by "package.module:attribute", imported when first used, so that
    listing what is registered imports nothing heavy (torch): register(name, lazy("..."))."""

    def __init__(self, target: str):
        module, _, attribute = target.partition(":")
        if not module or not attribute:
            raise ExoframeError(f"lazy({target!r}): name an object as 'package.module:attribute'.")
        self.module, self.attribute = module, attribute

    def load(self):
        value = importlib.import_module(self.module)
        for part in self.attribute.split("."):
            value = getattr(value, part)
        return value

    def first_doc_line(self) -> str:
        """The first line of the object's docstring, read from its source file without
        importing it (nor its package, whose __init__ may import torch)."""
        top, *parts = self.module.split(".")
        spec = importlib.util.find_spec(top)
        if spec is None or spec.origin is None or (parts and not spec.submodule_search_locations):
            return _first_doc_line(self.load())  # a namespace package, say: ask the object
        folder = Path(spec.origin).parent
        candidates = [folder.joinpath(*parts).with_suffix(".py"),
                      folder.joinpath(*parts, "__init__.py")] if parts else [Path(spec.origin)]
        source = next((c for c in candidates if c.is_file()), None)
        if source is None:
            return _first_doc_line(self.load())
        for node in ast.parse(source.read_text()).body:
            if getattr(node, "name", None) == self.attribute and isinstance(
                    node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = (ast.get_docstring(node) or "").strip()
                return doc.splitlines()[0] if doc else ""
        return _first_doc_line(self.load())  # defined some other way: ask the object


def lazy(target: str) -> Lazy:
    return Lazy(target)


@dataclass
class Entry:
    name: str
    target: object  # the registered object, or a Lazy naming it
    description: str | Callable[[], str]  # a function: called when listed (describe())
    source: str  # distribution that registered it
    version: str
    plugin: str  # plugin (module) name that registered it
    aliases: tuple = ()

    def describe(self) -> str:
        if callable(self.description):
            try:
                self.description = str(self.description() or "")
            except Exception as e:  # one entry's broken source: the listing goes on
                self.description = f"(no description: {_one_line(e)})"
        return self.description

    @property
    def obj(self):
        if isinstance(self.target, Lazy):
            try:
                self.target = self.target.load()
            except Exception as e:
                raise ExoframeError(f"'{self.name}' from {self.source} {self.version} could not "
                                    f"be loaded: {_one_line(e)}") from None
        return self.target


@dataclass
class PluginInfo:
    name: str
    source: str
    version: str
    status: str = "active"  # or "failed", "disabled"
    error: str = ""
    warning: str = ""  # e.g. it declares plugin API versions this exoframe does not have
    hooks: list = field(default_factory=list)  # hook names it implements
    items: dict = field(default_factory=dict)  # kind -> names it registered

    def as_dict(self) -> dict:
        return asdict(self)


class Registry:
    """Name -> Entry for one kind of item (strategies, workloads, ...)."""

    def __init__(self, kind: str, failed=lambda: []):
        """failed(): the plugins that failed to load (PluginInfo), for "unknown name"."""
        self.kind = kind
        self.entries: dict[str, Entry] = {}
        self.aliases: dict[str, str] = {}
        self.failed = failed

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
            error = unknown_name_error(SINGULAR[self.kind], name, [*self.entries, *self.aliases])
            # A plugin that failed before saying what it registers may have had it.
            suspects = [f"'{info.name}' ({info.source} {info.version}): {info.error}"
                        for info in self.failed()
                        if not info.hooks or KINDS[self.kind] in info.hooks]
            if suspects:
                error = ExoframeError(f"{error} It may be a plugin's that failed to load: "
                                      f"{'; '.join(suspects)} (see `exoframe plugins`).")
            raise error
        return entry

    def __iter__(self):
        return iter(sorted(self.entries.values(), key=lambda e: e.name))

    def names(self) -> list[str]:
        """Every name an entry can be found by: names and aliases."""
        return [*self.entries, *self.aliases]


class PluginManager:
    """disabled: plugin (entry-point) or package names not to load; strict: raise on a
    plugin that fails to load. Both default to the environment variables above."""

    def __init__(self, load_entry_points: bool = True, builtins: bool = True,
                 disabled=None, strict: bool | None = None, kinds=None):
        """kinds: collect only these kinds of item (default: all), and import only the
        built-in modules that provide them: the command line's help needs commands alone,
        and the built-in strategies and workloads import torch."""
        self.kinds = set(kinds or KINDS)
        self.pm = pluggy.PluginManager("exoframe")
        self.pm.add_hookspecs(hookspecs)
        self.plugins: dict[str, PluginInfo] = {}
        self.registries = {kind: Registry(kind, self._failed_plugins) for kind in KINDS}
        self.disabled = set(disabled) if disabled is not None else disabled_from_env()
        self.strict = strict if strict is not None else strict_from_env()
        if builtins:
            version = _exoframe_version()
            for module_name, provides in BUILTIN_PLUGINS.items():
                if not self.kinds & provides:
                    continue
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
            info.hooks = sorted(caller.name for caller in self.pm.get_hookcallers(plugin))
            unknown = [hook for hook in info.hooks if hook not in KINDS.values()]
            if unknown:
                raise ExoframeError(f"implements unknown hook '{unknown[0]}'."
                                    f"{did_you_mean(unknown[0], KINDS.values())}")
            for kind, hook_name in KINDS.items():
                if kind not in self.kinds:
                    continue
                for impl in getattr(self.pm.hook, hook_name).get_hookimpls():
                    if impl.plugin_name == name:
                        impl.function(register=self._register_callback(kind, info))
        except Exception as e:
            self._forget(name)
            self._failed(info, e)
            return None
        return info

    def _register_callback(self, kind, info: PluginInfo):
        def register(name, obj, description="", aliases=()):
            _check_item(kind, name, obj)
            if not description:  # its docstring's first line, read when listed
                description = obj.first_doc_line if isinstance(obj, Lazy) else \
                    (lambda: _first_doc_line(obj))
            self.registries[kind].add(
                Entry(name=name, target=obj, description=description,
                      source=info.source, version=info.version, plugin=info.name,
                      aliases=tuple(aliases))
            )
            info.items.setdefault(kind, []).append(name)
        return register

    def _failed_plugins(self) -> list[PluginInfo]:
        return [info for info in self.plugins.values() if info.status == "failed"]

    def _failed(self, info: PluginInfo, error: BaseException):
        info.status, info.error, info.items = "failed", _one_line(error), {}
        if self.strict:
            raise ExoframeError(
                f"plugin '{info.name}' ({info.source} {info.version}) failed to load: "
                f"{info.error} (strict plugin mode; unset {STRICT_ENV}, or skip the plugin "
                f"with {DISABLE_ENV}={info.name})")

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
                other = self.plugins[ep.name]
                if other.source != source:  # two packages, one plugin name: keep the first
                    info = self.plugins[f"{ep.name} ({source})"] = PluginInfo(
                        name=ep.name, source=source, version=version)
                    self._failed(info, ExoframeError(
                        f"plugin name '{ep.name}' is already taken by {other.source}."))
                continue
            if ep.name in self.disabled or source in self.disabled:
                self.plugins[ep.name] = PluginInfo(name=ep.name, source=source,
                                                   version=version, status="disabled")
                continue
            try:
                plugin = ep.load()
            except Exception as e:
                info = self.plugins[ep.name] = PluginInfo(name=ep.name, source=source,
                                                          version=version)
                self._failed(info, e)
                continue
            self.register(plugin, name=ep.name, source=source, version=version)
            info = self.plugins[ep.name]
            info.warning = api_mismatch(plugin, info)
            if info.warning and info.status == "failed":
                info.error += f" ({info.warning})"  # the likely reason
            elif info.warning and info.name not in _warned:
                _warned.add(info.name)
                print(f"warning: {info.warning}", file=sys.stderr)

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

    @property
    def sinks(self) -> Registry:
        return self.registries["sinks"]

    @property
    def optimizers(self) -> Registry:
        return self.registries["optimizers"]

    @property
    def commands(self) -> Registry:
        return self.registries["commands"]


def _check_item(kind: str, name, obj):
    import click

    if not isinstance(name, str) or not name:
        raise ExoframeError(f"registered a {SINGULAR[kind]} whose name is {name!r}, not a string.")
    if isinstance(obj, Lazy):
        return  # checked where it is used, once loaded
    if kind == "commands" and not isinstance(obj, click.Command):
        raise ExoframeError(f"command '{name}' is {type(obj).__name__}, not a click.Command.")
    if kind in ("sinks", "workloads", "algorithms", "optimizers") and not callable(obj):
        raise ExoframeError(f"{SINGULAR[kind]} '{name}' is {type(obj).__name__}, not callable.")


def api_mismatch(plugin, info: PluginInfo) -> str:
    """Why the plugin may not work with this exoframe, from its EXOFRAME_PLUGIN_API, or ''."""
    from packaging.specifiers import InvalidSpecifier, SpecifierSet

    declared = getattr(plugin, "EXOFRAME_PLUGIN_API", None)
    if declared is None:
        return ""
    where = f"plugin '{info.name}' ({info.source} {info.version})"
    try:
        if str(hookspecs.PLUGIN_API) in SpecifierSet(str(declared)):
            return ""
    except InvalidSpecifier:
        return (f"{where} declares EXOFRAME_PLUGIN_API = {shorten(declared)}, not a version "
                "specifier such as '>=2,<3'.")
    return (f"{where} works with exoframe plugin API {declared}, but exoframe "
            f"{_exoframe_version()} has plugin API {hookspecs.PLUGIN_API}: it may fail; "
            f"install a version of {info.source} made for it.")


def disabled_from_env() -> set:
    return {name.strip() for name in os.environ.get(DISABLE_ENV, "").split(",") if name.strip()}


def strict_from_env() -> bool:
    return os.environ.get(STRICT_ENV, "").strip().lower() not in ("", "0", "false", "no")


def _one_line(exc: BaseException) -> str:
    if isinstance(exc, ExoframeError):
        return str(exc)
    return "".join(traceback.format_exception_only(type(exc), exc)).strip().splitlines()[-1]


def _first_doc_line(obj) -> str:
    doc = (getattr(obj, "__doc__", None) or "").strip()
    return doc.splitlines()[0] if doc else ""


def _exoframe_version() -> str:
    try:
        return importlib.metadata.version("exoframe")
    except importlib.metadata.PackageNotFoundError:
        return "dev"


_warned: set = set()  # plugins whose API warning this process printed
_manager: PluginManager | None = None
_command_manager: PluginManager | None = None


def get_command_manager() -> PluginManager:
    """Built-in and plugin commands only, for the command line's help and dispatch: it does
    not import the built-in strategies and workloads (nor torch through them)."""
    global _command_manager
    if _command_manager is None:
        _command_manager = _manager or PluginManager(kinds={"commands"})
    return _command_manager


def get_plugin_manager() -> PluginManager:
    """The process-wide manager: built-ins plus installed entry points, loaded once. In strict
    mode a plugin that fails to load raises ExoframeError here."""
    global _manager
    if _manager is None:
        _manager = PluginManager()
    return _manager
