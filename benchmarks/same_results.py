"""Run a fixed set of configs and compare their records with another checkout's.

    python benchmarks/same_results.py run OUT        # runs every config into OUT
    python benchmarks/same_results.py compare A B    # exit 1 when any record differs

metrics.jsonl must match byte for byte. summary.json and a sweep's results must match
byte for byte once the fields that measure this machine (wall-clock seconds, memory) are
set aside; those are listed in WALL_CLOCK_FIELDS. So is `schema_version` (summary.json's
and trace.json's, exoframe/schema): a checkout from before it was added writes none, and it
changes no result. Used to show that a refactor or a speed-up changed no result.
"""
import csv
import io
import json
import subprocess
import sys
from pathlib import Path

COMMON = ["--workload", "mlp", "--compute", "fixed:100ms", "--net", "wan-100mbps"]
RUNS = {
    "ddp": ["--strategy", "ddp", "--nodes", "4", "--steps", "12"],
    "diloco": ["--strategy", "diloco", "--nodes", "4", "--steps", "20", "-p", "H=5"],
    "streaming-diloco": ["--strategy", "streaming-diloco", "--nodes", "4", "--steps", "20",
                         "-p", "H=6", "-p", "fragments=3"],
    "gossip": ["--strategy", "gossip", "--nodes", "4", "--steps", "12"],
    "param-server": ["--strategy", "param-server", "--nodes", "4", "--steps", "12",
                     "-p", "servers=2", "--optimizer", "sgd", "--lr", "0.05"],
    "faults": ["--strategy", "diloco", "--nodes", "4", "--steps", "30", "-p", "H=5",
               "--faults", "2@1s:1s"],
    "packing": ["--strategy", "localsgd", "--nodes", "16", "--steps", "10", "-p", "H=5",
                "--nodes-per-process", "8"],
    "checkpoint": ["--strategy", "diloco", "--nodes", "4", "--steps", "20", "-p", "H=5",
                   "--checkpoint-every", "10"],
}
SWEEP = ["--strategy", "ddp,diloco", "--nodes", "4", "--steps", "10", "--workload", "mlp",
         "--compute", "fixed:100ms", "--net", "wan-100mbps,wan-1gbps"]
WALL_CLOCK_FIELDS = {"elapsed_seconds", "startup_seconds", "seconds_per_step",
                     "samples_per_second", "peak_rss_mb_per_rank",
                     "run_dir", "validating_seconds", "moving_models_seconds"}
SET_ASIDE = WALL_CLOCK_FIELDS | {"schema_version"}


def exoframe(*args):
    subprocess.run([sys.executable, "-m", "exoframe", *args], check=True,
                   stdout=subprocess.DEVNULL)


def run_all(out: Path):
    for name, flags in RUNS.items():
        exoframe("run", *COMMON, *flags, "--out", str(out / name))
    (run_dir,) = (out / "checkpoint").iterdir()
    exoframe("resume", str(run_dir), "--steps", "30")
    exoframe("sweep", *SWEEP, "--out", str(out / "sweep"))


def without_wall_clock(value):
    if isinstance(value, dict):
        return {k: without_wall_clock(v) for k, v in value.items() if k not in SET_ASIDE}
    if isinstance(value, list):
        return [without_wall_clock(v) for v in value]
    return value


def records(root: Path):
    """{relative path with the run folder's timestamp dropped: comparable text}"""
    found = {}
    for path in sorted(root.rglob("*")):
        if path.name not in ("metrics.jsonl", "summary.json", "trace.json", "sweep.json",
                             "sweep_summary.json", "sweep.csv"):
            continue
        parts = path.relative_to(root).parts
        key = "/".join(p.split("-", 2)[-1] if p[:8].isdigit() else p for p in parts)
        text = path.read_text()
        if path.suffix == ".json":
            text = json.dumps(without_wall_clock(json.loads(text)), sort_keys=True)
        elif path.suffix == ".csv":
            rows = list(csv.DictReader(io.StringIO(text)))
            text = json.dumps(without_wall_clock(rows))
        found[key] = text
    return found


def compare(a: Path, b: Path) -> int:
    ra, rb = records(a), records(b)
    differ = sorted(k for k in ra.keys() | rb.keys() if ra.get(k) != rb.get(k))
    for key in differ:
        print(f"differs: {key}" + ("" if key in ra and key in rb else " (missing on one side)"))
    print(f"{len(ra.keys() | rb.keys()) - len(differ)} records identical, {len(differ)} differ")
    return 1 if differ else 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["run"]:
        run_all(Path(sys.argv[2]))
    elif sys.argv[1:2] == ["compare"]:
        sys.exit(compare(Path(sys.argv[2]), Path(sys.argv[3])))
    else:
        sys.exit(__doc__)
