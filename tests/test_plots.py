"""The sweep's plots and its mean ± spread over seeds: distinct line styles, one line per
setup (its seeds' mean in a min–max band), legends beside the axes, a comparison plot per
network with safe file names, and sweep_summary.csv's numbers."""
import csv
import json
import random
import re
import statistics
from pathlib import Path

import pytest

from exoframe.cli import main
from exoframe.report import plots
from exoframe.report.plot_style import line_styles
from exoframe.sim.network.units import format_bandwidth
from exoframe.report.sweep_table import COLUMNS, table, write_outputs

STRATEGIES = ["ddp", "diloco", "localsgd"]
# a preset, a YAML file in a folder with a space, and names that only differ in "/" or " "
NETS = ["wan-100mbps", "nets/my net.yaml", "a/b", "a b", "lan 1gbps", "x", "y/z/w", "geo-2dc"]
SEEDS = [0, 1]
BEST = 0.5
# each network's label in the figures: its bandwidth (1e6 * 2**j bytes/s below)
LABEL = {net: format_bandwidth(1e6 * 2 ** j) for j, net in enumerate(NETS)}


def make_rows(strategies=STRATEGIES, nets=NETS, seeds=SEEDS, steps=30):
    """Rows as collect_rows gives them, with made-up numbers; seed 1 stops 5 steps early."""
    rng = random.Random(0)
    rows = []
    for strategy in strategies:
        for j, net in enumerate(nets):
            for seed in seeds:
                n = steps - 5 * seed
                times = [0.01 * (j + 1) * (k + 1) * (1 + 0.01 * seed) for k in range(n)]
                losses = [3 * 0.95 ** k + rng.random() * 0.2 for k in range(n)]
                rows.append({
                    "strategy": strategy, "seed": seed, "net": net,
                    "bottleneck_bandwidth": 1e6 * 2 ** j, "projection": None,
                    "simulated_seconds": times[-1],
                    "time_to_target": rng.choice([None, rng.uniform(0.1, 1)]),
                    "compute_utilization": rng.random(),
                    "bytes_sent_per_node": rng.uniform(1e6, 1e7), "final_loss": losses[-1],
                    "final_val_loss": rng.uniform(1, 2), "source": "run", "run_dir": "r",
                    "losses": losses, "sim_times": times,
                    "val_losses": [3 * 0.96 ** k if k % 5 == 4 else None for k in range(n)],
                    "bytes_sent": [1e5 * (j + 1) * (k + 1) for k in range(n)],
                    "best_achievable_loss": BEST, "target_loss": 1.0, "num_nodes": 4,
                    "workload": "gpt", "model_parameters": 15800,
                    "compute_model": "fixed:0.05s/step"})
    return rows


@pytest.fixture
def drawn(monkeypatch):
    """What each saved figure drew, by file name: its lines, bands, title, and whether the
    legend lies right of the axes."""
    figures = {}
    save = plots._save

    def spy(plt, fig, ax, path, legend_title, style):
        save(plt, fig, ax, path, legend_title, style)  # (written through a temporary file)
        fig.canvas.draw()
        ax = fig.axes[0]
        figures[Path(path).name] = {
            "lines": [(line.get_label(), line.get_color(), line.get_linestyle(),
                       list(line.get_xdata()), list(line.get_ydata())) for line in ax.get_lines()],
            "bands": [[y for _, y in c.get_paths()[0].vertices] for c in ax.collections],
            "title": ax.get_title(),
            "ylabel": ax.get_ylabel(),
            "yticks": [t.get_text() for t in ax.get_yticklabels() if t.get_text()],
            "xticks": [t.get_text() for t in ax.get_xticklabels() if t.get_text()],
            "legend_outside": ax.get_legend().get_window_extent().x0
            >= ax.get_window_extent().x1}

    monkeypatch.setattr(plots, "_save", spy)
    return figures


@pytest.mark.parametrize("k", range(1, 41))
def test_up_to_40_lines_never_share_a_colour_and_line_style(k):
    styles = line_styles(k)
    assert len({(s["color"], s["linestyle"]) for s in styles}) == k
    assert all(a["linestyle"] != b["linestyle"] for a, b in zip(styles, styles[1:]))


def test_more_lines_add_markers_and_stay_distinct():
    styles = line_styles(320)
    assert len({(s["color"], s["linestyle"], s.get("marker")) for s in styles}) == 320
    assert "marker" not in styles[39] and "marker" in styles[40]


def smoothed(losses, window):
    """The mean of the `window` steps centred on each step, fewer where the run's ends
    leave fewer on one side (as many on both sides)."""
    half = window // 2
    out = []
    for i in range(len(losses)):
        side = min(half, i, len(losses) - 1 - i)
        out.append(statistics.mean(losses[i - side:i + side + 1]))
    return out


def test_smoothing_states_its_window_and_leaves_a_straight_line_straight():
    from exoframe.report.plot_style import smoothed as plotted, smoothing_window

    assert [smoothing_window(n) for n in (10, 19, 60, 100, 420, 10_000)] == [1, 1, 3, 5, 21, 21]
    line = [5 - 0.01 * k for k in range(100)]
    # a trailing window lags and fills up (a kink at its width); a centred one does neither
    assert plotted(line, 21) == pytest.approx(line, abs=1e-12)
    noisy = [random.Random(k).random() for k in range(50)]
    assert plotted(noisy, 9) == pytest.approx(smoothed(noisy, 9))
    assert plotted(noisy, 9)[0] == noisy[0]


def test_3_strategies_8_networks_3_seeds_give_one_line_per_setup_in_a_band(tmp_path, drawn):
    rows = make_rows(steps=100, seeds=[0, 1, 2])
    written = write_outputs(rows, tmp_path, target_loss=1.5)
    names = sorted(p.name for p in tmp_path.glob("*.png"))
    compare = [n for n in names if n.startswith("compare_")]
    validation = [n for n in names if n.startswith("val_loss_")]
    assert [n for n in names if not n.startswith(("compare_", "val_loss_"))] == [
        "loss_vs_bytes.png", "loss_vs_time_ddp.png", "loss_vs_time_diloco.png",
        "loss_vs_time_localsgd.png", "speedup_vs_bandwidth.png",
        "time_to_target_vs_bandwidth.png",
        "time_vs_bandwidth.png", "utilization_vs_bandwidth.png"]
    assert len(validation) == len(NETS)
    assert len(compare) == len(NETS)  # "a/b" and "a b" both give a_b: the second is a_b_2
    assert all(re.fullmatch(r"compare_[A-Za-z0-9._-]+\.png", n) for n in compare)
    assert {"compare_my_net.png", "compare_a_b.png", "compare_a_b_2.png"} <= set(compare)
    assert set(names) <= {p.name for p in written}

    for name, figure in drawn.items():
        assert figure["legend_outside"], name
        curves = [line for line in figure["lines"] if not line[0].startswith(("target", "best"))
                  and line[0] and not line[0].startswith("_")]
        assert len({(colour, style) for _, colour, style, _, _ in curves}) == len(curves), name
        # time to target: over the seeds that reached it; a speed-up: over the seeds
        # that reached it in both setups
        assert re.search("mean of (1–)?3 seeds" if name != "speedup_vs_bandwidth.png"
                         else "mean of 1–[23] seeds", figure["title"]), name
        # the runs' context, and axes labelled in plain numbers
        assert "4 nodes · gpt 15.8k params · compute fixed:0.05s/step" in figure["title"], name
        assert not any("e+" in t or "$" in t for t in figure["xticks"] + figure["yticks"]), name
    assert drawn["loss_vs_time_ddp.png"]["ylabel"] == "training loss (centred mean over 5 steps)"
    assert drawn["val_loss_geo-2dc.png"]["ylabel"] == "validation loss (held model)"
    # a time axis over less than a decade is labelled at round values inside it
    assert len(drawn["time_vs_bandwidth.png"]["yticks"]) >= 4
    assert "val loss 1.5" in drawn["time_to_target_vs_bandwidth.png"]["title"]

    ddp = drawn["loss_vs_time_ddp.png"]
    labels = [line[0] for line in ddp["lines"]]
    # fastest network first, each by its bandwidth (these rows give no latency)
    assert labels[:8] == [LABEL[net] for net in reversed(NETS)]
    assert labels[8:] == ["target 1.5 (val loss)", f"best achievable {BEST:g}"]
    assert [line[4] for line in ddp["lines"][8:]] == [[1.5, 1.5], [BEST, BEST]]
    assert len(ddp["bands"]) == 8

    # The line of ddp on wan-100mbps: the seeds' mean, step by step, up to the shortest seed.
    seeds = [r for r in rows if r["strategy"] == "ddp" and r["net"] == "wan-100mbps"]
    curves = [smoothed(r["losses"], 5) for r in seeds]
    n = min(len(c) for c in curves)
    (line,) = [line for line in ddp["lines"] if line[0] == LABEL["wan-100mbps"]]
    assert len(line[4]) == n
    assert line[4] == pytest.approx([statistics.mean(c[i] for c in curves) for i in range(n)])
    assert line[3] == pytest.approx([statistics.mean(r["sim_times"][i] for r in seeds)
                                     for i in range(n)])
    band = drawn["loss_vs_time_ddp.png"]["bands"][labels.index(LABEL["wan-100mbps"])]
    assert min(band) == pytest.approx(min(min(c[:n]) for c in curves))
    assert max(band) == pytest.approx(max(max(c[:n]) for c in curves))

    # A comparison plot: one line per strategy on that network.
    geo = drawn["compare_geo-2dc.png"]
    assert [line[0] for line in geo["lines"]] == [*STRATEGIES, "target 1.5 (val loss)",
                                                  f"best achievable {BEST:g}"]

    # Validation loss: at the steps every seed validated, their mean.
    val = drawn["val_loss_geo-2dc.png"]
    (line,) = [line for line in val["lines"] if line[0] == "diloco"]
    seeds = [r for r in rows if r["strategy"] == "diloco" and r["net"] == "geo-2dc"]
    steps = [k for k in range(90) if k % 5 == 4]
    assert line[4] == pytest.approx([statistics.mean(r["val_losses"][k] for r in seeds)
                                     for k in steps])
    # Loss versus bytes: one line per strategy and network it trained on, bytes in MB.
    (line,) = [line for line in drawn["loss_vs_bytes.png"]["lines"]
               if line[0] == f"ddp on {LABEL['geo-2dc']}"]
    assert line[3] == pytest.approx([1e5 * 8 * (k + 1) / 1e6 for k in steps])


def test_sweep_summary_has_each_setups_mean_and_std_over_seeds(tmp_path):
    rows = make_rows()
    write_outputs(rows, tmp_path, plots=False)
    with open(tmp_path / "sweep.csv") as f:
        assert next(csv.reader(f)) == COLUMNS
    with open(tmp_path / "sweep_summary.csv") as f:
        summary = list(csv.DictReader(f))
    assert summary == json.loads((tmp_path / "sweep_summary.json").read_text(),
                                 object_hook=lambda d: {k: "" if v is None else str(v)
                                                        for k, v in d.items()})
    assert len(summary) == len(STRATEGIES) * len(NETS)
    for s in summary:
        seeds = [r for r in rows if (r["strategy"], r["net"]) == (s["strategy"], s["net"])]
        assert int(s["seeds"]) == 2
        for key in ("simulated_seconds", "compute_utilization", "bytes_sent_per_node",
                    "final_loss", "final_val_loss"):
            values = [r[key] for r in seeds]
            assert float(s[f"{key}_mean"]) == pytest.approx(statistics.mean(values))
            assert float(s[f"{key}_std"]) == pytest.approx(statistics.stdev(values))
        reached = [r["time_to_target"] for r in seeds if r["time_to_target"] is not None]
        assert int(s["seeds_at_target"]) == len(reached)
        assert s["time_to_target_mean"] == (str(statistics.mean(reached)) if reached else "")
        assert s["time_to_target_std"] == (str(statistics.stdev(reached))
                                           if len(reached) > 1 else "")


def test_the_table_shows_mean_and_std_per_setup_with_several_seeds():
    rows = make_rows(nets=["wan-100mbps", "geo-2dc"])
    lines = table(rows).splitlines()
    assert "seeds" in lines[0] and len(lines) == 1 + 3 * 2
    ddp = [r for r in rows if r["strategy"] == "ddp" and r["net"] == "geo-2dc"]
    (line,) = [line for line in lines if line.split()[:2] == ["ddp", "geo-2dc"]]
    assert "simulated time (s)" in lines[0]  # (one unit, in the header: these are seconds)
    mean = f'{statistics.mean(r["simulated_seconds"] for r in ddp):.3g}'
    assert re.search(rf" 2 +{re.escape(mean)} ± ", line)
    final = [r["final_val_loss"] for r in ddp]
    assert f"{statistics.mean(final):.4f} ± {statistics.stdev(final):.4f}" in line

    one_seed = table(make_rows(seeds=[0])).splitlines()
    assert len(one_seed) == 1 + len(STRATEGIES) * len(NETS) and "±" not in "".join(one_seed)


def test_a_real_two_seed_sweep_summarizes_its_seeds(tmp_path, capsys):
    main(["sweep", "--workload", "mlp", "--strategy", "ddp", "--net", "wan-100mbps,wan-1gbps",
          "--seeds", "0,1", "--nodes", "2", "--steps", "12", "--compute", "fixed:10ms",
          "--out", str(tmp_path), "--no-progress"])
    printed = capsys.readouterr().out
    (folder,) = tmp_path.glob("*-sweep")
    rows = json.loads((folder / "sweep.json").read_text())
    assert len(rows) == 4 and {r["seed"] for r in rows} == {0, 1}
    assert all(r["best_achievable_loss"] is not None for r in rows)
    summary = json.loads((folder / "sweep_summary.json").read_text())
    assert [(s["net"], s["seeds"]) for s in summary] == [("wan-1gbps", 2), ("wan-100mbps", 2)]
    for s in summary:
        losses = [r["final_val_loss"] for r in rows if r["net"] == s["net"]]
        assert s["final_val_loss_mean"] == pytest.approx(statistics.mean(losses))
        assert s["final_val_loss_std"] == pytest.approx(statistics.stdev(losses))
    lines = printed.strip().splitlines()
    utilization = next(i for i, line in enumerate(lines) if "% util." in line)
    # The table (a header, a row per network, the note), then the utilization table.
    assert printed.count("±") >= 2 and utilization == 1 + 2 + 1
    assert lines[-1].startswith("  sweep folder:")
    assert "  val loss of: ddp: replicas' model (equal on every node)" in printed
    assert "to target" not in printed  # no target, no column of dashes
    assert {p.name for p in folder.glob("compare_*.png")} == {"compare_wan-100mbps.png",
                                                              "compare_wan-1gbps.png"}
