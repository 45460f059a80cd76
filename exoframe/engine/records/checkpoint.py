"""Checkpoints of a run, and resuming from the latest.

A checkpoint at step k is a folder <run>/checkpoints/step-<k>, holding
  rank-<r>.pt     each rank's state at the end of step k: model, strategy (optimizer and
                  its own state), RNG states, data position, precision's loss scale,
                  simulated clock with its trace, traffic counters (rank_state.py)
  launcher.json   what the launcher needs: each rank's simulator inputs up to step k
                  (exoframe.sim.clocks.feed) and the metrics rows of steps 1..k
It is built under .partial-step-<k> and renamed into place once complete, and only then
are older checkpoints removed: a crash at any moment leaves the previous one whole.

A rank saves at the first step end, at or after a multiple of --checkpoint-every, with no
operation in flight (a strategy may keep exchanges open across steps, as streaming DiLoCo
does; those steps are skipped). The launcher commits once every rank saved that step and
the rows up to it are written, so a resumed run has every row before its checkpoint.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import zipfile
from dataclasses import dataclass
from pathlib import Path

from ...errors import ExoframeError
from ...files import sync_folder, write_atomic
from ...report import strict_json

FOLDER = "checkpoints"
FORMAT = 1
_COMMITTED = re.compile(r"step-(\d+)$")
_ANY = re.compile(r"(?:\.partial-)?step-(\d+)$")  # committed or being built


@dataclass
class Checkpoint:
    """A committed checkpoint, as a resumed run reads it."""
    path: Path
    step: int
    run: dict  # the run that made it: see identity()
    sim_inputs: list  # per rank, exoframe.sim.clocks.feed records
    rows: list  # the metrics rows of steps 1..step

    def rank_file(self, rank: int) -> Path:
        return self.path / f"rank-{rank}.pt"

    def verify(self):
        """Every rank's file is there and reads back whole (torch.save writes a zip archive
        with a CRC per entry), before a resume touches anything."""
        for rank in range(int(self.run.get("nodes", 0))):
            path = self.rank_file(rank)
            if not path.is_file():
                raise ExoframeError(f"checkpoint file {path} is missing: the checkpoint is "
                                    "incomplete, and the run cannot be resumed from it.")
            try:
                with zipfile.ZipFile(path) as archive:
                    damaged = archive.testzip()
            except Exception as e:  # (zipfile raises many kinds on a damaged archive)
                damaged = f"{type(e).__name__}: {str(e)[:100]}"
            if damaged is not None:
                raise ExoframeError(f"checkpoint file {path} is corrupt ({damaged} does not read "
                                    "back as written); the run cannot be resumed from it.")


class CheckpointFolder:
    def __init__(self, run_dir):
        self.path = Path(run_dir) / FOLDER

    def staging(self, step: int) -> Path:
        return self.path / f".partial-step-{step}"

    def rank_file(self, step: int, rank: int) -> Path:
        return self.staging(step) / f"rank-{rank}.pt"

    def commit(self, step: int, run: dict, sim_inputs: list, rows: list):
        staging = self.staging(step)
        write_atomic(staging / "launcher.json", strict_json.dumps(
            {"format": FORMAT, "step": step, "run": run, "sim_inputs": sim_inputs,
             "rows": rows}) + "\n")
        sync_folder(staging)  # the ranks' files and launcher.json are on disk
        final = self.path / f"step-{step}"
        os.replace(staging, final)
        sync_folder(self.path)
        for older in self.path.iterdir():  # ranks may be saving a later step meanwhile
            match = _ANY.match(older.name)
            if older != final and match is not None and int(match.group(1)) <= step:
                shutil.rmtree(older, ignore_errors=True)

    def remove_partial(self):
        """Drop the checkpoints being built: after a run stopped, nothing will finish them."""
        for entry in list(self._entries()):
            if entry.name.startswith(".partial-"):
                shutil.rmtree(entry, ignore_errors=True)

    def latest(self) -> Checkpoint | None:
        steps = sorted((int(m.group(1)), p) for p in self._entries()
                       if (m := _COMMITTED.match(p.name)) and (p / "launcher.json").is_file())
        if not steps:
            return None
        step, path = steps[-1]
        state = strict_json.load(path / "launcher.json", "checkpoint")
        if not isinstance(state, dict) or state.get("format") != FORMAT \
                or state.get("step") != step:
            raise ExoframeError(f"checkpoint {path}: launcher.json is not one this version of "
                                "exoframe wrote (format 1); resume it with the version that "
                                "made it.")
        rows = state.get("rows")
        # The rows of steps 1..step, in order: others would leave the resumed metrics out of
        # order, or the launcher waiting for rows that never come.
        if not (isinstance(rows, list) and [isinstance(r, dict) and r.get("step")
                                            for r in rows] == list(range(1, step + 1))):
            count = len(rows) if isinstance(rows, list) else 0
            raise ExoframeError(f"checkpoint {path}: launcher.json holds {count} rows that are "
                                f"not the rows of steps 1..{step}, its step; the checkpoint is "
                                "damaged and the run cannot be resumed from it.")
        return Checkpoint(path, step, state["run"], state["sim_inputs"], rows)

    def _entries(self):
        return self.path.iterdir() if self.path.is_dir() else ()


# A resume may change how long the run goes on, where and how it reports, and how long the
# launcher waits (docs/guides/checkpoints-failures.md); every other field of the config shapes
# the ranks' state or what it means, and must be the checkpoint's.
MAY_CHANGE_ON_RESUME = ("steps", "epochs", "time_budget", "sinks", "out", "hang_timeout",
                        "connect_timeout", "checkpoint_every", "nodes_per_process")


def identity(job, config: dict | None = None) -> dict:
    """What a checkpoint must be resumed with: the same ranks, strategy, schedule length,
    model (its tensors' names and shapes), config (as config.yaml logs it, less
    MAY_CHANGE_ON_RESUME), and simulated network, stragglers and seed (a digest: the
    simulator's inputs are replayed through it)."""
    sim = job.sim
    # faults only when there are: checkpoints made before they existed keep their identity
    faults = (job.faults.describe(),) if job.faults.active else ()
    nic_traces = (sim.topology.nic_trace,) if any(sim.topology.nic_trace) else ()  # likewise
    setup = repr((sim.topology, sorted(sim.algorithms), sim.stragglers, job.seed, *faults,
                  *nic_traces))
    shapes = [(name, list(tensor.shape)) for name, tensor in job.model.state_dict().items()]
    made = {"nodes": job.nodes, "strategy": job.strategy_name, "steps": job.steps,
            "schedule": job.schedule, "net": sim.net,
            "setup": hashlib.sha256(setup.encode()).hexdigest()[:16],
            "model": {"parameters": sum(p.numel() for p in job.model.parameters()),
                      "shapes": hashlib.sha256(repr(shapes).encode()).hexdigest()[:16]}}
    if config is not None:  # as launcher.json will hold it
        made["config"] = json.loads(strict_json.dumps(
            {k: v for k, v in config.items() if k not in MAY_CHANGE_ON_RESUME}))
    return made


# What config.yaml records as the Job resolved it (plan/job.py, config_record). A checkpoint
# an earlier exoframe made of a sweep's run or of Trainer.fit recorded these as given: None
# where not given (what it resolved to then, it resolves to now), the strategy's parameters
# given only, the strategy's name as written (nodes and strategy are compared apart).
RESOLVED_FIELDS = ("batch_size", "lr", "eval_every")


def config_difference(made: dict, now: dict) -> str | None:
    """The first field of the checkpoint's config that the resume changes, as a phrase."""
    if "config" not in made or "config" not in now:  # (a checkpoint of an earlier version)
        return None
    for key in dict.fromkeys([*made["config"], *now["config"]]):
        before, after = made["config"].get(key), now["config"].get(key)
        if key == "strategy" or key in RESOLVED_FIELDS and before is None:
            continue
        if key == "strategy_params" and isinstance(before, dict) and isinstance(after, dict):
            after = {name: after.get(name) for name in before}
        if before != after:
            return f"{key} is {_shown(after)} now but was {_shown(before)}"
    return None


def _shown(value) -> str:
    return repr(value) if not isinstance(value, dict) else \
        "{" + ", ".join(f"{k}={v!r}" for k, v in value.items()) + "}"


class Commits:
    """The launcher's side: which ranks saved which step; commit a step once complete."""

    def __init__(self, folder: CheckpointFolder, job, config: dict | None = None):
        self.folder, self.nodes, self.run = folder, job.nodes, identity(job, config)
        self.saved: dict[int, dict[int, int]] = {}  # step -> rank -> its simulator inputs then
        self.committed = 0  # the latest step committed by this run

    def rank_saved(self, rank: int, step: int, inputs_so_far: int):
        self.saved.setdefault(step, {})[rank] = inputs_so_far

    def commit_ready(self, rows_written: int, rows: list, sim_log: list):
        """rows_written: the rows of steps 1..rows_written are written (rows[:rows_written])."""
        for step in sorted(self.saved):
            cuts = self.saved[step]
            if len(cuts) < self.nodes:
                continue
            if step > rows_written:
                return
            del self.saved[step]
            for older in [s for s in self.saved if s < step]:  # ranks that saved elsewhere
                del self.saved[older]
            try:
                self.folder.commit(step, self.run,
                                   [sim_log[r][:cuts[r]] for r in range(self.nodes)],
                                   rows[:step])
                self.committed = step
            except OSError as e:
                raise ExoframeError(f"the checkpoint at step {step} could not be written in "
                                    f"{self.folder.path}: {e.strerror or e}. Free some space "
                                    "or checkpoint less often (--checkpoint-every).") from None

