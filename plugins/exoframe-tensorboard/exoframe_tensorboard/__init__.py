"""exoframe-tensorboard: the `tensorboard` metrics sink.

`exoframe run --sink jsonl --sink tensorboard` (or `sinks: [jsonl, tensorboard]` in a config
file) writes TensorBoard event files, through torch.utils.tensorboard.SummaryWriter: a
relative LOGDIR is a folder of the run folder, which holds that one run (runs/<run>/tb); an
absolute one is shared by many runs, each in LOGDIR/<run name>, separate runs in
TensorBoard.

    tensorboard --logdir runs/<run folder>/tensorboard    # one run
    exoframe run ... --sink tensorboard:logdir=/tmp/tb     # many runs, one logdir

Options (`--sink tensorboard:logdir=tb,flush_secs=5`, or `{tensorboard: {logdir: tb}}`):
  logdir      default "tensorboard", relative to the run folder; an absolute path is kept
              (and the run writes into LOGDIR/<run name>).
  flush_secs  how often, in seconds, events are written to disk (default 10).

What it writes:
  - every metric of a step's row as a scalar under its own name (loss, val_loss, lr,
    sim_time, ...) at that step; None values are left out;
  - each event's wall time is the time the run started plus the step's simulated time
    (row["sim_time"]), so TensorBoard's "Relative" x-axis shows simulated seconds, counted
    from each series' first point (loss from step 1, val_loss from the first evaluation);
  - at the end, summary.json's top-level numbers as scalars "summary/<key>" (final_loss,
    simulated_seconds, compute_utilization, ...), summary.json itself as the text
    "summary", and the run's config (flattened: workload_params.hidden; lists as JSON;
    null values left out) plus "status" (completed, failed or interrupted) as hparams,
    with the session status success (completed) or failure in TensorBoard's HParams tab.
"""
import json
import math
import textwrap
import time
from functools import partial
from pathlib import Path

import exoframe
from exoframe.errors import shorten

EXOFRAME_PLUGIN_API = ">=2,<3"


class TensorBoardSink:
    """TensorBoard event files: metrics as scalars, config and status as hparams."""

    def __init__(self, run, logdir: str = "tensorboard", flush_secs=10):
        flush_secs = positive_number("flush_secs", flush_secs)
        # torch.utils.tensorboard takes 0.6 s to import: only when the sink is used.
        from torch.utils.tensorboard import SummaryWriter

        self.config = run.config
        # An absolute logdir replaces the run folder: Path("/run") / "/tmp/tb" is /tmp/tb;
        # shared by runs, it takes each in a folder named after it.
        given = Path(logdir).expanduser()
        self.logdir = given / run.name if given.is_absolute() else Path(run.dir) / given
        self.logdir.mkdir(parents=True, exist_ok=True)
        self.start = time.time()
        self.walltime = self.start  # start + the last simulated time seen
        self.last_step = 0
        # The writer starts a thread that flushes events; it is made on first use, after the
        # ranks were forked from this process, so that no rank is forked with it running.
        self._new_writer = partial(SummaryWriter, str(self.logdir), flush_secs=flush_secs)
        self._writer = None

    @property
    def writer(self):
        if self._writer is None:
            self._writer = self._new_writer()
        return self._writer

    def write(self, row: dict):
        if row.get("sim_time") is not None:
            self.walltime = self.start + row["sim_time"]
        for name, value in row.items():
            if name != "step" and value is not None:
                self.writer.add_scalar(name, value, row["step"], walltime=self.walltime)
        self.last_step = row["step"]

    def finish(self, summary: dict):
        step, walltime = self.last_step, self.walltime
        for name, value in summary.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                self.writer.add_scalar(f"summary/{name}", value, step, walltime=walltime)
        text = json.dumps(summary, indent=2, default=str)
        self.writer.add_text("summary", textwrap.indent(text, "    "), step, walltime=walltime)
        status = summary.get("status", "unknown")
        hparams = {**flatten(self.config), "status": status}
        for pb in hparams_summaries(hparams, status, self.start):
            self.writer.file_writer.add_summary(pb, step, walltime)

    def close(self):
        if self._writer is not None:
            self._writer.close()  # flushes


def positive_number(name: str, value) -> float:
    """value (a string from the command line, a number from YAML) as a positive float."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = math.nan
    if isinstance(value, bool) or not math.isfinite(number) or number <= 0:
        raise exoframe.ExoframeError(
            f"sink 'tensorboard': {name} must be a positive number of seconds, e.g. "
            f"{name}=10; got {shorten(value)}.")
    return number


def flatten(config: dict, prefix: str = "") -> dict:
    """The config as hparams: nested keys joined by ".", lists and other values as JSON
    text, None left out (the HParams tab shows it empty)."""
    flat = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten(value, f"{name}."))
        elif isinstance(value, (bool, int, float, str)):
            flat[name] = value
        elif value is not None:
            flat[name] = json.dumps(value, default=str)
    return flat


def hparams_summaries(hparams: dict, status: str, start_time: float) -> list:
    """The HParams plugin's session start (the hparams) and end (the status) summaries.

    No experiment summary is written: TensorBoard then gathers the hparams of every run in
    the logdir, and takes every scalar as a metric, so runs with different configs mix."""
    from tensorboard.compat.proto.summary_pb2 import Summary
    from tensorboard.plugins.hparams import api_pb2, metadata, plugin_data_pb2, summary_v2

    end = plugin_data_pb2.SessionEndInfo(
        status=api_pb2.STATUS_SUCCESS if status == "completed" else api_pb2.STATUS_FAILURE,
        end_time_secs=time.time())
    end_pb = Summary()
    end_pb.value.add(tag=metadata.SESSION_END_INFO_TAG, tensor=metadata.NULL_TENSOR,
                     metadata=metadata.create_summary_metadata(
                         plugin_data_pb2.HParamsPluginData(session_end_info=end)))
    return [summary_v2.hparams_pb(hparams, start_time_secs=start_time), end_pb]


@exoframe.hookimpl
def exoframe_register_sinks(register):
    register("tensorboard", TensorBoardSink,
             description="TensorBoard event files (logdir=, flush_secs=): metrics as "
                         "scalars, config and status as hparams")
