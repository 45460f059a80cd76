"""Fit the tcp model's two measured constants (exoframe/sim/network/tcp.py: segments_per_ack,
shared_efficiency) on the emulated network's fit set, and show what they give elsewhere.

    sudo python benchmarks/emulated_network.py --repeat 3 --json fit.json
    python benchmarks/fit_tcp_model.py fit.json [--check held.json ...]
                                       [--simulated-with segments_per_ack=2.2,...]

The fit is the least squares of log(real / simulated) over the fit cases (the median run of
each), on a grid. A row's simulated time is not run again for each candidate: it is
rescaled. These cases have no latency, so a row's simulated communication is its bytes
times the per-byte cost on its bottleneck, which the constants change by a known factor:
(frame + ACK bytes per payload byte) with the candidate over those the run was simulated
with (--simulated-with, by default the model's own defaults), and, where two or more ring
flows cross one direction of a link between sites, over the candidate's shared_efficiency
as well. Its compute (comm_share's complement) is unchanged. --check prints the same
figures for other sets (the held-out cases) at the fitted constants, rescaled likewise: a
preview, not a measurement; the held-out figures to quote come from running them with
the constants in place.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from emulated_network import cases  # noqa: E402 - beside this file

from exoframe.sim.network.netconfig import NetConfig  # noqa: E402
from exoframe.sim.network.tcp import TcpModel, parse_protocol  # noqa: E402

SEGMENTS_PER_ACK = [x / 20 for x in range(30, 101)]  # 1.5 .. 5.0
SHARED_EFFICIENCY = [x / 200 for x in range(160, 201)]  # 0.8 .. 1.0


def shared_link(network: dict, nodes: int) -> bool:
    """Whether two or more of a ring's flows cross one direction of a link between sites
    (the link whose share shared_efficiency sets)."""
    topology = NetConfig.from_dict(network, "case", "case").validate().topology(nodes)
    crossings: dict = {}
    for rank in range(nodes):
        hop = (topology.site_of[rank], topology.site_of[(rank + 1) % nodes])
        if hop[0] != hop[1]:
            crossings[hop] = crossings.get(hop, 0) + 1
    return max(crossings.values(), default=0) >= 2


def per_byte(model: TcpModel) -> float:
    return model.data_factor + model.ack_factor


def rescaled_ratio(row: dict, shared: bool, simulated_with: TcpModel, model: TcpModel) -> float:
    """real / simulated, the simulated time rescaled from `simulated_with` to `model`."""
    factor = per_byte(model) / per_byte(simulated_with)
    if shared:
        factor *= simulated_with.shared_efficiency / model.shared_efficiency
    share = row["comm_share"]
    return row["real"] / (row["simulated"] * (share * factor + 1 - share))


def ratios(rows: list[dict], shared: dict, simulated_with: TcpModel,
           model: TcpModel) -> list[float]:
    return [rescaled_ratio(row, shared[row["case"]], simulated_with, model) for row in rows]


def fit(rows: list[dict], shared: dict, simulated_with: TcpModel) -> TcpModel:
    """The grid's constants with the least sum of log(real / simulated)²."""
    def error(model):
        return sum(math.log(x) ** 2 for x in ratios(rows, shared, simulated_with, model))
    return min((replace(simulated_with, segments_per_ack=acks, shared_efficiency=efficiency)
                for acks in SEGMENTS_PER_ACK for efficiency in SHARED_EFFICIENCY), key=error)


def summary(values: list[float]) -> str:
    errors = [abs(x - 1) for x in values]
    slower = sum(x > 1 for x in values)
    return (f"{len(values)} runs, mean |real/simulated - 1| {sum(errors) / len(errors):.4f}, "
            f"max {max(errors):.4f}; real slower in {slower}, faster in {len(values) - slower}")


def shared_by_case(rows: list[dict], nodes: int) -> dict:
    """Row name ('<case> <strategy>') -> whether its case has a shared link."""
    known = cases(nodes)
    names = {row["case"]: row["case"].rsplit(" ", 1)[0] for row in rows}
    unknown = sorted({name for name in names.values() if name not in known})
    if unknown:
        raise SystemExit(f"fit_tcp_model: rows of cases emulated_network.py does not have: "
                         f"{', '.join(unknown)}")
    return {row: shared_link(known[name].network, nodes) for row, name in names.items()}


def load_rows(path: str) -> list[dict]:
    try:
        rows = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise SystemExit(f"fit_tcp_model: {path}: {e}") from None
    if not isinstance(rows, list) or not rows:
        raise SystemExit(f"fit_tcp_model: {path}: expected emulated_network.py's --json list")
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("fit", help="emulated_network.py --json of the fit cases")
    parser.add_argument("--check", action="append", default=[], metavar="JSON",
                        help="other sets to rescale to the fitted constants (repeatable)")
    parser.add_argument("--simulated-with", default="tcp", metavar="KEY=VALUE,...",
                        help="the tcp model the runs' twins used (default: today's defaults), "
                             "e.g. segments_per_ack=2.2,shared_efficiency=0.93")
    parser.add_argument("--nodes", type=int, default=4)
    options = parser.parse_args()
    given = options.simulated_with
    if given != "tcp":
        try:
            given = {key: float(value) for key, value in
                     (part.split("=") for part in given.split(","))}
        except ValueError:
            parser.error(f"--simulated-with: give KEY=VALUE pairs, not {given!r}")
    from exoframe.errors import ExoframeError
    try:
        simulated_with = parse_protocol(given, "--simulated-with")
    except ExoframeError as e:
        parser.error(str(e))
    rows = load_rows(options.fit)
    shared = shared_by_case(rows, options.nodes)
    best = fit(rows, shared, simulated_with)
    print(f"simulated with: segments_per_ack {simulated_with.segments_per_ack:g}, "
          f"shared_efficiency {simulated_with.shared_efficiency:g}")
    print(f"  fit set: {summary(ratios(rows, shared, simulated_with, simulated_with))}")
    print(f"fitted: segments_per_ack {best.segments_per_ack:g}, "
          f"shared_efficiency {best.shared_efficiency:g}")
    print(f"  fit set, rescaled: {summary(ratios(rows, shared, simulated_with, best))}")
    for path in options.check:
        other = load_rows(path)
        other_shared = shared_by_case(other, options.nodes)
        print(f"  {path}: as run {summary(ratios(other, other_shared, simulated_with, simulated_with))}")
        print(f"  {path}: rescaled {summary(ratios(other, other_shared, simulated_with, best))}")


if __name__ == "__main__":
    main()
