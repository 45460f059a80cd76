"""The engine: one run. Launch ranks, run the per-rank training loop, write the run folder.

Its entry points are here (run.py, resume.py, trainer.py); sweeps, replays and their
executors are exoframe.experiments, beside it (which imports the engine, never the reverse).
Its wings, by phase: plan/ (decided before any process starts), node/ (what runs in a node),
launch/ (what the launcher runs meanwhile), ipc/ (what crosses a process boundary) and
records/ (what a run keeps on disk). Imports go one way: the entry points use the wings,
launch uses node, and node uses plan, ipc and records."""
import importlib

_HOMES = {"Job": ".plan.job", "job_from_config": ".plan.resolve", "RunResult": ".run",
          "execute": ".run"}  # loaded on first use: the command line's help needs no torch

__all__ = list(_HOMES)


def __getattr__(name: str):
    if name in _HOMES:
        value = getattr(importlib.import_module(_HOMES[name], __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'exoframe.engine' has no attribute '{name}'")
