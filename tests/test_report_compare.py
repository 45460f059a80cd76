"""What `exoframe report` compares: the speed-up of each setup over a baseline strategy (a
column, speedup.csv and a plot), the bandwidth each strategy needs for 50-99 % compute
utilization (a table and utilization.csv), and figures for a paper: formats, resolution,
captions instead of titles, one smoothing, every marker in the legend, seeds' spread."""
import csv
import dataclasses
import json
import math
import statistics

import pytest
import yaml
from conftest import one_line_error as bad

from exoframe.cli import main
from exoframe.config import RunConfig
from exoframe.report import plots

MBIT = 1e6 / 8  # bytes/s
BANDWIDTHS = [10, 100, 1000]  # Mbit/s
# strategy -> (simulated seconds, compute utilization) at each bandwidth, and its steps
TIMES = {"ddp": [40.0, 8.0, 4.0], "diloco": [10.0, 4.0, 3.2]}
UTILIZATION = {"ddp": [0.2, 0.6, 0.85], "diloco": [0.55, 0.92, 0.99]}
STEPS = {"ddp": 100, "diloco": 40}


def write_run(folder, strategy, seed, mbit, seconds, utilization, steps, faults="none",
              failed_at=()):
    """A run folder as the engine writes it: config.yaml, summary.json, metrics.jsonl."""
    folder.mkdir(parents=True)
    config = RunConfig(workload="mlp", strategy=strategy, seed=seed, net=f"net-{mbit}.yaml",
                       compute="fixed:10ms", steps=100,  # (diloco stops early)
                       strategy_params={"H": 10} if strategy == "diloco" else {})
    (folder / "config.yaml").write_text(yaml.safe_dump(dataclasses.asdict(config),
                                                       sort_keys=False))
    times = [seconds * (k + 1) / steps for k in range(steps)]
    losses = [2 * 0.97 ** k + 0.02 * math.sin(k + seed) for k in range(steps)]
    (folder / "metrics.jsonl").write_text("".join(json.dumps({
        "step": k + 1, "loss": losses[k], "val_loss": losses[k] if k % 5 == 4 else None,
        "sim_time": times[k], "bytes_sent_per_node": 1e4 * (k + 1)}) + "\n"
        for k in range(steps)))
    (folder / "summary.json").write_text(json.dumps({
        "strategy": strategy, "seed": seed, "net": f"net-{mbit}.yaml",
        "bottleneck_bandwidth": mbit * MBIT, "latency": 0.01, "simulated_seconds": seconds,
        "compute_utilization": utilization, "bytes_sent_per_node": 1e4 * steps,
        "final_loss": losses[-1], "final_val_loss": losses[-1], "num_nodes": 2,
        "workload": "mlp", "model_parameters": 1000, "compute_model": "fixed:0.01s/step",
        "validated_model": "the model", "faults": faults,
        "failures": [{"failed_at": t} for t in failed_at], "lost_steps": len(failed_at)}))


def seconds(strategy, i, seed):
    return TIMES[strategy][i] * (1 + (0.1 if strategy == "ddp" else 0.05) * seed)


@pytest.fixture
def sweep(tmp_path):
    """ddp and diloco at three bandwidths, three seeds each (a sweep folder's runs/)."""
    for strategy in TIMES:
        for i, mbit in enumerate(BANDWIDTHS):
            for seed in range(3):
                write_run(tmp_path / "sweep" / "runs" / f"{strategy}-{mbit}-{seed}", strategy,
                          seed, mbit, seconds(strategy, i, seed), UTILIZATION[strategy][i],
                          STEPS[strategy])
    return tmp_path / "sweep"


@pytest.fixture
def drawn(monkeypatch):
    """Each saved figure's title (after saving), legend entries and axis label, by name."""
    figures = {}
    save = plots._save

    def spy(plt, fig, ax, path, legend_title, style):
        legend = ax.get_legend_handles_labels()[1]
        save(plt, fig, ax, path, legend_title, style)
        figures[path.stem] = {"title": ax.get_title(), "legend": legend,
                              "ylabel": ax.get_ylabel(), "bands": len(ax.collections),
                              "seed_lines": sum(line.get_label() == "_seed"
                                                for line in ax.get_lines())}

    monkeypatch.setattr(plots, "_save", spy)
    return figures


def read_csv(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def test_report_writes_the_speedup_and_utilization_tables_and_plot(sweep, tmp_path, capsys,
                                                                  drawn):
    out = tmp_path / "figures"
    main(["report", str(sweep), "--out", str(out), "--format", "png,svg", "--dpi", "50",
          "--paper"])
    printed = capsys.readouterr().out.splitlines()
    header = printed[0].split("  ")
    assert {"speed-up vs ddp", "simulated time (s)"} <= {h.strip() for h in header}, printed[0]

    # Speed-up: ddp's time over diloco's, seed by seed, on the same network.
    speedups = {(r["strategy"], r["net"]): r for r in read_csv(out / "speedup.csv")}
    for i, mbit in enumerate(BANDWIDTHS):
        ratios = [seconds("ddp", i, s) / seconds("diloco", i, s) for s in range(3)]
        row = speedups["diloco", f"net-{mbit}.yaml"]
        assert float(row["speedup_mean"]) == pytest.approx(statistics.mean(ratios))
        assert float(row["speedup_std"]) == pytest.approx(statistics.stdev(ratios))
        assert row["baseline"] == "ddp" and row["seeds"] == "3"
        assert float(speedups["ddp", f"net-{mbit}.yaml"]["speedup_mean"]) == pytest.approx(1)
        line = next(line for line in printed if line.split()[:2] == ["diloco",
                                                                     f"net-{mbit}.yaml"])
        assert f"{statistics.mean(ratios):.2f}× ± {statistics.stdev(ratios):.2f}" in line
        # the simulated time in the header's one unit (s: the longest run is under 2 min)
        times = [seconds("diloco", i, s) for s in range(3)]
        assert f"  {statistics.mean(times):.3g} ± {statistics.stdev(times):.3g}  " in line
        # final loss with its spread over the seeds
        assert row["final_val_loss_std"] not in ("", "0.0")

    # Utilization: the bandwidth for each level, interpolated in log bandwidth.
    levels = {r["strategy"]: r for r in read_csv(out / "utilization.csv")}
    ddp, diloco = levels["ddp"], levels["diloco"]
    assert float(ddp["bandwidth_for_50pct_mbit"]) == pytest.approx(10 ** 1.75)
    assert float(ddp["bandwidth_for_80pct_mbit"]) == pytest.approx(10 ** 2.8)
    assert ddp["bandwidth_for_90pct_mbit"] == ">1000"
    assert diloco["bandwidth_for_50pct_mbit"] == "<=10"
    assert float(diloco["bandwidth_for_80pct_mbit"]) == pytest.approx(10 ** (1 + 0.25 / 0.37))
    assert float(diloco["bandwidth_for_95pct_mbit"]) == pytest.approx(10 ** (2 + 0.03 / 0.07))
    (ddp_line,) = [line for line in printed if line.split()[:2] == ["ddp", "3"]]
    assert ddp_line.split()[2:] == ["56.2", "Mbit/s", "631", "Mbit/s", ">", "1", "Gbit/s",
                                    ">", "1", "Gbit/s", ">", "1", "Gbit/s"]

    # The figures: each format, a caption beside each and no title in it.
    for stem in ("speedup_vs_bandwidth", "utilization_vs_bandwidth", "loss_vs_time_ddp"):
        assert (out / f"{stem}.png").stat().st_size > 0 and (out / f"{stem}.svg").is_file()
        assert drawn[stem]["title"] == ""
    caption = (out / "speedup_vs_bandwidth.caption.txt").read_text()
    assert caption.startswith("Speed-up over ddp versus bandwidth. 2 nodes · mlp 1k params")
    assert "diloco (H=10)" not in drawn["speedup_vs_bandwidth"]["legend"]
    assert drawn["speedup_vs_bandwidth"]["legend"] == ["diloco", "ddp (1×)"]
    # one smoothing for every training-loss plot (diloco's runs are shorter than ddp's)
    assert {drawn[s]["ylabel"] for s in drawn if s.startswith(("loss_vs_time", "compare"))} \
        == {"training loss (centred mean over 5 steps)"}
    # three seeds: a band per setup
    assert drawn["loss_vs_time_ddp"]["bands"] == 3 and drawn["loss_vs_time_ddp"]["seed_lines"] == 0

    main(["report", str(sweep), "--baseline", "diloco"])
    line = next(line for line in capsys.readouterr().out.splitlines()
                if line.split()[:2] == ["ddp", "net-10.yaml"])
    inverse = statistics.mean(seconds("diloco", 0, s) / seconds("ddp", 0, s) for s in range(3))
    assert f"{inverse:.2f}×" in line


def test_failures_are_in_the_legend_and_two_seeds_are_drawn_each(tmp_path, capsys, drawn):
    for seed in range(2):
        write_run(tmp_path / "runs" / f"ddp-{seed}", "ddp", seed, 100, 8.0, 0.5, 30,
                  faults="1@2s:1s", failed_at=[2.0])
    main(["report", *map(str, (tmp_path / "runs").iterdir()), "--out", str(tmp_path / "out")])
    figure = drawn["loss_vs_time_ddp"]
    assert "node failure" in figure["legend"], figure["legend"]
    assert figure["bands"] == 0 and figure["seed_lines"] == 2
    assert "thin lines: each seed (under 3)" in figure["title"]
    assert (tmp_path / "out" / "loss_vs_time_ddp.png").is_file()
    assert not list((tmp_path / "out").glob("*.caption.txt"))  # titles, not captions


def test_bad_report_options_are_one_line(sweep, tmp_path, capsys):
    out = str(tmp_path / "out")
    assert "--baseline: no run of 'sparta'" in bad(capsys, "report", sweep, "--baseline",
                                                   "sparta")
    assert "--format: unknown figure format 'gif'" in bad(capsys, "report", sweep, "--out", out,
                                                          "--format", "png,gif")
    assert "--dpi: 0 dots per inch" in bad(capsys, "report", sweep, "--out", out, "--dpi", "0")
