"""The `exoframe` command line: the group, and the one error boundary (main).

The group is group.py; the commands live beside it, one module per family, named for its
command: run_command.py (`run`, `resume`), sweep_command.py (`sweep`, `replay`),
report_command.py (`report`), timeline_command.py (`timeline`), emulate_command.py
(`emulate`); listings.py holds what is installed and `new-plugin`;
config_flags.py makes the flags of RunConfig's fields, options.py holds the other flags and
checks they share, start_up.py imports the engine for the commands that train. Plugins add
commands through the same hook (exoframe.cli.commands).
"""
from __future__ import annotations

import atexit
import json
import os
import sys
import threading
import traceback

import click

from ..engine.ipc.stop_signals import catch_stop_signals, restore_signals, stopped_by
from ..errors import ExoframeError, RunInterrupted, RunStopped, shorten
from ..files import describe_os_error
from .group import cli

MAX_MESSAGE = 1000  # characters of an error line; values inside are cut at 200 already


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    debug = "--debug" in argv
    previous = catch_stop_signals()  # (in every phase of every command, not only in a run)
    try:
        cli.main(args=argv, prog_name="exoframe", standalone_mode=False)
    except click.ClickException as e:
        e.show()
        sys.exit(e.exit_code)
    except (click.Abort, KeyboardInterrupt) as e:
        stop = e.__cause__ if isinstance(e, click.Abort) else e  # (click wraps it in Abort)
        click.echo(f"interrupted{stopped_by(stop) if stop is not None else ''}", err=True)
        sys.exit(130)
    except ExoframeError as e:
        if e.details and (debug or not e.user_error):
            click.echo(e.details.rstrip(), err=True)
        elif debug:
            traceback.print_exc()
        _error_line(str(e))
        interrupted = isinstance(e, RunInterrupted) or \
            isinstance(e, RunStopped) and e.interrupted
        sys.exit(130 if interrupted else (2 if e.user_error else 1))
    except Exception as e:  # the one boundary: one line, the traceback only with --debug
        if debug:
            traceback.print_exc()
        _error_line(_describe(e))
        sys.exit(2 if isinstance(e, (OSError, UnicodeDecodeError, json.JSONDecodeError))
                 else 1)
    finally:
        restore_signals(previous)


def entry():
    """The `exoframe` command: main(), then an exit that skips tearing down the
    interpreter's modules, which after torch's takes about a second of every command. What
    a run writes is closed by then (files are written whole, sinks closed); exit handlers
    still run."""
    try:
        main()
        code = 0
    except SystemExit as e:
        code = e.code
    if isinstance(code, str):
        click.echo(code, err=True)
        code = 1
    code = code or 0
    # Threads an --in-process run's own code left running were named in a warning then
    # (engine/node/node_globals.py): the command does not wait for them.
    run_globals = sys.modules.get("exoframe.engine.node.node_globals")
    left = set(run_globals.LEFT_RUNNING) if run_globals is not None else set()
    others = [t for t in threading.enumerate()
              if t is not threading.main_thread() and t not in left]
    if any(t.is_alive() and not t.daemon for t in others):
        sys.exit(code)  # a thread still working: the usual exit waits for it
    atexit._run_exitfuncs()  # (what `sys.exit` would run: logging, multiprocessing, plugins)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _error_line(message: str):
    line = " ".join(message.split())
    if len(line) > MAX_MESSAGE:
        line = f"{line[:MAX_MESSAGE]}... (cut)"
    click.echo(f"error: {line}", err=True)


def _describe(e: Exception) -> str:
    import yaml

    if isinstance(e, OSError):
        return describe_os_error(e)
    if isinstance(e, UnicodeDecodeError):
        return "a file is not UTF-8 text (binary?); give a text file (--debug names it)."
    if isinstance(e, json.JSONDecodeError):
        return (f"malformed JSON (line {e.lineno}): {e.msg}; the file is truncated or corrupt "
                "(--debug names it).")
    if isinstance(e, yaml.YAMLError):
        return f"malformed YAML: {shorten(str(e))}"
    return (f"unexpected {type(e).__name__}: {shorten(str(e))}. Run again with --debug for "
            "the traceback, and report it if the input looks right.")


from . import (emulate_command, listings, report_command, run_command,  # noqa: E402,F401
               sweep_command, timeline_command)  # noqa: E402,F401 - each adds one
