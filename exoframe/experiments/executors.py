"""Where a sweep's training runs happen: here, one after another (`local`, the default), or
as Ray tasks (`ray`: `pip install 'exoframe[ray]'`).

A sweep point is one strategy, seed and fault spec: its training runs (one per network, or
one whose trace is then replayed through the others). Points are independent, so each can
run anywhere. Under Ray a point runs in a worker's temporary folder, and the worker sends
the run folders' files back; the driver writes them into the sweep folder as each point
ends, so the workers need no shared filesystem (a sink that writes outside its run folder,
such as a shared database path, writes on the worker). Ray counts one CPU per point; the
point's rank processes are not limited by that count. Every Ray node needs exoframe and
the plugins a run uses installed; a workload or network file named by a relative path is
found from the driver's working directory, so on a cluster give absolute paths on a
filesystem every node sees.
"""
from __future__ import annotations

import dataclasses
import os
import socket
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ..config import EXECUTORS
from ..engine.launch.progress import Off
from ..engine.plan.resolve import job_from_config, resolve_network
from ..engine.records.run_folder import RunFolder
from ..engine.run import execute
from ..errors import ExoframeError
from ..files import replacing
from .run_replays import Projection, replay_trace, save_replay



@dataclass(frozen=True)
class SweepPoint:
    """One strategy, seed and fault spec: runs to train, and networks to replay on."""
    configs: tuple  # RunConfig per network trained on (out: where run folders go)
    replays: tuple = ()  # networks the first run's trace is replayed through
    # Each run and replay resolves its own network setup: the launcher writes into a
    # setup's compute model (a FLOP count), which must not serve another run.
    projection: Projection | None = None

    @property
    def work(self) -> int:
        """Progress units: one per training step and one per replay."""
        return sum(c.steps for c in self.configs) + len(self.replays)


def run_point(point: SweepPoint, out: str, bar=Off(), recorded_out: str | None = None
              ) -> list[Path]:
    """Train and replay `point` with run folders under `out`; the run folders.
    recorded_out: the folder the runs' config.yaml names (where they end up), if not out."""
    from ..plugins import get_plugin_manager

    pm = get_plugin_manager()
    run_dirs = []
    for config in point.configs:
        # (config.yaml names recorded_out; the run folder is made under `out`)
        job = job_from_config(dataclasses.replace(config, out=recorded_out or out), pm)
        bar.describe(f"sweep: {config.strategy} seed {config.seed} on {job.sim.net}"
                     + (f" with faults {config.faults}" if config.faults else ""))
        result = execute(job, out=out, config_record=job.config_record(),
                         on_row=lambda row: bar.update(1, row))
        run_dirs.append(Path(result.run_dir))
        for net in point.replays:
            other = resolve_network(dataclasses.replace(config, net=net), pm)
            bar.describe(f"sweep: replay {config.strategy} on {other.net}")
            save_replay(result.run_dir, replay_trace(result.trace, other, point.projection))
            bar.update(1)
    return run_dirs


def check_executor(executor: str, address: str | None = None, timeout: float = 60.0):
    """Before anything runs: a known executor, and for `ray`, Ray installed and the cluster
    at `address` (else RAY_ADDRESS) answering within `timeout` seconds."""
    if executor not in EXECUTORS:
        raise ExoframeError(f"--executor: '{executor}' is not one; use one of "
                            f"{', '.join(EXECUTORS)}.")
    if executor == "ray":
        _ray()
        if address:
            _check_ray_address(address, "--ray-address", timeout)
        elif os.environ.get("RAY_ADDRESS"):
            _check_ray_address(os.environ["RAY_ADDRESS"], "RAY_ADDRESS", timeout)


def _check_ray_address(address: str, given_as: str, timeout: float):
    """ray.init retries an address with nothing behind it for minutes: knock first."""
    if address in ("auto", "local"):
        return
    host, colon, port = address.split("://", 1)[-1].rpartition(":")
    if not colon or not port.isdigit() or not host:
        raise ExoframeError(f"{given_as}: '{address}' is not HOST:PORT or ray://HOST:PORT.")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except OSError as e:
        raise ExoframeError(
            f"{given_as}: nothing answers at {address} ({e.strerror or 'no answer'} within "
            f"{timeout:g} s, --connect-timeout); start Ray there (ray start --head) or give the "
            "address that `ray status` prints.") from None


def run_points(points: list[SweepPoint], runs_dir: Path, executor: str, bar,
               address: str | None = None) -> list[Path]:
    """Every point's run folders under runs_dir, in the points' order."""
    if executor == "ray":
        return _run_on_ray(points, runs_dir, bar, address)
    return [d for point in points for d in run_point(point, str(runs_dir), bar)]


def _ray():
    try:
        import ray
    except ImportError:
        raise ExoframeError("--executor ray needs Ray: pip install 'exoframe[ray]' (or give "
                            "--executor local).") from None
    return ray


def _run_on_ray(points, runs_dir: Path, bar, address):
    ray = _ray()
    started = not ray.is_initialized()
    if started:
        ray.init(address=address or os.environ.get("RAY_ADDRESS"), include_dashboard=False,
                 log_to_driver=False, configure_logging=False)
    folders: list = [None] * len(points)  # each point's run folders, in the points' order
    try:
        task = ray.remote(num_cpus=1, max_retries=0)(_ray_point)
        pending = {task.remote(point, os.getcwd(), sys.path, str(runs_dir)): i
                   for i, point in enumerate(points)}
        while pending:
            [done], _ = ray.wait(list(pending), num_returns=1)
            i = pending.pop(done)
            try:
                returned = ray.get(done)
            except ray.exceptions.RayError as e:
                for other in pending:
                    ray.cancel(other, force=True)
                cause = getattr(e, "cause", None) or e
                first = points[i].configs[0]
                raise ExoframeError(f"sweep: {first.strategy} seed {first.seed} failed on Ray: "
                                    f"{str(cause).strip().splitlines()[-1]}") from None
            # Written as each point ends: a later failure keeps what is done.
            folders[i] = [_write_run_folder(runs_dir, name, files) for name, files in returned]
            bar.update(points[i].work)
    finally:
        if started:
            ray.shutdown()
    return [folder for point_folders in folders for folder in point_folders]


def _ray_point(point: SweepPoint, cwd: str, path: list, runs_dir: str
               ) -> list[tuple[str, dict]]:
    """In a Ray worker: run the point in a temporary folder; each run folder's name and
    files (relative path -> bytes)."""
    if os.path.isdir(cwd):
        os.chdir(cwd)  # relative workload and network paths, as the driver reads them
    sys.path.extend(p for p in path if p not in sys.path)  # after the worker's own packages
    with tempfile.TemporaryDirectory() as out:
        return [(folder.name, {str(f.relative_to(folder)): f.read_bytes()
                               for f in sorted(folder.rglob("*")) if f.is_file()})
                for folder in run_point(point, out, recorded_out=runs_dir)]


def _write_run_folder(runs_dir: Path, name: str, files: dict) -> Path:
    folder = RunFolder.claim(runs_dir, name).path  # the name the worker's run folder had
    for relative, content in files.items():
        target = folder / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        with replacing(target, "wb") as f:
            f.write(content)
    return folder
