"""exoframe-wandb: the `wandb` metrics sink.

`exoframe run --sink jsonl --sink wandb` (or `sinks: [jsonl, wandb]` in a config file) logs
every step's metrics to a Weights & Biases run named after the run folder, with the run's
config, and puts the run's summary (status, final losses, ...) into the wandb summary.

The default mode is "offline": no account and no network; wandb writes the run into the run
folder (RUN_FOLDER/wandb/offline-run-*/), and `wandb sync` uploads it later. Options:

    --sink wandb:project=NAME,entity=TEAM,mode=offline|online|disabled,name=RUN,group=G,tags=a;b,dir=PATH

wandb is imported when the sink opens, not when the plugin loads, so `exoframe --help` and
runs without this sink do not pay for it.
"""
from pathlib import Path

import exoframe
from exoframe.errors import ExoframeError, shorten

EXOFRAME_PLUGIN_API = ">=2,<3"

MODES = ("offline", "online", "disabled")


class WandbSink:
    """A wandb run per exoframe run: each step's metrics, the config and the summary."""

    def __init__(self, run, project: str = "exoframe", entity: str = None,
                 mode: str = "offline", name: str = None, group: str = None, tags=None,
                 dir: str = None):
        """project, entity: where the run goes; mode: offline (the default: no account, no
        network; upload later with `wandb sync`), online or disabled; name: the wandb run's
        name (default: the run folder's); group; tags: a list, or names separated by ';' or
        ','; dir: the folder wandb writes into, relative to the run folder (default: the run
        folder itself)."""
        if mode not in MODES:
            raise ExoframeError(f"sink 'wandb': option 'mode' is {shorten(mode)}; choose one "
                                f"of {', '.join(MODES)} (--sink wandb:mode=offline).")
        folder = Path(run.dir) / dir if dir else Path(run.dir)
        folder.mkdir(parents=True, exist_ok=True)

        import wandb  # here, not at the top: loading the plugin stays cheap

        self.run = wandb.init(
            project=project, entity=entity, mode=mode, name=name or run.name, group=group,
            tags=split_tags(tags), dir=folder, config=dict(run.config),
            # A new wandb run for every exoframe run (a sweep, a notebook), leaving any
            # other wandb run in this process alone; this sink finishes its own.
            reinit="create_new",
            settings=wandb.Settings(
                console="off",  # the ranks' output stays the terminal's
                silent=True,  # no banner or links among exoframe's progress bar
                x_disable_stats=True,  # no system-metrics sampler in the launcher
                x_disable_machine_info=True,  # no hardware or cloud-metadata probing
            ))
        self.finished = False

    def write(self, row: dict):
        metrics = {key: value for key, value in row.items()
                   if key != "step" and value is not None}
        self.run.log(metrics, step=row["step"])

    def finish(self, summary: dict):
        """The summary's scalars (status, final_loss, ...) into the wandb summary, then the
        wandb run finishes: exit code 0 if the exoframe run completed, else 1."""
        self.run.summary.update({key: value for key, value in summary.items()
                                 if isinstance(value, (str, int, float))})
        self._finish(0 if summary.get("status") == "completed" else 1)

    def close(self):
        self._finish(1)  # closed without a summary: the run did not complete

    def _finish(self, exit_code: int):
        if not self.finished:
            self.finished = True
            self.run.finish(exit_code=exit_code)


def split_tags(tags) -> list | None:
    """tags as a list: 'a;b' and 'a,b' (a string) or [a, b] (YAML)."""
    if tags is None:
        return None
    if isinstance(tags, str):
        tags = tags.replace(";", ",").split(",")
    return [str(tag).strip() for tag in tags if str(tag).strip()]


@exoframe.hookimpl
def exoframe_register_sinks(register):
    register("wandb", WandbSink,
             description="each step's metrics to a Weights & Biases run (offline by default; "
                         "`wandb sync` uploads it)")
