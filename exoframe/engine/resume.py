"""`exoframe resume RUN_DIR`: go on with a run from its latest checkpoint, in its folder.

The run is rebuilt from its config.yaml (the config it ran), with more steps if asked;
every rank starts from its saved state and the simulator from the inputs it had seen
(engine/checkpoint.py), so the rows, clocks and weights are those of a run that never
stopped. Sinks go on in the same folder."""
from __future__ import annotations

from pathlib import Path

from ..config import config_to_dict, resolve_config
from ..errors import ExoframeError
from .checkpoint import Checkpoint, CheckpointFolder, identity
from .job import job_from_config
from .run import RunResult, execute


def resume(run_dir, steps: int | None = None, progress="off",
           progress_every: float = 30.0) -> RunResult:
    run_dir = Path(run_dir)
    checkpoint = latest_checkpoint(run_dir)
    overrides = {"steps": steps, "epochs": None} if steps is not None else {}
    config = resolve_config(run_dir / "config.yaml", overrides)
    if config.workload == "custom":
        raise ExoframeError(f"{run_dir}: its workload was given in Python; resume it there: "
                            "Trainer.fit(..., resume=RUN_DIR).")
    job = job_from_config(config)
    check_resumable(job, checkpoint, run_dir)
    return execute(job, config_record=config_to_dict(config), progress=progress,
                   progress_every=progress_every, resume_dir=run_dir)


def latest_checkpoint(run_dir: Path) -> Checkpoint:
    if not (run_dir / "config.yaml").is_file():
        raise ExoframeError(f"{run_dir}: not a run folder (it has no config.yaml); give the "
                            "folder that `exoframe run` printed.")
    checkpoint = CheckpointFolder(run_dir).latest()
    if checkpoint is None:
        raise ExoframeError(f"{run_dir}: the run saved no checkpoint; runs save them with "
                            "--checkpoint-every N.")
    return checkpoint


def check_resumable(job, checkpoint, run_dir):
    """Set `job` to resume from `checkpoint`, once they agree."""
    if job.steps <= checkpoint.step:
        raise ExoframeError(f"{run_dir}: its checkpoint is at step {checkpoint.step} and the "
                            f"run asks for {job.steps} steps; give more steps (--steps M) to "
                            "train on.")
    made, now = checkpoint.run, identity(job)
    if (made["nodes"], made["strategy"]) != (now["nodes"], now["strategy"]):
        raise ExoframeError(
            f"{run_dir}: its checkpoint is of '{made['strategy']}' on {made['nodes']} nodes, "
            f"but the run now asks for '{now['strategy']}' on {now['nodes']}; a checkpoint "
            "resumes only the run that made it.")
    if made["setup"] != now["setup"]:
        raise ExoframeError(
            f"{run_dir}: its network, stragglers, faults or seed differ from those the "
            f"checkpoint was made with (network '{made['net']}', now '{now['net']}'); resume "
            "from the folder the run was started in, with the same network file.")
    if made["steps"] != now["steps"] and made["schedule"] != "constant":
        raise ExoframeError(
            f"{run_dir}: its '{made['schedule']}' learning-rate schedule runs over "
            f"{made['steps']} steps; training on to {now['steps']} would change the rate of "
            "the steps to come (a schedule is set by the run's length). Extend runs with a "
            "constant schedule, or start a longer run.")
    job.resume_from = checkpoint
