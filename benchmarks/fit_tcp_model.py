"""Fit the tcp model's two measured constants (exoframe/sim/network/tcp.py: segments_per_ack,
shared_efficiency) on the emulated network's fit set, and show what they give elsewhere.

    sudo python benchmarks/emulated_network.py --repeat 3 --json fit.json
    python benchmarks/fit_tcp_model.py fit.json [fit2.json:segments_per_ack=2.2,...]
                                       [--check held.json ...]

Each file is emulated_network.py's --json, optionally followed by the tcp model its twins
were simulated with (`:key=value,...`; by default the one its rows record, or, in files
written before they did, the model's defaults). Several fit files
are pooled: one batch's rows on the two-site layouts vary by a few percent from run to run.

The fit, in two stages, each the least squares of log(real / simulated) on a grid:
segments_per_ack on the stars (no link between sites, so no other constant is in play)
whose simulated communication is at least 75 % of their time (the 1 Gbit/s star, at
33-51 %, is bound by this machine's CPU); then shared_efficiency on the rows whose ring
sends two or more flows through one direction of a link between sites, given the first.

A row's simulated time is not run again for each candidate: it is rescaled. These cases
have no latency, so a row's simulated communication is its bytes times the per-byte cost
on its bottleneck, which the constants change by a known factor: frame + ACK bytes per
payload byte with the candidate over those it was simulated with, and on a shared link,
also over the candidate's shared_efficiency. Its compute (comm_share's complement) is
unchanged. --check prints the same figures for other sets (the held-out cases) at the
fitted constants, rescaled likewise: a preview, not a measurement; the held-out figures to
quote come from running them with the constants in place.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from emulated_network import (case_topology, cases, ratios_line,  # noqa: E402 - beside it
                              ring_flows_per_site_link)

from exoframe.errors import ExoframeError  # noqa: E402
from exoframe.sim.network.tcp import TcpModel, parse_protocol  # noqa: E402

SEGMENTS_PER_ACK = [x / 20 for x in range(30, 101)]  # 1.5 .. 5.0
SHARED_EFFICIENCY = [x / 200 for x in range(160, 201)]  # 0.8 .. 1.0
STAR_MIN_COMM = 0.75  # the stars that fit segments_per_ack: network-bound ones


@dataclass
class Runs:
    """One file's rows, the model their twins were simulated with, and which rows' cases
    send two or more flows through a link between sites (`shared`) or have no such link
    (`star`)."""
    path: str
    rows: list
    simulated_with: TcpModel
    shared: dict
    star: dict


def site_link_flows(network: dict, nodes: int) -> int:
    """How many of a ring's flows share one direction of a link between sites: 0 on a star,
    2 or more where shared_efficiency acts."""
    return ring_flows_per_site_link(case_topology(network, nodes), nodes)


def per_byte(model: TcpModel) -> float:
    return model.data_factor + model.ack_factor


def rescaled_ratio(row: dict, shared: bool, simulated_with: TcpModel, model: TcpModel) -> float:
    """real / simulated, the simulated time rescaled from `simulated_with` to `model`."""
    factor = per_byte(model) / per_byte(simulated_with)
    if shared:
        factor *= simulated_with.shared_efficiency / model.shared_efficiency
    share = row["comm_share"]
    return row["real"] / (row["simulated"] * (share * factor + 1 - share))


def ratios(runs: list[Runs], model: TcpModel, which=None) -> list[float]:
    """Every row's real / simulated at `model` (which: "star" or "shared" rows only)."""
    return [rescaled_ratio(row, one.shared[row["case"]], one.simulated_with, model)
            for one in runs for row in one.rows
            if which is None or getattr(one, which)[row["case"]]]


def least_squares(runs: list[Runs], candidates, which: str) -> TcpModel:
    return min(candidates, key=lambda model: sum(math.log(x) ** 2
                                                 for x in ratios(runs, model, which)))


def fit(runs: list[Runs], start: TcpModel) -> TcpModel:
    """segments_per_ack on the stars, then shared_efficiency on the shared links."""
    acks = least_squares(runs, [replace(start, segments_per_ack=value)
                                for value in SEGMENTS_PER_ACK], "star")
    return least_squares(runs, [replace(acks, shared_efficiency=value)
                                for value in SHARED_EFFICIENCY], "shared")


def load(spec: str, nodes: int) -> Runs:
    """PATH[:key=value,...]: a --json file and the tcp model its twins used."""
    path, _, given = spec.partition(":")
    try:
        rows = json.loads(Path(path).read_text())
        if not isinstance(rows, list) or not rows:
            raise ValueError("expected emulated_network.py's --json list")
        recorded = {json.dumps(row.get("tcp", "tcp"), sort_keys=True) for row in rows}
        if given:
            pairs = {key: float(value) for key, value in
                     (part.split("=") for part in given.split(","))}
        elif len(recorded) == 1:  # the model the rows say their twins used, or the default
            pairs = json.loads(recorded.pop())
        else:
            raise ValueError("its rows were simulated with different tcp models")
        simulated_with = parse_protocol(pairs, spec)
    except ValueError as e:
        raise SystemExit(f"fit_tcp_model: {spec}: {e}; give PATH or PATH:key=value,...") from None
    except (OSError, ExoframeError) as e:
        raise SystemExit(f"fit_tcp_model: {e}") from None
    if simulated_with is None:
        raise SystemExit(f"fit_tcp_model: {path}: its twins ran with protocol none: no tcp "
                         f"constants to rescale")
    known = cases(nodes)
    names = {row["case"]: row["case"].rsplit(" ", 1)[0] for row in rows}
    unknown = sorted({name for name in names.values() if name not in known})
    if unknown:
        raise SystemExit(f"fit_tcp_model: {path}: cases emulated_network.py does not have: "
                         f"{', '.join(unknown)}")
    flows = {row: site_link_flows(known[name].network, nodes) for row, name in names.items()}
    shared = {row: count >= 2 for row, count in flows.items()}
    star = {row["case"]: flows[row["case"]] == 0 and row["comm_share"] >= STAR_MIN_COMM
            for row in rows}
    return Runs(path, rows, simulated_with, shared, star)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("fit", nargs="+", metavar="JSON[:key=value,...]",
                        help="emulated_network.py --json files of the fit cases")
    parser.add_argument("--check", action="append", default=[], metavar="JSON[:key=value,...]",
                        help="other sets to rescale to the fitted constants (repeatable)")
    parser.add_argument("--nodes", type=int, default=4)
    options = parser.parse_args()
    runs = [load(spec, options.nodes) for spec in options.fit]
    held_out = sorted({row["case"] for one in runs for row in one.rows if row.get("held_out")})
    if held_out:
        raise SystemExit(f"fit_tcp_model: held-out rows in the fit files ({', '.join(held_out)}): "
                         f"the held-out cases only check the fit; give them with --check")
    for which, what in (("star", f"network-bound stars (comm >= {STAR_MIN_COMM:.0%})"),
                        ("shared", "rows with a shared site link")):
        if not any(getattr(one, which)[row["case"]] for one in runs for row in one.rows):
            raise SystemExit(f"fit_tcp_model: the fit files have no {what} to fit on: give "
                             f"emulated_network.py's fit set (its default --cases)")
    for one in runs:
        model = one.simulated_with
        print(f"{one.path} (simulated with segments_per_ack {model.segments_per_ack:g}, "
              f"shared_efficiency {model.shared_efficiency:g}): {ratios_line(ratios([one], model))}")
    best = fit(runs, TcpModel())
    print(f"fitted: segments_per_ack {best.segments_per_ack:g} "
          f"({len(ratios(runs, best, 'star'))} star rows), shared_efficiency "
          f"{best.shared_efficiency:g} ({len(ratios(runs, best, 'shared'))} shared-link rows)")
    print(f"  the fit files, rescaled: {ratios_line(ratios(runs, best))}")
    for spec in options.check:
        other = load(spec, options.nodes)
        print(f"  {other.path}: as run {ratios_line(ratios([other], other.simulated_with))}; "
              f"rescaled {ratios_line(ratios([other], best))}")


if __name__ == "__main__":
    main()
