"""One job on an emulated network and in the simulator, side by side: the ranks run under
torchrun with `--net real`, one per namespace of an Emulation (netns.py), rendezvous on the
unshaped control network and gloo on the shaped, delayed data network; then the same job
runs through the simulator on the network file, with `--compute fixed:` set to the compute
per step of the slowest real rank, so that only the network differs. `exoframe emulate` and
benchmarks/emulated_network.py use it."""
from __future__ import annotations

import glob
import os
import secrets
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from ..errors import ExoframeError
from ..inputs import load_json, load_json_lines
from .delays import delays_for
from .netns import DATA_IF, Counts, Emulation, EmulationError, EmulationOptions

PACKAGE_ROOT = Path(__file__).resolve().parent.parent.parent  # what holds `exoframe`


def summary_of(out: str) -> tuple[dict, list[dict]]:
    found = glob.glob(f"{out}/*/summary.json")
    if len(found) != 1:
        raise EmulationError(f"no run folder in {out}: the run did not start (see its log).")
    folder = Path(found[0]).parent
    try:
        rows = load_json_lines(folder / "metrics.jsonl", "metrics file")
        return load_json(folder / "summary.json", "summary"), rows
    except ExoframeError as e:
        raise EmulationError(str(e)) from None


def real_run(emulation: Emulation, args: list[str], out: str, nodes: int,
             timeout: float) -> tuple[dict, list[dict]]:
    """The ranks under torchrun, one agent per rank namespace, rendezvous on the control
    network, gloo on the shaped data network."""
    endpoint = f"{emulation.control_addr(0)}:29400"
    env = {**os.environ, "GLOO_SOCKET_IFNAME": DATA_IF, "PYTHONPATH": str(PACKAGE_ROOT),
           "OMP_NUM_THREADS": "1", "EXOFRAME_TOKEN": secrets.token_hex(16)}
    log = Path(out) / "agents.log"
    agents = []
    with open(log, "w") as sink:
        for rank in range(nodes):
            conf = ["--rdzv-conf", "is_host=1"] if rank == 0 else []
            agents.append(subprocess.Popen(
                ["ip", "netns", "exec", emulation.rank_ns(rank), sys.executable, "-m",
                 "torch.distributed.run", "--nnodes", str(nodes), "--nproc-per-node", "1",
                 "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint, *conf,
                 "--rdzv-id", f"emu{os.getpid()}", "--local-addr", emulation.control_addr(rank),
                 "-m", "exoframe", "run", "--net", "real", "--out", out, *args],
                env=env, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True))
        deadline = time.monotonic() + timeout
        try:
            for agent in agents:
                agent.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            raise EmulationError(f"the ranks did not finish in {timeout:.0f} s (log: {log})") from None
        finally:
            for agent in agents:
                if agent.poll() is None:
                    os.killpg(agent.pid, signal.SIGKILL)
                    agent.wait()
    if any(agent.returncode for agent in agents):
        raise EmulationError(f"a rank failed: {first_error(log)}")
    return summary_of(out)


def first_error(log: Path) -> str:
    """The line of a log that says what went wrong: exoframe's one-line error, or the
    last line of the first traceback."""
    lines = [line.strip() for line in log.read_text().splitlines() if line.strip()]
    for line in lines:
        if line.lower().startswith(("error:", "exoframe: ")):
            return line
    return lines[-1] if lines else "no output"


def twin_run(net_file: str, args: list[str], out: str, compute: float,
             nodes: int, overlap: str | None = None) -> tuple[dict, list[dict]]:
    model = f"fixed:{compute:.6f}s" + (f",overlap={overlap}" if overlap else "")
    done = subprocess.run([sys.executable, "-m", "exoframe", "run", "--nodes", str(nodes),
                           "--net", net_file, "--compute", model,
                           "--out", out, *args], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(PACKAGE_ROOT)})
    if done.returncode:
        lines = done.stderr.strip().splitlines()
        raise EmulationError(f"the simulated run failed: {lines[-1] if lines else done.returncode}")
    return summary_of(out)


def per_sync(said: dict, key: str) -> float:
    """The ranks' mean of `key` per exchange."""
    exchanges = sum(kind["calls"] for kind in said["traffic_by_kind_rank0"].values())
    return sum(rank[key] for rank in said["per_rank"]) / len(said["per_rank"]) / exchanges


@dataclass
class SideBySide:
    """What one job took on the emulated network and in its twin."""
    real: dict  # the real run's summary.json
    twin: dict  # the simulated run's
    real_rows: list
    twin_rows: list
    compute_per_step: float  # s, what the twin's compute model was given
    counts: Counts  # what the emulation's queues, TCP stacks and delay line counted
    uplink_queues: list  # each rank's uplink queue, as a network file writes it
    link_queues: list  # each link between sites' queue, as a network file writes it

    @property
    def real_seconds(self) -> float:
        """The ranks' mean: each rank's clock starts when that rank does."""
        return sum(rank["simulated_seconds"] for rank in self.real["per_rank"]) / \
            len(self.real["per_rank"])

    @property
    def simulated_seconds(self) -> float:
        return self.twin["simulated_seconds"]


def side_by_side(net_file: Path, nodes: int, args: list[str], out: Path, tag: str,
                 congestion: str | None = None,
                 options: EmulationOptions = EmulationOptions(), seed: int = 0,
                 overlap: str | None = None, timeout: float = 600) -> SideBySide:
    """Run `args` (exoframe run options, without --net, --nodes, --compute, --out) on the
    network `net_file` describes, emulated and simulated; the runs' folders under `out`."""
    from ..sim.network.netconfig import load_file

    topology = load_file(net_file, net_file.stem).topology(nodes)
    access, inter = delays_for(topology)
    (out / "real").mkdir(parents=True)
    with Emulation(tag, topology.uplink, topology.downlink, topology.site_of,
                   {pair: spec.bandwidth for pair, spec in topology.inter.items()},
                   congestion, options, access, inter, seed,
                   [topology.queue_of(rank) for rank in range(nodes)],
                   {pair: spec.queue for pair, spec in topology.inter.items()}) as emulation:
        before = emulation.counts()
        real, real_rows = real_run(emulation, args, str(out / "real"), nodes, timeout)
        counts = emulation.counts() - before
    # The twin computes, per step, for as long as the slowest real rank computed: every
    # exchange waits for it, and the network alone differs. (Not each rank's compute and
    # wait: a rank also waits for peers whose last exchange ended after its own, which the
    # twin's network decides itself; counted as compute, that skew would be paid twice.)
    compute = max(rank["compute_seconds"] for rank in real["per_rank"]) / max(1, real["steps"])
    twin, twin_rows = twin_run(str(net_file), args, str(out / "sim"), compute, nodes, overlap)
    return SideBySide(real, twin, real_rows, twin_rows, compute, counts,
                      [topology.queue_of(rank).describe() for rank in range(nodes)],
                      [spec.queue.describe() for spec in topology.inter.values()])
