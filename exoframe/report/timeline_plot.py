"""A timeline (experiments/trace_events.py, Trace Event Format) as a picture: a row per
rank with its compute and, beneath, its exchanges (and what it spent waiting for the others),
then a row per TCP connection with its messages on the wire; overlap shows as bars side by
side."""
from __future__ import annotations

from pathlib import Path

ROWS = {0: ("compute", "tab:blue"), 1: ("exchange", "tab:orange"), 2: ("waiting", "tab:red")}


def draw(timeline: dict, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bars = [e for e in timeline["traceEvents"] if e["ph"] == "X"]
    nodes = timeline["otherData"]["nodes"]
    wires = sorted({e["tid"] for e in bars if e["pid"] == nodes})
    labels = {(e["pid"], e["tid"]): e["args"]["name"] for e in timeline["traceEvents"]
              if e["ph"] == "M" and e["name"] == "thread_name"}
    used = {(e["pid"], e["tid"]) for e in bars}
    rows = [(rank, tid) for rank in range(nodes) for tid in ROWS if (rank, tid) in used] + \
        [(nodes, t) for t in wires]
    end = max((e["ts"] + e["dur"] for e in bars), default=1.0) / 1e6
    unit, scale = ("s", 1.0) if end >= 2 else ("ms", 1e3)
    fig, ax = plt.subplots(figsize=(10, 0.9 + 0.28 * len(rows)))
    for y, (pid, tid) in enumerate(rows):
        colour = ROWS[tid][1] if pid < nodes else "tab:gray"
        spans = [(e["ts"] / 1e6 * scale, e["dur"] / 1e6 * scale) for e in bars
                 if e["pid"] == pid and e["tid"] == tid]
        if spans:
            ax.broken_barh(spans, (y - 0.4, 0.8), facecolors=colour)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([f"rank {pid} {ROWS[tid][0]}" if pid < nodes else labels[(pid, tid)]
                        for pid, tid in rows], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel(f"{timeline['otherData']['clock']} time ({unit})")
    data = timeline["otherData"]
    ax.set_title(f"{data['strategy']} on {data['net']}, {nodes} nodes, {data['steps']} steps",
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
