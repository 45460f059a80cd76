"""Flags and checks the commands share."""
from __future__ import annotations

import os
from pathlib import Path

import click

from ..errors import ExoframeError


def config_file_option(help_text: str):
    return click.option("--config", "config_file", type=click.Path(dir_okay=False),
                        help=help_text)


def figure_formats_option(help_text: str = "Figure formats, comma-separated: png, pdf, svg."):
    return click.option("--format", "formats", default="png", show_default=True,
                        metavar="FORMATS", help=help_text)


def debug_option(help_text: str = "Show full tracebacks."):
    return click.option("--debug", is_flag=True, help=help_text)


def progress_options(command):
    command = click.option(
        "--progress-every", type=click.FloatRange(min=0), default=30.0, show_default=True,
        metavar="SECONDS", help="Without a terminal, print a progress line (step, loss, "
        "simulated time) this often; 0: never.")(command)
    return click.option("--progress/--no-progress", default=None,
                        help="Progress bar. [a bar in a terminal, else lines]")(command)


def progress_mode(flag, every: float) -> str:
    from ..engine.launch.progress import default_mode

    return default_mode(every) if flag is None else "bar" if flag else "off"


def check_out_folder(folder, flag: str):
    """Refuse an output folder that cannot be made or written, before anything runs."""
    path = Path(folder)
    existing = path
    while not existing.exists():
        if existing.is_symlink():
            raise ExoframeError(f"{flag} {folder}: {existing} is a broken link; give another "
                                "folder.")
        existing = existing.parent
    if not existing.is_dir():
        where = "is a file" if existing == path else f"is under {existing}, a file"
        raise ExoframeError(f"{flag} {folder}: {where}; give a folder.")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ExoframeError(f"{flag} {folder}: {existing} is not writable; give a folder you "
                            "can write to.")


def projection_from_flags(project_params, step_time, payload_bits, bucket_mb):
    from ..experiments.run_replays import Projection
    from ..sim.network.units import parse_seconds

    if project_params is None and step_time is None:
        for flag, value in (("--payload-bits", payload_bits), ("--bucket-mb", bucket_mb)):
            if value is not None:
                raise ExoframeError(f"{flag} is a projection parameter: give --project-params "
                                    "(e.g. 1e9) and --step-time (e.g. 0.5s) with it.")
        return None
    if project_params is None or step_time is None:
        raise ExoframeError("a projection needs both --project-params (e.g. 1e9) and "
                            "--step-time (e.g. 0.1s or 100ms).")
    seconds = parse_seconds(step_time, "--step-time", "projection")
    extras = {"payload_bits": payload_bits, "bucket_mb": bucket_mb}
    return Projection(project_params, seconds, **{k: v for k, v in extras.items() if v is not None})


def projection_options(command):
    """The projection flags, shared by `sweep` and `replay`."""
    options = [
        click.option("--project-params", type=float, metavar="P", help=(
            "Answer for a model of P parameters instead of the one trained: every exchange's "
            "bytes are scaled by P / (the trained model's parameters) × --payload-bits / 32, "
            "and every rank's compute by one factor so that a step computes for --step-time "
            "on average. DDP's gradient all-reduce, and an outer sync the strategy declares "
            "overlappable (diloco's), are split into --bucket-mb buckets that go one after "
            "another on one communication stream per rank during the backward pass (taken as "
            "2/3 of the step): bucket i+1 starts once bucket i is done and its gradients are "
            "ready, so each bucket pays the collective's latency. Assumes payloads scale "
            "linearly with parameters, the optimizer's time is inside --step-time, and the "
            "network and algorithms are the ones named. Needs --step-time.")),
        click.option("--step-time", metavar="TIME",
                     help="Compute time of one training step of the projected model (e.g. 0.5s)."),
        click.option("--payload-bits", type=float, metavar="BITS", help=(
            "Bits per value on the wire in the projection: 16 for bf16, 8 or 4 for quantized "
            "exchanges; scales the bytes of every operation of the trace (taken as fp32), "
            "indices and a strategy's own encoding included. [32]")),
        click.option("--bucket-mb", type=float, metavar="MiB", help=(
            "Bucket size of a projected streamed all-reduce, in MiB of payload (torch's "
            "bucket_cap_mb). [25]")),
    ]
    for option in reversed(options):
        command = option(command)
    return command
