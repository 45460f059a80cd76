"""`exoframe resume RUN_DIR`: go on with a run from its latest checkpoint, in its folder.

The run is rebuilt from its config.yaml (the config it ran), with more steps if asked;
every rank starts from its saved state and the simulator from the inputs it had seen
(engine/records/checkpoint.py), so the rows, clocks and weights are those of a run that never
stopped. Sinks go on in the same folder.

A resume touches nothing until it can resume: it takes the folder's lock (a run still going
there refuses it, engine/records/run_lock.py), reads the checkpoint back whole (its rows those of
steps 1..its step) and checks that the config is the one it was made with (a checkpoint of
an earlier version records none: the model and optimizer state it holds are checked). The
folder's records (config.yaml, metrics, summary) are replaced only once the resume has
finished its first step (engine/run.py)."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from ..config import resolve_config
from ..errors import ExoframeError, shorten
from .plan.resolve import job_from_config
from .records import rank_state
from .records.checkpoint import (MAY_CHANGE_ON_RESUME, Checkpoint, CheckpointFolder,
                                 config_difference, identity)
from .records.run_lock import RunLock
from .run import RunResult, execute


def resume(run_dir, steps: int | None = None, progress="off",
           progress_every: float = 30.0) -> RunResult:
    run_dir = Path(run_dir)
    check_run_folder(run_dir)  # (before its config.yaml is read)
    overrides = {"steps": steps, "epochs": None} if steps is not None else {}
    config = resolve_config(run_dir / "config.yaml", overrides)
    if config.workload == "custom":
        raise ExoframeError(f"{run_dir}: its workload was given in Python; resume it there: "
                            "Trainer.fit(..., resume=RUN_DIR).")
    job = job_from_config(config)
    return resume_job(job, job.config_record(), run_dir, progress=progress,
                      progress_every=progress_every)


def resume_job(job, config_record: dict, run_dir, **execute_options) -> RunResult:
    """Run `job` on from the latest checkpoint in run_dir, holding the folder throughout."""
    run_dir = Path(run_dir)
    check_run_folder(run_dir)
    with RunLock.take(run_dir):
        checkpoint = latest_checkpoint(run_dir)
        checkpoint.verify()
        job = check_resumable(job, checkpoint, run_dir, config_record)
        if "config" not in checkpoint.run:
            check_held_state(job, checkpoint)
        check_model_state(job, checkpoint)
        return execute(job, config_record=config_record, resume_dir=run_dir,
                       **execute_options)


def check_run_folder(run_dir: Path):
    if not (run_dir / "config.yaml").is_file():
        raise ExoframeError(f"{run_dir}: not a run folder (it has no config.yaml); give the "
                            "folder that `exoframe run` printed.")


def latest_checkpoint(run_dir: Path) -> Checkpoint:
    checkpoint = CheckpointFolder(run_dir).latest()
    if checkpoint is None:
        raise ExoframeError(f"{run_dir}: the run saved no checkpoint; runs save them with "
                            "--checkpoint-every N.")
    return checkpoint


ONLY_THE_RUN = (f"a checkpoint resumes only the run that made it (a resume may change only "
                f"{', '.join(MAY_CHANGE_ON_RESUME)})")


def check_resumable(job, checkpoint, run_dir, config: dict | None = None):
    """`job`, to resume from `checkpoint`, once they agree. config: the resume's config
    as logged, compared field by field with the one the checkpoint was made with."""
    if job.steps <= checkpoint.step:
        raise ExoframeError(f"{run_dir}: its checkpoint is at step {checkpoint.step} and the "
                            f"run asks for {job.steps} steps; give more steps (--steps M) to "
                            "train on.")
    made, now = checkpoint.run, identity(job, config)
    if (made["nodes"], made["strategy"]) != (now["nodes"], now["strategy"]):
        raise ExoframeError(
            f"{run_dir}: its checkpoint is of '{made['strategy']}' on {made['nodes']} nodes, "
            f"but the run now asks for '{now['strategy']}' on {now['nodes']}; {ONLY_THE_RUN}.")
    changed = config_difference(made, now)
    if changed is not None:
        raise ExoframeError(f"{run_dir}: {changed} when the checkpoint at step "
                            f"{checkpoint.step} was made; {ONLY_THE_RUN}.")
    if "model" in made and made["model"] != now["model"]:
        before, after = made["model"]["parameters"], now["model"]["parameters"]
        raise ExoframeError(
            f"{run_dir}: model: the checkpoint's model has {before:,} parameters and this "
            f"run's {after:,}{' in other shapes' if before == after else ''}; {ONLY_THE_RUN}.")
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
    return dataclasses.replace(job, resume_from=checkpoint)


def check_model_state(job, checkpoint: Checkpoint):
    """Every rank's model tensors are those this run builds, named and shaped alike (read
    from the files in place, mmap): otherwise a rank would fail loading them, after the
    run started."""
    shapes = {name: list(t.shape) for name, t in job.model.state_dict().items()}
    for rank in range(job.nodes):
        path = checkpoint.rank_file(rank)
        state = rank_state.load(path, torch.device("cpu"), mmap=True)
        model = state.get("model") if isinstance(state, dict) else None
        if not isinstance(model, dict) or not all(isinstance(t, torch.Tensor)
                                                  for t in model.values()):
            raise ExoframeError(f"checkpoint file {path} does not hold a rank's model as "
                                "exoframe writes it; the run cannot be resumed from it.")
        for name in dict.fromkeys([*shapes, *model]):
            held = list(model[name].shape) if name in model else "none"
            if held != shapes.get(name, "none"):
                raise ExoframeError(
                    f"checkpoint file {path}: tensor '{shorten(name)}' has shape {held} there "
                    f"and {shapes.get(name, 'none')} in this run's model; the file does not fit "
                    "the model (edited or damaged), and the run cannot be resumed from it.")
        del state


def check_held_state(job, checkpoint: Checkpoint):
    """A checkpoint that records no config (an earlier version made it), checked against the
    state it holds: rank 0's model tensors, and its optimizer's groups and settings (all but
    the lr, which the schedule sets), must be those this run builds. Otherwise the ranks
    would fail loading them, or train on with the checkpoint's settings."""
    path = checkpoint.rank_file(0)
    state = rank_state.load(path, torch.device("cpu"), mmap=True)
    where = f"checkpoint {checkpoint.path} records no config (an earlier version made it), and"
    try:
        made_shapes = {name: list(t.shape) for name, t in state["model"].items()}
        made = state["strategy"]["optimizer"]["param_groups"]
        made_sizes = [len(group["params"]) for group in made]
    except (KeyError, TypeError, AttributeError):
        raise ExoframeError(f"checkpoint file {path} does not hold a rank's state as exoframe "
                            "writes it; the run cannot be resumed from it.") from None
    if made_shapes != {name: list(t.shape) for name, t in job.model.state_dict().items()}:
        raise ExoframeError(f"{where} its model's tensors are named or shaped otherwise than "
                            f"this run's; {ONLY_THE_RUN}.")
    name = job.optimizer.name
    trainable = [p for p in job.model.parameters() if p.requires_grad]
    now = job.optimizer.build(trainable, model=job.model).state_dict()["param_groups"]
    if made_sizes != [len(group["params"]) for group in now]:
        raise ExoframeError(f"{where} its optimizer's parameter groups are not those of this "
                            f"run's optimizer '{name}'; {ONLY_THE_RUN}.")
    for before, after in zip(made, now):
        for key in dict.fromkeys([*before, *after]):
            if key not in ("params", "lr") and _plain(before.get(key)) != _plain(after.get(key)):
                raise ExoframeError(
                    f"{where} its optimizer {_setting(before, key)}, but this run's optimizer "
                    f"'{name}' {_setting(after, key)}; {ONLY_THE_RUN}.")


def _setting(group: dict, key: str) -> str:
    return f"has {key}={shorten(group[key])}" if key in group else f"has no {key}"


def _plain(value):
    """A setting as compared: tensors and tuples as lists."""
    if isinstance(value, torch.Tensor):
        return value.tolist()
    return list(map(_plain, value)) if isinstance(value, (tuple, list)) else value
