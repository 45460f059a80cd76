"""`exoframe resume RUN_DIR`: go on with a run from its latest checkpoint, in its folder.

The run is rebuilt from its config.yaml (the config it ran), with more steps if asked;
every rank starts from its saved state and the simulator from the inputs it had seen
(engine/checkpoint.py), so the rows, clocks and weights are those of a run that never
stopped. Sinks go on in the same folder."""
from __future__ import annotations

from pathlib import Path

from ..config import config_to_dict, load_yaml, resolve_config
from ..errors import ExoframeError
from .checkpoint import Checkpoint, CheckpointFolder
from .job import job_from_config
from .run import RunResult, execute


def resume(run_dir, steps: int | None = None, progress="off",
           progress_every: float = 30.0) -> RunResult:
    run_dir = Path(run_dir)
    checkpoint = latest_checkpoint(run_dir)
    if load_yaml(run_dir / "config.yaml").get("workload") == "custom":
        raise ExoframeError(f"{run_dir}: its workload was given in Python; resume it there: "
                            "Trainer.fit(..., resume=RUN_DIR).")
    overrides = {"steps": steps, "epochs": None} if steps is not None else {}
    config = resolve_config(run_dir / "config.yaml", overrides)
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
    if (checkpoint.nodes, checkpoint.strategy) != (job.nodes, job.strategy_name):
        raise ExoframeError(
            f"{run_dir}: its checkpoint is of '{checkpoint.strategy}' on {checkpoint.nodes} "
            f"nodes, but config.yaml now says '{job.strategy_name}' on {job.nodes}; a "
            "checkpoint resumes only the run that made it.")
    job.resume_from = checkpoint
