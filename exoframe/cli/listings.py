"""What is installed: `exoframe strategies`, `nets`, `plugins`, ...; and `new-plugin`."""
from __future__ import annotations

import importlib.metadata
from pathlib import Path

import click

from ..errors import ExoframeError
from .group import cli


# Listings of what is installed: `exoframe KIND` prints a registry, one line per item.
LISTINGS = {
    "strategies": "List installed strategies: name, description, source package.",
    "workloads": "List installed workloads: name, description, source package.",
    "algorithms": "List collective algorithms (network YAML `algorithm:`): name, aliases, "
                  "source package.",
    "sinks": "List metrics sinks (--sink): name, aliases, source package.",
    "optimizers": "List local optimizers (every torch.optim class, and plugins'): name, "
                  "source package.",
}


def _listing(kind: str, help_text: str):
    def command():
        from ..plugins import PluginManager

        # Only this kind: built-ins register by name (exoframe/builtins.py), so listing them
        # imports no torch (but torch's optimizers are found by importing it).
        _print_registry(PluginManager(kinds={kind}).registries[kind])
    cli.command(name=kind, help=help_text)(command)


for _kind, _help in LISTINGS.items():
    _listing(_kind, _help)


@cli.command()
def nets():
    """List network presets: name, what it models, source package, and the preset's file
    (copy it to make a network of your own; a file without `protocol:` models TCP)."""
    from ..plugins import PluginManager
    from ..sim.network.netconfig import load_network
    from ..sim.network.tcp import parse_protocol

    pm = PluginManager(kinds={"networks"})
    entries = list(pm.networks)
    width = max((len(e.name) for e in entries), default=4)
    for e in entries:
        file = ""
        try:
            net = load_network(e.name, pm.networks)
            line = e.describe() or net.summary()
            tcp = parse_protocol(net.protocol, net.where) is not None
            line += f"  (protocol: {'tcp' if tcp else 'none'})"  # tcp: headers, ACKs, window
            if isinstance(e.obj, (str, Path)):  # a dict registered by a plugin has no file
                file = f"  {e.obj}"
        except ExoframeError as error:
            line = f"broken: {error}"
        click.echo(f"{e.name:<{width}}  {line}  [{e.source}]{file}")


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def plugins(as_json):
    """List plugins: package, version, status (active, failed with its error, disabled) and
    what each registered."""
    import json

    from ..plugins import get_plugin_manager

    infos = get_plugin_manager().plugins.values()
    if as_json:
        click.echo(json.dumps([info.as_dict() for info in infos], indent=2))
    else:
        click.echo(format_plugins(infos))


@cli.command("new-plugin")
@click.argument("name")
@click.option("--dir", "parent", default=".", type=click.Path(file_okay=False),
              show_default=True, help="Where to create the package folder.")
def new_plugin(name, parent):
    """Write a plugin package skeleton exoframe-NAME: a strategy, its entry point and a test."""
    from ..plugins import get_plugin_manager
    from .scaffold import write_skeleton

    taken = get_plugin_manager().strategies.get_entry_or_none(name)
    if taken is not None:
        raise ExoframeError(f"new-plugin: a strategy '{name}' is installed already "
                            f"[{taken.source}]; a plugin of that name would collide with it. "
                            "Choose another name.")
    try:
        installed = importlib.metadata.version(f"exoframe-{name}")
    except importlib.metadata.PackageNotFoundError:
        installed = None
    if installed is not None:
        raise ExoframeError(f"new-plugin: the package exoframe-{name} {installed} is installed "
                            "already; choose another name.")
    folder = write_skeleton(name, parent)
    click.echo(f"wrote {folder}\n  pip install -e {folder}\n  python -m pytest {folder}\n"
               f"  exoframe run --strategy {name} --workload mlp")


def _print_registry(registry):
    entries = list(registry)
    width = max((len(e.name) for e in entries), default=4)
    for e in entries:
        aliases = f" (alias: {', '.join(e.aliases)})" if e.aliases else ""
        click.echo(f"{e.name:<{width}}  {e.describe()}{aliases}  [{e.source}]")


def format_plugins(infos) -> str:
    """`exoframe plugins`: one line per plugin, then what each implemented hook registered."""
    from ..plugins import KINDS

    kind_of_hook = {hook: kind for kind, hook in KINDS.items()}
    infos = list(infos)
    name_width = max((len(i.name) for i in infos), default=4)
    source_width = max((len(f"{i.source} {i.version}") for i in infos), default=4)
    lines = []
    for info in infos:
        status = f"failed: {info.error}" if info.status == "failed" else info.status
        if info.warning:
            status += f" (warning: {info.warning})"
        lines.append(f"{info.name:<{name_width}}  {info.source + ' ' + info.version:<{source_width}}"
                     f"  {status}")
        for hook in info.hooks:
            kind = kind_of_hook.get(hook, hook)
            lines.append(f"    {kind}: {', '.join(info.items.get(kind, [])) or '(none)'}")
    return "\n".join(lines)
