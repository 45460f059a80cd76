"""The run summary (summary.json) and its short terminal table."""
from __future__ import annotations


def build_summary(job, rows: list[dict], launch_result) -> dict:
    ranks = launch_result.rank_results
    last = rows[-1] if rows else {}
    val_rows = [r for r in rows if r.get("val_loss") is not None]
    nodes = job.nodes
    return {
        "strategy": job.strategy_name,
        "strategy_params": vars(job.strategy_params).copy(),
        "workload": job.workload_name,
        "num_nodes": nodes,
        "steps": job.steps,
        "final_loss": last.get("loss"),
        "final_val_loss": val_rows[-1]["val_loss"] if val_rows else None,
        "best_achievable_loss": job.best_loss,
        "bytes_sent_per_node": sum(r["bytes_sent"] for r in ranks) / nodes,
        "bytes_received_per_node": sum(r["bytes_received"] for r in ranks) / nodes,
        "bytes_sent_per_rank": [r["bytes_sent"] for r in ranks],
        "bytes_received_per_rank": [r["bytes_received"] for r in ranks],
        "traffic_by_kind_rank0": ranks[0]["traffic"],
        "elapsed_seconds": launch_result.elapsed_seconds,
        "startup_seconds": launch_result.startup_seconds,
        "seconds_per_step": (launch_result.elapsed_seconds - launch_result.startup_seconds)
        / max(1, job.steps - 1),
        "peak_rss_mb_per_rank": [round(r["peak_rss_mb"], 1) for r in ranks],
    }


def format_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1000
    return f"{n} B"


def summary_table(summary: dict) -> str:
    def fmt(x):
        return "-" if x is None else f"{x:.4f}"

    rows = [
        ("strategy", summary["strategy"]),
        ("workload", summary["workload"]),
        ("nodes", str(summary["num_nodes"])),
        ("steps", str(summary["steps"])),
        ("final train loss", fmt(summary["final_loss"])),
        ("final val loss", fmt(summary["final_val_loss"])),
        ("best achievable loss", fmt(summary["best_achievable_loss"])),
        ("sent per node", format_bytes(summary["bytes_sent_per_node"])),
        ("elapsed (real)", f"{summary['elapsed_seconds']:.1f} s "
                           f"(start-up {summary['startup_seconds']:.1f} s)"),
    ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"  {k:<{width}}  {v}" for k, v in rows)
