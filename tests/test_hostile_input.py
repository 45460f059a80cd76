"""Hostile input (issue 11): every refusal is one line on stderr naming the field or file,
made before any run folder or rank exists; files exoframe writes are strict JSON.

Refusals that happen before a fork run in-process through exoframe.cli.main (same entry
point as `python -m exoframe`, without a second torch import per case); the cases that
need ranks, and one refusal as a user meets it, run `python -m exoframe` (the cli fixture).
"""
import json
import textwrap

import pytest
from conftest import write_plugin

from exoframe.cli import main
from exoframe.engine.sweep import _bandwidth_texts, grid_networks, parse_grid
from exoframe.plugins import get_plugin_manager


def strict_loads(text):
    def refuse(constant):
        raise ValueError(f"non-strict JSON constant {constant}")
    return json.loads(text, parse_constant=refuse)


def run_main(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return exit_info.value.code, out, err


def assert_one_line(err, *names):
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err and lines[0].startswith("error: ")
    assert len(lines[0]) <= 1100, f"{len(lines[0])} characters"
    for name in names:
        assert name in lines[0], lines[0]


@pytest.fixture
def here(tmp_path, monkeypatch):
    """tmp_path as the current folder, with one earlier run folder under runs/."""
    monkeypatch.chdir(tmp_path)
    earlier = tmp_path / "runs" / "20000101-000000-ddp-n2"
    earlier.mkdir(parents=True)
    (earlier / "summary.json").write_text("{}\n")
    return tmp_path


def folders(root):
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


BINARY = bytes(range(256)) * 4
NAN_NET = "bandwidth: .nan\n"
HUGE_LATENCY = "latency: 1e999ms\n"
NAN_CONFIG = "lr: .nan\n"
# 400 bytes that expand to 10^9 list items when aliases are followed.
ALIAS_BOMB = "[" + ",".join(["&a [x,x,x,x,x,x,x,x,x,x]"] + [
    f"&{chr(98 + i)} [" + ",".join([f"*{chr(97 + i)}"] * 10) + "]" for i in range(8)]) + "]"

# (argv, files to write first, the names the one line must contain)
REFUSED = [
    # non-finite or out-of-range numbers: each once hung or failed after the fork
    (["run", "--compute", "fixed:nan"], {}, ["compute", "finite"]),
    (["run", "--compute", "fixed:inf"], {}, ["compute"]),
    (["run", "--compute", "flops:inf"], {}, ["compute", "peak"]),
    (["run", "--stragglers", "1:nan"], {}, ["stragglers", "rank 1"]),
    (["run", "--stragglers", "lognormal:nan"], {}, ["stragglers", "lognormal"]),
    (["run", "--stragglers", "lognormal:1000"], {}, ["stragglers", "lognormal"]),
    (["run", "--stragglers", "bernoulli:0.5:inf"], {}, ["stragglers", "bernoulli"]),
    (["run", "--lr", "nan"], {}, ["lr"]),
    (["run", "--lr", "inf"], {}, ["lr"]),
    (["run", "--optimizer", "sgd", "--momentum", "-1"], {}, ["momentum"]),
    (["run", "--weight-decay", "nan"], {}, ["weight_decay"]),
    (["run", "--weight-decay", "-1"], {}, ["weight_decay"]),
    (["run", "--threads", "100000"], {}, ["threads", "cores"]),
    (["run", "--nodes", "100000"], {}, ["nodes"]),
    (["run", "--target-loss", "inf"], {}, ["target_loss"]),
    (["run", "--strategy", "diloco", "-p", "outer_lr=.nan"], {}, ["outer_lr", "finite"]),
    (["run", "--strategy", "diloco", "-p", "outer_lr=.inf"], {}, ["outer_lr", "finite"]),
    (["run", "--net", "nan.yaml"], {"nan.yaml": NAN_NET}, ["nan.yaml", "bandwidth"]),
    (["run", "--net", "far.yaml"], {"far.yaml": HUGE_LATENCY}, ["far.yaml", "latency"]),
    (["run", "--config", "nan.yaml"], {"nan.yaml": NAN_CONFIG}, ["nan.yaml", "lr"]),
    (["sweep", "--project-params", "1e9", "--step-time", "nan", "--no-plots"], {},
     ["--step-time"]),
    # what used to be a traceback
    (["run", "--out", "afile"], {"afile": "x"}, ["--out", "afile", "is a file"]),
    (["run", "--out", "afile/sub"], {"afile": "x"}, ["--out", "afile/sub", "under afile"]),
    (["sweep", "--out", "afile/sub", "--no-plots"], {"afile": "x"}, ["--out", "afile/sub"]),
    (["run", "--config", "bin.yaml"], {"bin.yaml": BINARY}, ["bin.yaml", "UTF-8"]),
    (["run", "--net", "bin.yaml"], {"bin.yaml": BINARY}, ["bin.yaml", "UTF-8"]),
    (["run", "--workload", "mlp", "-w", "hidden=abc"], {}, ["workload 'mlp'", "hidden"]),
    (["run", "--workload", "hostile_wl_a:boom"], {"hostile_wl_a.py": (
        "def boom():\n    raise RuntimeError('factory exploded')\n")},
     ["hostile_wl_a:boom", "factory exploded"]),
    (["run", "--workload", "hostile_wl_b:three"], {"hostile_wl_b.py": "three = 3\n"},
     ["hostile_wl_b:three", "not a function"]),
    # unbounded input
    (["run", "--strategy", "diloco", "-p", f"H={ALIAS_BOMB}"], {}, ["--param H", "aliases"]),
    (["run", "--config", "bomb.yaml"], {"bomb.yaml": f"strategy_params: {{H: {ALIAS_BOMB}}}\n"},
     ["bomb.yaml", "aliases"]),
    (["run", "--strategy", "diloco", "-p", "H=" + "x" * 100_000], {}, ["'H'"]),
    (["sweep", "--bandwidth", "1mbit..2mbit", "--points", "100000000", "--no-plots"], {},
     ["--points", "1000"]),
]


def test_refused_before_anything_runs(here, capsys):
    before = folders(here)
    for argv, files, names in REFUSED:
        for name, content in files.items():
            path = here / name
            path.write_bytes(content) if isinstance(content, bytes) else path.write_text(content)
        code, out, err = run_main(argv, capsys)
        assert code == 2, (argv, err)
        assert_one_line(err, *names)
        for name in files:
            (here / name).unlink()
        new = [p for p in folders(here) if p not in before and "__pycache__" not in p]
        assert new == [], (argv, new)  # no run or sweep folder; runs/ as it was


def test_a_nan_step_time_fails_at_once_as_a_user_meets_it(cli, tmp_path):
    """`--compute fixed:nan` used to leave the launcher and ranks waiting forever."""
    result = cli("run", "--compute", "fixed:nan", "--out", "runs", timeout=60)
    assert result.returncode == 2
    assert_one_line(result.stderr_text, "compute")
    assert not (tmp_path / "runs").exists()
    debug = cli("--debug", "run", "--workload", "mlp", "-w", "hidden=abc", timeout=60)
    assert debug.returncode == 2 and "Traceback" in debug.stderr_text
    assert debug.stderr_text.splitlines()[-1].startswith("error: workload 'mlp'")


def test_grid_labels_are_unique():
    grid = parse_grid("10mbit..10.5mbit", 40)
    labels = _bandwidth_texts(grid)
    assert len(set(labels)) == 40
    assert _bandwidth_texts(parse_grid("10mbit..10gbit", 4)) == [
        "10mbit", "100mbit", "1gbit", "10gbit"]


def test_grid_networks_one_file_per_point(tmp_path):
    paths = grid_networks("wan-100mbps", parse_grid("10mbit..10.5mbit", 40), tmp_path,
                          get_plugin_manager())
    assert len(set(paths)) == 40 and len(list(tmp_path.iterdir())) == 40


METRIC_PLUGIN = textwrap.dedent('''
    import math
    from exoframe import hookimpl
    from exoframe.strategies.ddp import DDP

    class NanMetric(DDP):
        """Logs non-finite metrics."""
        def metrics(self):
            return {"odd": math.nan, "big": math.inf}

    class TextMetric(DDP):
        """Logs a string as a metric."""
        def metrics(self):
            return {"odd": "abc"}

    @hookimpl
    def exoframe_register_strategies(register):
        register("nan-metric", NanMetric)
        register("text-metric", TextMetric)
''')

RUN = ["--workload", "mlp", "--steps", "3", "--compute", "fixed:10ms", "--out", "runs"]


def test_written_files_are_strict_json_and_bad_files_are_named(cli, tmp_path):
    write_plugin(tmp_path, "exoframe-hostile", "hostile_plugin", METRIC_PLUGIN)
    run = cli("run", "--strategy", "nan-metric", *RUN)
    assert run.returncode == 0, run.stderr_text
    (folder,) = (tmp_path / "runs").iterdir()
    rows = [strict_loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["odd"] is None and rows[-1]["big"] is None
    report = cli("report", str(folder), "--out", "report", "--no-plots")
    assert report.returncode == 0, report.stderr_text
    strict_loads((tmp_path / "report" / "sweep.json").read_text())
    replay = cli("replay", str(folder), "--net", "wan-100mbps")
    assert replay.returncode == 0, replay.stderr_text
    for path in (folder / "replays").iterdir():
        strict_loads(path.read_text())

    text = cli("run", "--strategy", "text-metric", *RUN)
    assert text.returncode != 0 and "Traceback" not in text.stderr_text
    assert_one_line(text.stderr_text, "metric 'odd'", "TextMetric")
    assert cli.leftovers() == []

    # Damaged copies of the good run: each refused in one line naming the file.
    trace = json.loads((folder / "trace.json").read_text())
    damaged = {
        "truncated": lambda d: (d / "trace.json").write_text(json.dumps(trace)[:80]),
        "no-seed": lambda d: (d / "trace.json").write_text(
            json.dumps({k: v for k, v in trace.items() if k != "seed"})),
        "billion-nodes": lambda d: (d / "trace.json").write_text(
            json.dumps({**trace, "nodes": 10 ** 9})),
        "many-steps": lambda d: (d / "trace.json").write_text(
            json.dumps({**trace, "steps": 10 ** 9})),
        "bad-event": lambda d: (d / "trace.json").write_text(
            json.dumps({**trace, "ranks": [[["c", "NaN"]], []]})),
    }
    for name, damage in damaged.items():
        copy = tmp_path / "damaged" / name
        copy.mkdir(parents=True)
        (copy / "summary.json").write_text((folder / "summary.json").read_text())
        damage(copy)
        result = cli("replay", str(copy), "--net", "ideal", timeout=60)
        assert result.returncode == 2, (name, result.stderr_text)
        assert_one_line(result.stderr_text, "trace.json")
        assert not (copy / "replays").exists()

    metrics = tmp_path / "damaged" / "metrics"
    metrics.mkdir()
    (metrics / "summary.json").write_text((folder / "summary.json").read_text())
    (metrics / "metrics.jsonl").write_text((folder / "metrics.jsonl").read_text()[:-20])
    result = cli("report", str(metrics), "--out", "report2", "--no-plots", timeout=60)
    assert result.returncode == 2
    assert_one_line(result.stderr_text, "metrics.jsonl", "line 3")
    assert not (tmp_path / "report2").exists()
