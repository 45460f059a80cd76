"""The engine: launch ranks, run the per-rank training loop, write the run folder."""
from .job import Job
from .resolve import job_from_config
from .run import RunResult, execute

__all__ = ["Job", "job_from_config", "RunResult", "execute"]
