"""What bounds a run, in one line: compute, round trips (latency), bytes (bandwidth) or
waiting for peers, from the simulator's own split of each rank's time.

Each rank's simulated time is compute, communication not hidden behind compute, waiting
for peers (stragglers, or peers that joined an exchange later) and time down; the simulator
splits the communication into latency (the round trips and the message latencies on the
path that ended each wait) and bandwidth (the rest: bytes moving, or waiting behind bytes
on a connection): exoframe/sim/clocks/critical_path.py. The line names the largest part,
with the share of communication that is round trips and what a 10× faster link or no
latency at all would save: the bandwidth part less a tenth of it, or the latency part, of
the run's simulated time, to first order (the exchanges keep their critical paths).
"""
from __future__ import annotations

# A run whose communication and waits take less than this share of its time is compute-bound.
COMPUTE_BOUND = 0.5
FASTER = 10  # "a 10× faster link"


def parts(row: dict) -> dict | None:
    """The time per node, from a row (a report's, or a summary with the *_per_node keys):
    compute, latency, bandwidth, idle (waiting for peers) and the simulated time; None
    where the run did not record the split (a real network, a run from before it)."""
    get = _reader(row)
    simulated = get("simulated_seconds")
    latency, bandwidth = get("comm_latency_seconds"), get("comm_bandwidth_seconds")
    if latency is None or bandwidth is None or not simulated:
        return None
    utilization = get("compute_utilization")
    return {"compute": (utilization or 0.0) * simulated, "latency": latency,
            "bandwidth": bandwidth, "idle": get("idle_seconds") or 0.0, "time": simulated}


def bound_text(row: dict) -> str | None:
    """'latency: 85% of communication is round trips, 15% bytes (communication: 60% of the
    time); a 10× faster link would save 8.1% of the simulated time, no latency 51%' (None
    without the split)."""
    p = parts(row)
    if p is None:
        return None
    time, latency, bandwidth, idle = p["time"], p["latency"], p["bandwidth"], p["idle"]
    comm = latency + bandwidth
    waits = f"; {_pct(idle / time)} waiting for peers" if idle >= 0.005 * time else ""
    if comm + idle < COMPUTE_BOUND * time or (comm == 0 and idle <= p["compute"]):
        of_it = f" ({_pct(latency / comm)} of it round trips)" if comm > 0 else ""
        return (f"compute: {_pct(p['compute'] / time)} of the time computing; communication "
                f"{_pct(comm / time)}{of_it}{waits}")
    if idle > comm:
        of_it = f" ({_pct(latency / comm)} of it round trips)" if comm > 0 else ""
        return (f"waiting for peers (stragglers, or peers that join later): {_pct(idle / time)} "
                f"of the time; communication {_pct(comm / time)}{of_it}")
    kind = "latency" if latency >= bandwidth else "bandwidth"
    return (f"{kind}: {_pct(latency / comm)} of communication is round trips, "
            f"{_pct(bandwidth / comm)} bytes (communication: {_pct(comm / time)} of the "
            f"time); a {FASTER}× faster link would save "
            f"{_pct((1 - 1 / FASTER) * bandwidth / time)} of the simulated time, no latency "
            f"{_pct(latency / time)}{waits}")


def _pct(x: float) -> str:
    """A share as a percentage: whole above 9.5 %, one decimal below; never 0 % or 100 %
    for a share that is not exactly that."""
    if x in (0, 1):
        return f"{100 * x:.0f}%"
    for places in (0 if 100 * x >= 9.5 else 1, 1, 2):
        shown = f"{100 * x:.{places}f}"
        if float(shown) not in (0, 100):
            return f"{shown}%"
    return "<0.01%" if x < 0.5 else ">99.99%"


def _reader(row: dict):
    """The value of a per-node time: a report row's own key, a setup's mean (<key>_mean) or
    a summary's <key>_per_node."""
    def get(key):
        for name in (key, f"{key}_mean", key.replace("_seconds", "_seconds_per_node")):
            if row.get(name) is not None:
                return row[name]
        return None
    return get
