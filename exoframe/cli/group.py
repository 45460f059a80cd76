"""The `exoframe` click group, which also offers the commands plugins register."""
from __future__ import annotations

import os

import click

from .. import __version__
from ..errors import ExoframeError
from .options import debug_option


class PluginGroup(click.Group):
    """A click group that also resolves plugin commands, loading plugins only when a name is
    not one of its own commands."""

    def invoke(self, ctx):
        # The group's options are parsed by now; plugins are not loaded yet.
        if ctx.params.get("strict_plugins"):
            from ..plugins import STRICT_ENV

            os.environ[STRICT_ENV] = "1"
        return super().invoke(ctx)

    def get_command(self, ctx, name):
        command = super().get_command(ctx, name)
        if command is None:
            from ..plugins import get_command_manager

            entry = get_command_manager().commands.get_entry_or_none(name)
            command = entry.obj if entry else None
        return command

    def list_commands(self, ctx):
        from ..plugins import get_command_manager

        try:
            plugin_commands = [entry.name for entry in get_command_manager().commands]
        except ExoframeError:  # strict mode and a broken plugin: still list our own
            plugin_commands = []
        return sorted({*super().list_commands(ctx), *plugin_commands})


@click.group(cls=PluginGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", prog_name="exoframe",
                      message="%(prog)s %(version)s")
@click.option("--strict-plugins", is_flag=True,
              help="A plugin that fails to load is an error (also: EXOFRAME_STRICT_PLUGINS=1).")
@debug_option("Show full tracebacks of errors.")
def cli(strict_plugins, debug):
    """Simulate distributed training of PyTorch models on one machine."""
