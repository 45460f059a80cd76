"""What a big token file costs in memory: 64 packed nodes training the gpt workload on a
nanoGPT token file of --gigabytes (random uint16 tokens) against the same run on a tiny
file (1 MB), in a fresh folder each.

    python benchmarks/token_memory.py [--gigabytes 1] [--nodes 64] [--steps 20]

Each rank reads its batches' windows with pread (no process maps the file) and draws its
shuffled order of its windows in the worker that trains it. Memory is the peak over the run
of the sum over its processes (launcher, workers, evaluator), sampled every 0.1 s from
/proc: resident set (RSS, which counts a shared page once per process that maps it) and
proportional set (PSS, which splits it between them), PSS split into anonymous memory (the
run's own: models, optimizers, batches, each node's shuffled order of its windows) and
file-backed pages. The figure is the big file's peak minus the tiny file's.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

CHUNK = 1 << 26  # tokens written at a time


def write_tokens(path: Path, tokens: int, vocab: int = 256):
    rng = np.random.default_rng(0)
    with open(path, "wb") as f:
        for start in range(0, tokens, CHUNK):
            rng.integers(0, vocab, min(CHUNK, tokens - start), dtype=np.uint16).tofile(f)


def tree(pid: int) -> list[int]:
    """pid and its descendants."""
    pids, i = [pid], 0
    while i < len(pids):
        try:
            children = Path(f"/proc/{pids[i]}/task/{pids[i]}/children").read_text().split()
        except OSError:
            children = []
        pids += map(int, children)
        i += 1
    return pids


KINDS = ("Rss", "Pss", "Pss_Anon", "Pss_File")


def memory_kb(pid: int) -> tuple:
    """(RSS, PSS, its anonymous part, its file-backed part) of a process in kB, 0s once it is
    gone."""
    try:
        fields = dict(line.split(":", 1) for line in
                      Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:])
    except OSError:
        return (0,) * len(KINDS)
    return tuple(int(fields[kind].split()[0]) for kind in KINDS)


def peak_memory(args: list[str], cwd: Path) -> tuple[dict, dict]:
    """({kind: peak MB}, summary) of one exoframe run."""
    proc = subprocess.Popen([sys.executable, "-m", "exoframe", *args], cwd=cwd,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peak = [0] * len(KINDS)
    done = threading.Event()

    def sample():
        while not done.is_set():
            totals = [sum(x) for x in zip(*(memory_kb(p) for p in tree(proc.pid)))] or peak
            peak[:] = [max(a, b) for a, b in zip(peak, totals)]
            time.sleep(0.1)

    sampler = threading.Thread(target=sample)
    sampler.start()
    out, err = proc.communicate()
    done.set()
    sampler.join()
    if proc.returncode:
        raise SystemExit(f"exoframe {' '.join(args)} failed:\n{err[-2000:]}")
    (run,) = (cwd / "runs").iterdir()
    summary = json.loads((run / "summary.json").read_text())
    return {kind: kb / 1024 for kind, kb in zip(KINDS, peak)}, summary


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gigabytes", type=float, default=1.0)
    parser.add_argument("--nodes", type=int, default=64)
    parser.add_argument("--steps", type=int, default=20)
    options = parser.parse_args()
    rows = []
    for label, size in (("tiny (1 MB)", 1 << 20), (f"{options.gigabytes:g} GB",
                                                   int(options.gigabytes * (1 << 30)))):
        with tempfile.TemporaryDirectory() as folder:
            folder = Path(folder)
            write_tokens(folder / "train.bin", size // 2)
            args = ["run", "--workload", "gpt", "-w", "data=train.bin", "-w", "n_layer=1",
                    "-w", "n_embd=32", "-w", "block_size=32", "--nodes", str(options.nodes),
                    "--steps", str(options.steps), "--strategy", "diloco", "-p", "H=5",
                    "--compute", "fixed:10ms", "--eval-every", str(options.steps),
                    "--out", "runs"]
            peak, summary = peak_memory(args, folder)
        rows.append(peak)
        print(f"{label:>12}: peak over the run's processes (MB): "
              + ", ".join(f"{kind} {mb:.1f}" for kind, mb in peak.items())
              + f"; {options.nodes} nodes, {options.steps} steps, elapsed "
              f"{summary['elapsed_seconds']:.1f} s", flush=True)
    print("the big file adds (MB): " + ", ".join(f"{kind} {rows[1][kind] - rows[0][kind]:+.1f}"
                                                for kind in KINDS))


if __name__ == "__main__":
    os.environ.setdefault("PYTHONPATH", str(Path(__file__).resolve().parent.parent))
    main()
