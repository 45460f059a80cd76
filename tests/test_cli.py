"""The command line as a user meets it: real subprocesses, real ranks, real failures."""
import json
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from conftest import SMALL_GPT_FLAGS as SMALL_GPT, write_crashy_plugin

from exoframe.plugins import PluginManager


BAD_WORKLOADS = textwrap.dedent('''
    import torch
    from torch.utils.data import TensorDataset
    import exoframe

    class Vector(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(3, 1)
        def forward(self, batch):
            x, y = batch
            return (self.lin(x).squeeze(1) - y) ** 2     # not reduced to a scalar

    def data(n):
        return TensorDataset(torch.randn(n, 3), torch.randn(n))

    def nonscalar():
        return exoframe.Workload.from_datasets(Vector, data(64), data(8))

    def tiny():
        class Scalar(Vector):
            def forward(self, batch):
                return super().forward(batch).mean()
        return exoframe.Workload.from_datasets(Scalar, data(3), data(3))
''')


@pytest.mark.parametrize("compute", ["fixed:20ms", "flops:cpu"])
def test_same_config_and_seed_give_identical_metrics_and_clocks_even_under_cpu_load(cli, compute):
    """Two identical runs at once, beside a process that burns a core: losses, simulated
    times (network with jitter, random stragglers) and bytes are all identical."""
    args = ["run", "--strategy", "diloco", "-p", "H=5", "--nodes", "3", "--steps", "12",
            "--eval-every", "6", "--net", "wan-10mbps", "--compute", compute,
            "--stragglers", "1:2,lognormal:0.3", *SMALL_GPT]
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        first = cli.popen(*args, "--out", "a")
        second = cli.popen(*args, "--out", "b")
        for proc in (first, second):
            out, err = proc.communicate(timeout=120)
            assert proc.returncode == 0, err
    finally:
        hog.kill()
    (run_a,) = (cli.cwd / "a").iterdir()
    (run_b,) = (cli.cwd / "b").iterdir()
    metrics = (run_a / "metrics.jsonl").read_text()
    assert metrics == (run_b / "metrics.jsonl").read_text()
    summaries = [json.loads((run / "summary.json").read_text()) for run in (run_a, run_b)]
    assert summaries[0]["per_rank"] == summaries[1]["per_rank"]
    rows = [json.loads(line) for line in metrics.splitlines()]
    assert [r["step"] for r in rows] == list(range(1, 13))
    assert [r["step"] for r in rows if "val_loss" in r] == [6, 12]
    summary = json.loads((run_a / "summary.json").read_text())
    for key in ("strategy", "num_nodes", "steps", "final_loss", "final_val_loss",
                "bytes_sent_per_node", "elapsed_seconds"):
        assert key in summary
    assert summary["strategy"] == "diloco" and summary["num_nodes"] == 3
    assert summary["final_loss"] == rows[-1]["loss"]
    assert (run_a / "config.yaml").read_text().count("H: 5") == 1


def test_flags_override_yaml_and_runs_never_overwrite(cli):
    (cli.cwd / "run.yaml").write_text(
        "strategy: localsgd\nstrategy_params:\n  H: 3\nnodes: 3\nsteps: 4\nworkload: mlp\n")
    for _ in range(2):
        proc = cli("run", "--config", "run.yaml", "--steps", "6", "-p", "H=2", "--out", "runs")
        assert proc.returncode == 0, proc.stderr_text
    runs = sorted((cli.cwd / "runs").iterdir())
    assert len(runs) == 2
    summary = json.loads((runs[0] / "summary.json").read_text())
    assert (summary["strategy"], summary["num_nodes"], summary["steps"]) == ("localsgd", 3, 6)
    assert summary["strategy_params"] == {"H": 2}


@pytest.mark.parametrize("args, expected", [
    (["run", "--nodes", "0"], "nodes must be at least 1, got 0"),
    (["run", "--strategy", "dilocco"], "unknown strategy 'dilocco'. Did you mean 'diloco'?"),
    (["run", "--strategy", "diloco", "-p", "outer_lrr=0.5"],
     "unknown parameter 'outer_lrr'. Did you mean 'outer_lr'?"),
    (["run", "--config", "broken.yaml"], "broken.yaml:3: malformed YAML"),
    (["run", "--config", "typo.yaml"], "typo.yaml: field 'steps' must be int, got 'ten'"),
    (["run", "--workload", "no_such_module:make"], "cannot import workload module 'no_such_module'"),
    (["run", "--workload", "bad_workloads:nonscalar"], "must return a scalar loss tensor"),
    (["run", "--workload", "bad_workloads:tiny", "--nodes", "4"],
     "has 3 examples, fewer than the 4 nodes"),
])
def test_bad_input_ends_with_one_clear_line_and_no_processes(cli, args, expected):
    (cli.cwd / "broken.yaml").write_text("strategy: ddp\nnodes: 2\nsteps: [1, 2\n")
    (cli.cwd / "typo.yaml").write_text("steps: ten\n")
    (cli.cwd / "bad_workloads.py").write_text(BAD_WORKLOADS)
    proc = cli(*args, "--steps", "3") if "--config" not in args else cli(*args)
    lines = proc.stderr_text.strip().splitlines()
    assert proc.returncode != 0
    assert len(lines) == 1 and expected in lines[0], proc.stderr_text
    assert "Traceback" not in proc.stderr_text
    assert cli.leftovers() == []


def test_a_crashing_rank_stops_the_run_with_its_traceback_once(cli):
    write_crashy_plugin(cli.cwd, step=3)
    proc = cli("run", "--strategy", "crashy", "--nodes", "3", "--steps", "10", "--workload", "mlp")
    assert proc.returncode == 1
    assert proc.stderr_text.count("Traceback") == 1
    assert "RuntimeError: boom on rank one" in proc.stderr_text
    last_line = proc.stderr_text.strip().splitlines()[-1]
    assert last_line == "error: rank 1: RuntimeError: boom on rank one"
    assert cli.leftovers() == []


def test_ctrl_c_stops_every_rank(cli):
    proc = cli.popen("run", "--nodes", "3", "--steps", "100000", "--workload", "mlp")
    deadline = time.monotonic() + 60
    while len(cli.leftovers()) < 4 and time.monotonic() < deadline:  # launcher + 3 ranks
        time.sleep(0.2)
    time.sleep(1.0)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)  # a hang guard, not a speed requirement
    assert proc.returncode == 130, err
    assert "interrupted" in err
    assert cli.leftovers() == []


def test_strategies_command_lists_builtins(cli):
    proc = cli("strategies")
    assert proc.returncode == 0
    # Installed plugin packages (CI installs plugins/*) add lines naming their package.
    lines = [l for l in proc.stdout_text.splitlines() if l.endswith("[exoframe]")]
    builtins = [e.name for e in PluginManager(load_entry_points=False).strategies]
    assert {"ddp", "diloco", "localsgd", "sparta"} <= set(builtins)
    assert [l.split()[0] for l in lines] == builtins
    assert "alias: fedavg" in proc.stdout_text


def test_version_prints_the_version(capsys):
    import exoframe
    from exoframe.cli import main

    main(["--version"])
    assert capsys.readouterr().out == f"exoframe {exoframe.__version__}\n"


def test_nets_shows_each_preset_file_and_a_copy_of_it_is_the_same_network(capsys, tmp_path):
    from exoframe.cli import main
    from exoframe.plugins import Registry
    from exoframe.sim.network.netconfig import load_network

    main(["nets"])
    listed = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()}
    presets = PluginManager(load_entry_points=False).networks
    for entry in presets:
        line = listed[entry.name]
        copy = tmp_path / f"mine-{entry.name}.yaml"
        copy.write_bytes(Path(line.split("  [exoframe]  ")[1]).read_bytes())
        mine = load_network(str(copy), Registry("networks")).topology(4)
        assert mine == load_network(entry.name, presets).topology(4), entry.name
        assert f"(protocol: {'none' if mine.protocol is None else 'tcp'})" in line


def test_help_runs_with_torch_blocked(cli):
    """`exoframe --help` loads commands only: neither torch nor the built-in strategies."""
    code = ("import sys; sys.modules['torch'] = None\n"
            "from exoframe.cli import main\n"
            "main(['--help'])\n")
    result = subprocess.run([sys.executable, "-c", code], cwd=cli.cwd, env=cli.env(),
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    commands = [line.split()[0] for line in result.stdout.split("Commands:")[1].splitlines()
                if line.strip()]
    assert {"run", "sweep", "replay", "report", "strategies", "plugins"} <= set(commands)


@pytest.mark.parametrize("command", ["strategies", "workloads", "nets", "algorithms", "sinks"])
def test_listings_run_with_torch_blocked_and_say_what_the_loaded_objects_say(cli, command):
    """Built-ins (and the demo plugin) register by name: listing them imports no torch, and
    the description read from the source is the loaded object's first docstring line."""
    code = ("import sys; sys.modules['torch'] = None\n"
            f"from exoframe.cli import main\nmain([{command!r}])\n")
    result = subprocess.run([sys.executable, "-c", code], cwd=cli.cwd, env=cli.env(),
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    listed = {line.split()[0]: line for line in result.stdout.splitlines()}
    registry = getattr(PluginManager(), command if command != "nets" else "networks")
    assert set(listed) == {entry.name for entry in registry}
    for entry in registry:
        assert f"  {entry.describe()}" in listed[entry.name]
        if command in ("strategies", "workloads"):  # described by their docstrings
            assert entry.describe() == entry.obj.__doc__.strip().splitlines()[0]


GC_PROBE = textwrap.dedent('''
    import gc, json, os
    import torch
    import exoframe
    from exoframe.testing import TinyRegression, tiny_data

    def note(where):
        path = f"gc-{os.getpid()}.json"
        if not os.path.exists(path):
            with open(path, "w") as f:
                json.dump({"where": where, "enabled": gc.isenabled(),
                           "frozen": gc.get_freeze_count()}, f)

    class Probe(TinyRegression):
        def forward(self, batch):
            note("rank or evaluator")
            return super().forward(batch)

    def make():  # in the launcher, before any forward there
        note("launcher")
        data = tiny_data()
        return exoframe.Workload.from_datasets(Probe, data(0, 1, "train"), data(0, 1, "val"))
''')


def test_run_imports_torch_without_collecting_and_every_process_collects_after(cli):
    """`exoframe run` imports torch and torch._dynamo with the cyclic collector paused (its
    passes there would only walk what the imports made), then freezes that: the launcher,
    ranks and evaluator run with the collector on and those objects left out of it."""
    (cli.cwd / "gc_probe.py").write_text(GC_PROBE)
    code = textwrap.dedent('''
        import gc, json, sys
        early = []  # passes after torch's import began and before the freeze
        def count(phase, info):
            if phase == "start" and "torch" in sys.modules and gc.get_freeze_count() == 0:
                early.append(info["generation"])
        gc.callbacks.append(count)
        from exoframe.cli import main
        try:
            main(["run", "--workload", "gc_probe:make", "--nodes", "2", "--steps", "2",
                  "--out", "runs"])
        finally:
            print(json.dumps(early))
    ''')
    result = subprocess.run([sys.executable, "-c", code], cwd=cli.cwd, env=cli.env(),
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.splitlines()[-1]) == []
    probes = [json.loads(p.read_text()) for p in cli.cwd.glob("gc-*.json")]
    assert sorted(p["where"] for p in probes) == ["launcher"] + ["rank or evaluator"] * 3
    for probe in probes:
        assert probe["enabled"], probe
        assert probe["frozen"] > 100_000, probe  # torch's and torch._dynamo's objects


def test_resume_and_sweep_start_up_as_run_does_and_a_process_with_torch_is_left_alone(
        monkeypatch, tmp_path):
    import gc
    import importlib

    from exoframe.cli import main
    from exoframe.cli.start_up import import_engine

    started = []
    for module in ("run_command", "sweep_command"):
        monkeypatch.setattr(importlib.import_module(f"exoframe.cli.{module}"), "import_engine",
                            lambda: started.append(True) or sys.exit(0))
    for args in (["run"], ["resume", str(tmp_path)], ["sweep"]):
        with pytest.raises(SystemExit):
            main(args)
        assert len(started) == 1, args
        started.clear()
    frozen, enabled = gc.get_freeze_count(), gc.isenabled()
    import_engine()  # this process imported torch: nothing to gain, nothing frozen
    assert (gc.get_freeze_count(), gc.isenabled()) == (frozen, enabled)
