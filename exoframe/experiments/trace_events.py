"""A run's timeline in Trace Event Format (the JSON that Perfetto and chrome://tracing
load): per rank its compute and each exchange, from when the rank joined it to when it was
done with it; per TCP connection each message on the wire. A simulated run's trace is
replayed with the simulator's log on (the replay gives the run's own clocks); a run on a
real network (`--net real`, `exoframe emulate`) has each exchange's times as its ranks
measured them: arrived, waiting for the others from, ended."""
from __future__ import annotations

from pathlib import Path

from ..errors import ExoframeError
from ..inputs import load_json
from ..plugins import get_plugin_manager
from ..sim.setup import resolve_sim
from ..sim.traces.replay import ReplayError, replay
from .run_replays import check_replayable

US = 1e6  # Trace Event Format counts microseconds


def timeline(run_dir) -> dict:
    """The run's timeline: {"traceEvents": [...], "displayTimeUnit": "ms", "otherData"}."""
    path = Path(run_dir) / "trace.json"
    if not path.is_file():
        raise ExoframeError(f"{run_dir}: no trace.json: give the folder of a run that "
                            f"completed (`exoframe run` writes one).")
    trace = load_json(path, "trace")
    events = _measured(trace) if trace.get("real_network") else _simulated(trace, run_dir)
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"strategy": trace["strategy"], "net": trace["net"],
                          "nodes": trace["nodes"], "steps": trace["steps"],
                          "clock": "measured" if trace.get("real_network") else "simulated"}}


def _simulated(trace: dict, run_dir) -> list[dict]:
    check_replayable(trace, run_dir)
    nodes = trace["nodes"]
    sim = resolve_sim(trace["net"], "measured", "", nodes, get_plugin_manager())
    log: list = []
    try:
        result = replay(trace["ranks"], sim.topology, sim.algorithms, seed=trace["seed"],
                        overlap_rate=trace.get("overlap_rate"), log=log)
    except ReplayError as e:
        raise ExoframeError(f"timeline of {run_dir}: {e}") from None
    events = _names(nodes)
    for clock in result.ranks:
        events += [_bar(clock.rank, 0, "compute", start, end) for start, end in clock.segments]
    joined = {}
    wire, sending = {}, {}
    for entry in log:
        if entry[0] == "join":
            _, rank, key, kind, nbytes, t = entry
            joined[(rank, key)] = (kind, nbytes, t)
        elif entry[0] == "done" and (entry[1], entry[2]) in joined:
            _, rank, key, t = entry
            kind, nbytes, start = joined.pop((rank, key))
            events.append(_bar(rank, 1, f"{kind} {_size(nbytes)}", start, t))
        elif entry[0] == "send":
            _, src, dst, flow, t, nbytes = entry
            sending[flow] = (src, dst, t, nbytes)
        elif entry[0] == "sent" and entry[1] in sending:
            src, dst, start, nbytes = sending.pop(entry[1])
            tid = wire.setdefault((src, dst), len(wire))
            events.append(_bar(nodes, tid, _size(nbytes), start, entry[2]))
    events.append({"name": "process_name", "ph": "M", "pid": nodes,
                   "args": {"name": "network: messages on the wire"}})
    events += [{"name": "thread_name", "ph": "M", "pid": nodes, "tid": tid,
                "args": {"name": f"rank {src} -> rank {dst}"}}
               for (src, dst), tid in wire.items()]
    return events


def _measured(trace: dict) -> list[dict]:
    """From each rank's ["x", key, arrived, waiting from, ended, hidden] (wall clock), on
    one time axis from the first arrival; compute is the time between exchanges."""
    exchanges = [[e for e in rank if e and e[0] == "x" and e[4] is not None]
                 for rank in trace["ranks"]]
    starts = [e[2] for rank in exchanges for e in rank]
    if not starts:
        raise ExoframeError("the run on the real network recorded no exchange to show.")
    origin = min(starts)
    events = _names(trace["nodes"])
    for rank, entries in enumerate(exchanges):
        last = None
        for _, key, arrived, waiting, ended, _hidden in entries:
            if last is not None and arrived > last:
                events.append(_bar(rank, 0, "compute", last - origin, arrived - origin))
            events.append(_bar(rank, 1, str(key[0]) if key else "exchange", arrived - origin,
                               ended - origin))
            if waiting is not None and waiting < ended:
                events.append(_bar(rank, 2, "waiting for the others", waiting - origin,
                                   ended - origin))
            last = ended
    return events


def _names(nodes: int) -> list[dict]:
    names = []
    for rank in range(nodes):
        names.append({"name": "process_name", "ph": "M", "pid": rank,
                      "args": {"name": f"rank {rank}"}})
        for tid, name in enumerate(("compute", "exchanges", "waiting")):
            names.append({"name": "thread_name", "ph": "M", "pid": rank, "tid": tid,
                          "args": {"name": name}})
    return names


def _bar(pid: int, tid: int, name: str, start: float, end: float) -> dict:
    return {"name": name, "ph": "X", "pid": pid, "tid": tid, "ts": start * US,
            "dur": max(0.0, end - start) * US}


def _size(nbytes: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if nbytes >= scale:
            return f"{nbytes / scale:.3g} {unit}"
    return f"{nbytes:.0f} B"
