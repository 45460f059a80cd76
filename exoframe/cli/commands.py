"""Command-line commands as plugins: the `exoframe` group (cli/group.py) offers, next to its
own commands, every command a plugin registers through `exoframe_register_commands`.

The built-in commands are registered through the same hook, so a plugin command that
reuses a built-in name is reported as a duplicate naming both packages.
"""
from __future__ import annotations

from ..hookspecs import hookimpl


@hookimpl
def exoframe_register_commands(register):
    from . import cli

    for name, command in cli.commands.items():
        register(name, command, description=command.get_short_help_str(limit=100))
