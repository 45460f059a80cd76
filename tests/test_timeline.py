"""`exoframe timeline`: a run's timeline as Trace Event Format JSON and a picture, from the
simulated clock (a replay of the run's trace with the simulator's log) and from a run on a
real network (the times its ranks measured)."""
import json
import math
import subprocess
import sys

import pytest

from exoframe.experiments.trace_events import timeline


def run(tmp_path, *args):
    done = subprocess.run([sys.executable, "-m", "exoframe", "run", "--workload", "mlp",
                           "--no-progress", "--out", str(tmp_path / "runs"), *args],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    (folder,) = (tmp_path / "runs").iterdir()
    return folder


def check_trace_event_format(data: dict):
    """What Perfetto and chrome://tracing read: complete events (X) with a name, numeric
    pid and tid, microsecond ts and dur; metadata (M) naming processes and threads."""
    json.loads(json.dumps(data, allow_nan=False))  # strict JSON
    assert data["displayTimeUnit"] == "ms"
    for event in data["traceEvents"]:
        assert event["ph"] in ("X", "M") and isinstance(event["name"], str)
        assert isinstance(event["pid"], int)
        if event["ph"] == "X":
            assert isinstance(event["tid"], int)
            assert math.isfinite(event["ts"]) and event["dur"] >= 0
        else:
            assert event["name"] in ("process_name", "thread_name") and event["args"]["name"]


def test_a_streaming_diloco_timeline_shows_exchanges_beside_compute(tmp_path):
    folder = run(tmp_path, "--strategy", "streaming-diloco", "-p", "H=4", "-p", "fragments=2",
                 "--nodes", "3", "--steps", "8", "--net", "wan-100mbps",
                 "--compute", "fixed:100ms")
    done = subprocess.run([sys.executable, "-m", "exoframe", "timeline", str(folder)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    data = json.loads((folder / "timeline.json").read_text())
    check_trace_event_format(data)
    assert (folder / "timeline.png").stat().st_size > 0
    bars = [e for e in data["traceEvents"] if e["ph"] == "X"]
    summary = json.loads((folder / "summary.json").read_text())
    for rank in range(3):
        compute = [e for e in bars if e["pid"] == rank and e["tid"] == 0]
        exchanges = [e for e in bars if e["pid"] == rank and e["tid"] == 1]
        # the compute bars are the run's compute: 8 steps of 100 ms
        assert sum(e["dur"] for e in compute) == pytest.approx(
            summary["per_rank"][rank]["compute_seconds"] * 1e6, rel=1e-9)
        # the fragments' exchanges run while the rank computes: the overlap is there
        overlap = sum(max(0.0, min(a["ts"] + a["dur"], b["ts"] + b["dur"]) - max(a["ts"], b["ts"]))
                      for a in compute for b in exchanges)
        assert overlap > 0
        # the last exchange ends at the rank's simulated clock
        assert max(e["ts"] + e["dur"] for e in exchanges + compute) == pytest.approx(
            summary["per_rank"][rank]["simulated_seconds"] * 1e6, rel=1e-9)
    wire = [e for e in bars if e["pid"] == 3]
    assert wire and all(e["name"].endswith("B") for e in wire)


def test_a_run_on_a_real_network_has_its_measured_exchanges(tmp_path):
    folder = run(tmp_path, "--strategy", "ddp", "--nodes", "2", "--steps", "3", "--net", "real")
    data = timeline(folder)
    check_trace_event_format(data)
    assert data["otherData"]["clock"] == "measured"
    exchanges = [e for e in data["traceEvents"] if e["ph"] == "X" and e["tid"] == 1]
    assert {e["pid"] for e in exchanges} == {0, 1} and len(exchanges) >= 6


def test_a_folder_without_a_trace_is_one_line(tmp_path):
    done = subprocess.run([sys.executable, "-m", "exoframe", "timeline", str(tmp_path)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "no trace.json" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
