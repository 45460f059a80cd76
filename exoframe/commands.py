"""Command-line commands as plugins: the `exoframe` group offers, next to its own commands,
every command a plugin registers through `exoframe_register_commands`.

The built-in commands are registered through the same hook, so a plugin command that
reuses a built-in name is reported as a duplicate naming both packages.
"""
from __future__ import annotations

import os

import click

from .errors import ExoframeError
from .hookspecs import hookimpl


class PluginGroup(click.Group):
    """A click group that also resolves plugin commands, loading plugins only when a name is
    not one of its own commands."""

    def invoke(self, ctx):
        # The group's options are parsed by now; plugins are not loaded yet.
        if ctx.params.get("strict_plugins"):
            from .plugins import STRICT_ENV

            os.environ[STRICT_ENV] = "1"
        return super().invoke(ctx)

    def get_command(self, ctx, name):
        command = super().get_command(ctx, name)
        if command is None:
            from .plugins import get_command_manager

            entry = get_command_manager().commands.get_entry_or_none(name)
            command = entry.obj if entry else None
        return command

    def list_commands(self, ctx):
        from .plugins import get_command_manager

        try:
            plugin_commands = [entry.name for entry in get_command_manager().commands]
        except ExoframeError:  # strict mode and a broken plugin: still list our own
            plugin_commands = []
        return sorted({*super().list_commands(ctx), *plugin_commands})


@hookimpl
def exoframe_register_commands(register):
    from .cli import cli

    for name, command in cli.commands.items():
        register(name, command, description=command.get_short_help_str(limit=100))


def format_plugins(infos) -> str:
    """`exoframe plugins`: one line per plugin, then what each implemented hook registered."""
    from .plugins import KINDS

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
