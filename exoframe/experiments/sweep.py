"""`exoframe sweep`: strategies × networks (× seeds × simulated failures), trained once and
replayed.

A strategy whose behaviour does not depend on timing trains once, on the first network,
and its trace is replayed through every other network (same clocks as a re-run, at a
fraction of the cost). A timing-dependent strategy, or any run with simulated failures
(who takes part in each exchange depends on the timing), trains once per network. Everything
lands in one sweep folder: runs/ (run folders with their replays), nets/ (networks made
from a bandwidth grid), sweep.csv, sweep.json and the plots. The runs happen here or on Ray
(executors.py).
"""
from __future__ import annotations

import dataclasses
import itertools
import math
from pathlib import Path

import yaml

from ..config import SWEEP_NETS, SWEEP_OUT, SWEEP_STRATEGIES, RunConfig
from ..engine.launch.launcher import check_startable
from ..engine.launch.progress import progress_display
from ..engine.plan.resolve import build_job, resolve_faults, resolve_network, workload_and_model
from ..engine.records.run_folder import RunFolder
from ..errors import ExoframeError
from ..files import write_atomic
from ..plugins import get_plugin_manager
from ..report.results import SweepResult
from ..report.sweep_table import collect_rows, write_outputs
from ..sim.network.netconfig import load_network
from ..sim.network.units import format_bandwidth, parse_bandwidth
from ..sim.setup import REAL
from .executors import SweepPoint, check_executor, run_points
from .run_replays import Projection
from .sweep_axes import (SamePoints, apply, axis_flag, check_distinct, combinations,
                         strategy_axes)

# Every grid point is a training run or a replay and a row: past a thousand, a sweep runs
# for hours and its table and plots are unreadable.
MAX_POINTS = 1000
# A sweep's runs and replays at most: its product is counted before anything is expanded.
MAX_RUNS = 10_000


def parse_grid(text: str, points: int) -> list[float]:
    """'10mbit..10gbit' with `points` -> log-spaced bandwidths in bytes/s, low to high."""
    low_text, sep, high_text = text.partition("..")
    if not sep:
        raise ExoframeError(f"--bandwidth: expected LOW..HIGH, e.g. 10mbit..10gbit; got '{text}'.")
    low = parse_bandwidth(low_text, "--bandwidth", "sweep")
    high = parse_bandwidth(high_text, "--bandwidth", "sweep")
    if math.isinf(high) or math.isinf(low):
        raise ExoframeError("--bandwidth: the grid's ends must be finite bandwidths.")
    if low >= high:
        raise ExoframeError(f"--bandwidth: the low end ({low_text}) must be below the high end "
                            f"({high_text}), e.g. 10mbit..10gbit.")
    if points < 2:
        raise ExoframeError(f"--points: a grid needs at least 2 points, got {points}.")
    if points > MAX_POINTS:
        raise ExoframeError(f"--points: at most {MAX_POINTS} (each point is a run or a "
                            f"replay and a row of the table), got {points}.")
    ratio = (high / low) ** (1 / (points - 1))
    return [low * ratio ** i for i in range(points - 1)] + [high]


def check_size(axes: dict):
    """Refuse, in one line, a sweep of more than MAX_RUNS runs and replays, counted from
    its axes' lengths before any point is made."""
    runs = math.prod(len(values) for values in axes.values())
    if runs > MAX_RUNS:
        factors = " x ".join(f"{len(values)} ({flag})" for flag, values in axes.items()
                             if len(values) > 1)
        raise ExoframeError(f"sweep: {runs:,} runs and replays ({factors}), more than "
                            f"{MAX_RUNS:,}; give fewer values.")


def grid_networks(base: str, bandwidths: list[float], folder: Path, pm) -> list[str]:
    """Copies of network `base` with its bottleneck set to each bandwidth, written as YAML
    files in `folder`: the inter-site links if it has sites, else every node's NIC."""
    network = load_network(base, pm.networks)
    traced = [i for i, link in enumerate(network.links) if link.bandwidth_trace is not None]
    if traced:
        raise ExoframeError(f"{network.where or network.name}: links[{traced[0]}] follows a "
                            "bandwidth_trace, which a bandwidth sweep cannot scale; compare "
                            "networks by name instead (--net a.yaml,b.yaml).")
    folder.mkdir(parents=True, exist_ok=True)
    keys = {f.name: getattr(network, f.name) for f in dataclasses.fields(network)
            if f.name not in ("name", "where")}
    paths = []
    for bandwidth, text in zip(bandwidths, _bandwidth_texts(bandwidths)):
        values = dict(keys, description=f"{network.name} at {text}")
        if network.links:
            values["links"] = [dict(dataclasses.asdict(link), bandwidth=text)
                               for link in network.links]
            values["sites"] = {name: dataclasses.asdict(site) for name, site in network.sites.items()}
        else:
            values.update(bandwidth=text, upload=None, download=None)
            values["sites"] = {}
            values["links"] = []
        path = folder / f"{network.name}@{text}.yaml"
        write_atomic(path, yaml.safe_dump(values, sort_keys=False))
        paths.append(str(path))
    return paths


def strategy_params(strategies: list[str], assignments: dict, pm,
                    config_params: dict | None = None,
                    config_strategy: str | None = None) -> dict[str, dict]:
    """Parameters for each strategy. First the config's strategy_params (`config_params`, of
    `config_strategy`): each goes to every swept strategy that has it; one that none has is
    an error unless it is a parameter of `config_strategy`, which the sweep replaced. Then -p
    values on top: 'diloco.H' goes to diloco only; an unscoped 'H' to every strategy that
    has a parameter H."""
    params = {s: {} for s in strategies}
    fields = {s: _parameter_names(s, pm) for s in strategies}
    owned = _parameter_names(config_strategy, pm) if config_strategy and config_params else set()
    for key, value in (config_params or {}).items():
        takers = [s for s in strategies if key in fields[s]]
        if not takers and key not in owned:
            raise ExoframeError(f"strategy_params: none of {', '.join(strategies)} has a "
                                f"parameter '{key}'; remove it from the config file or sweep a "
                                "strategy that has it.")
        for s in takers:
            params[s][key] = value
    for key, value in assignments.items():
        scope, dot, name = key.rpartition(".")
        if dot:
            if scope not in params:
                raise ExoframeError(f"-p {key}: '{scope}' is not one of the swept strategies "
                                    f"({', '.join(strategies)}).")
            params[scope][name] = value
            continue
        takers = [s for s in strategies if key in fields[s]]
        if not takers:
            raise ExoframeError(f"-p {key}: none of {', '.join(strategies)} has a parameter "
                                f"'{key}'; scope it as STRATEGY.{key}=VALUE.")
        for s in takers:
            params[s][key] = value
    return params


def _parameter_names(strategy: str, pm) -> set[str]:
    return {f.name for f in dataclasses.fields(pm.strategies.get(strategy).obj.Params)}


def check_points(points: list, pm, base: RunConfig):
    """Every run of every point, as `exoframe run` checks it before its ranks start
    (strategy, optimizer and workload with their parameters, network, compute model,
    stragglers, faults, sinks, validation set, loss shape, ...), every network replayed,
    and no two the same run. The check costs what one point costs: one workload and model
    at a time (its memory first judged on the meta device: workload_and_model), each
    released before the next is built; runs in a row with the same workload share it."""
    checked, same, held = set(), SamePoints(base), _OneModel(pm)
    try:
        for point in points:
            for config in point.configs:
                config.validate()
                _check_run(config, held, same, pm)
            first = point.configs[0]
            for net in point.replays:
                if net not in checked:
                    resolve_network(dataclasses.replace(first, net=net), pm)
                    checked.add(net)
    finally:
        held.release()


class _OneModel:
    """The workload and model of the run being checked, the only one held."""

    def __init__(self, pm):
        self.pm, self.key, self.built = pm, None, None

    def get(self, config: RunConfig):
        key = (config.workload, repr(config.workload_params))
        if key != self.key:
            self.release()  # (before the next is built: never two at once)
            self.built, self.key = workload_and_model(config, self.pm), key
        return self.built

    def release(self):
        self.key = self.built = None


def _check_run(config: RunConfig, held: _OneModel, same: SamePoints, pm):
    """One run checked; the job (and with it the model's forward pass) ends with the call."""
    job = build_job(config, *held.get(config), pm=pm)
    same.add(config, job)
    check_startable(job)  # (validation set, loss shape: as `exoframe run` does)


def config_axes(config: RunConfig, given: set) -> dict:
    """What a sweep takes from a config file where no flag says otherwise: the file's
    strategy, net and out when it gives them (else the sweep's defaults), and its seed."""
    return {"strategies": [config.strategy] if "strategy" in given else list(SWEEP_STRATEGIES),
            "nets": [config.net] if "net" in given else list(SWEEP_NETS),
            "seeds": [config.seed],
            "out": config.out if "out" in given else SWEEP_OUT}


def _bandwidth_text(bytes_per_s: float, digits: int = 3) -> str:
    """A unit string for YAML and file names: 12.5e6 -> '100mbit'."""
    return format_bandwidth(bytes_per_s, digits).replace(" ", "").removesuffix("/s").lower()


def _bandwidth_texts(bandwidths: list[float]) -> list[str]:
    """Labels for a grid, with as many significant digits as it takes to tell every point
    apart (a dense grid rounds neighbours to the same 3 digits)."""
    for digits in range(3, 17):
        texts = [_bandwidth_text(b, digits) for b in bandwidths]
        if len(set(texts)) == len(texts):
            return texts
    raise ExoframeError("--bandwidth: grid points too close to tell apart; use fewer --points.")


def sweep(base: RunConfig, strategies: list[str], nets: list[str], seeds: list[int],
          out: str, assignments: dict | None = None, target_loss: float | None = None,
          projection: Projection | None = None, plots: bool = True, progress="off",
          grid: list[float] | None = None, progress_every: float = 30.0,
          faults: list[str] | None = None, executor: str = "local",
          address: str | None = None, axes: dict | None = None) -> SweepResult:
    """Returns the sweep folder and its rows (see exoframe.report.sweep_table) as a SweepResult
    (`folder, rows = sweep(...)` unpacks it). Every run is `base`
    with the strategy, seed, network and faults swept; its strategy parameters are base's
    that the strategy has plus `assignments` (-p values, see strategy_params). With `grid`
    (bandwidths in bytes/s), `nets` is the one base network the grid is applied to. faults:
    fault specs ("" or "none": no failures; None: base's). executor: where the training runs
    happen, "local" or "ray" (address: a Ray cluster's; see executors.py). axes: any other
    RunConfig field swept, or a parameter, with its values (see sweep_axes.py): every
    combination is a point of its own."""
    faults = [base.faults] if faults is None else ["" if f == "none" else f for f in faults]
    axes = axes or {}
    for axis, values in {"strategy": strategies, "net": nets, "seed": seeds, "faults": faults,
                         **axes}.items():
        check_distinct(axis, values)
    check_size({"--strategy": strategies, "--net": grid if grid is not None else nets,
                "--seeds": seeds, "--faults": faults,
                **{axis_flag(axis): values for axis, values in axes.items()}})
    check_executor(executor, address, base.connect_timeout)
    if REAL in nets:
        raise ExoframeError("--net: a sweep compares simulated networks; 'real' measures one "
                            "run (exoframe run --net real).")
    if not strategies or not nets or not seeds or not faults:
        raise ExoframeError("sweep: give at least one strategy, one network and one seed.")
    # Each fault spec as its runs' Jobs will hold it (parsed as resolve.py parses a run's).
    fault_specs = [resolve_faults(dataclasses.replace(base, faults=spec)) for spec in faults]
    if grid is not None and len(nets) != 1:
        raise ExoframeError("--bandwidth applies a grid to one base network; give one --net.")
    pm = get_plugin_manager()
    # Each run validates every step and stops at the target (see exoframe.engine.plan.target).
    target_loss = base.target_loss if target_loss is None else target_loss
    params = strategy_params(strategies, assignments or {}, pm, base.strategy_params,
                             base.strategy)
    # A strategy parameter's axis goes where its key says (an unknown one refused here).
    strategy_params(strategies, {axis[1]: values[0] for axis, values in axes.items()
                                 if isinstance(axis, tuple) and axis[0] == "strategy_params"},
                    pm)

    def planned(run_nets, runs_dir):
        """The points: for each strategy, fault spec and seed, the runs on `run_nets`, their
        folders in `runs_dir`."""
        points = []
        for strategy, (spec, parsed) in itertools.product(strategies,
                                                          zip(faults, fault_specs)):
            # Under simulated failures, who takes part in each exchange depends on the
            # timing, and so does when a rank serves each remote call.
            strategy_cls = pm.strategies.get(strategy).obj
            traits = strategy_cls.traits
            timing_dependent = (traits.timing_dependent or traits.remote_calls
                                or parsed.active)
            if timing_dependent and projection is not None:
                raise ExoframeError(f"sweep: '{strategy}' is timing-dependent (or the runs have "
                                    "faults); a projection replays traces, so it cannot "
                                    "project it. Leave it out of the sweep.")
            varied = strategy_axes(axes, strategy, _parameter_names(strategy, pm))
            for seed, others in itertools.product(seeds, combinations(varied)):
                trained = run_nets if timing_dependent else run_nets[:1]
                replayed = ([] if timing_dependent else run_nets[1:] if projection is None
                            else run_nets)
                configs = tuple(apply(dataclasses.replace(
                    base, strategy=strategy, seed=seed, net=net, out=str(runs_dir),
                    strategy_params=params[strategy], target_loss=target_loss, faults=spec),
                    others) for net in trained)
                points.append(SweepPoint(configs, tuple(replayed), projection))
        return points

    # Every point checked before anything trains or any folder is made (a grid's networks
    # are copies of its base network, checked as it).
    check_points(planned(nets, Path(out)), pm, base)
    folder = RunFolder.create(out, "sweep").path
    runs_dir = folder / "runs"
    if grid is not None:
        nets = grid_networks(nets[0], grid, folder / "nets", pm)
    points = planned(nets, runs_dir)
    bar = progress_display(progress, sum(p.work for p in points), "sweep", progress_every)
    try:
        run_dirs = run_points(points, runs_dir, executor, bar, address)
    finally:
        bar.close()
    rows = collect_rows(run_dirs, target_loss)
    if projection is not None:
        rows = [r for r in rows if r["source"] == "replay"]
    write_outputs(rows, folder, plots=plots)
    return SweepResult(folder, rows)
