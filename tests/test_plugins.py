"""Third-party strategies arrive through entry points; a broken plugin does not take exoframe down."""
import csv
import json
import re
import subprocess
import sys
import textwrap
import uuid

import click
import click.testing
import pytest
import yaml
from conftest import REPO, pip_install_into, write_crashy_plugin, write_plugin

import exoframe
from exoframe.errors import ExoframeError
from exoframe.plugins import PluginManager
from exoframe.sinks import CsvSink, RunInfo

GOOD = textwrap.dedent('''
    from dataclasses import dataclass
    import exoframe

    class EveryOther(exoframe.Strategy):
        """Average parameters every other step."""

        @dataclass
        class Params:
            period: int = 2

        def step(self):
            self.optimizer.step()
            self.optimizer.zero_grad()
            if self.step_num % self.params.period == 0:
                self.average_parameters()

    @exoframe.hookimpl
    def exoframe_register_strategies(register):
        register("everyother", EveryOther)

    @exoframe.hookimpl
    def exoframe_register_networks(register):
        register("campus", {"bandwidth": "2gbit", "latency": "1ms"},
                 description="our campus network")
''')


def test_entry_point_strategy_is_listed_and_runs_while_a_broken_plugin_is_reported(cli):
    write_plugin(cli.cwd, "exoframe-everyother", "everyother_plugin", GOOD, version="1.2.3")
    write_plugin(cli.cwd, "exoframe-broken", "broken_plugin", "raise ImportError('no gpu here')\n")

    listed = cli("strategies")
    assert listed.returncode == 0, listed.stderr_text
    line = next(l for l in listed.stdout_text.splitlines() if l.startswith("everyother"))
    assert "Average parameters every other step." in line and line.endswith("[exoframe-everyother]")

    plugins = cli("plugins")
    assert "broken_plugin" in plugins.stdout_text
    broken = next(l for l in plugins.stdout_text.splitlines() if l.startswith("broken_plugin"))
    assert "failed: ImportError: no gpu here" in broken

    # An unknown name says which plugin failed to load: it may have been the one to have it.
    unknown = cli("run", "--strategy", "fedprox", "--nodes", "2", "--steps", "2")
    assert unknown.returncode == 2
    assert unknown.stderr_text.strip().endswith(
        "It may be a plugin's that failed to load: 'broken_plugin' (exoframe-broken 0.1.0): "
        "ImportError: no gpu here (see `exoframe plugins`).")

    nets = cli("nets")
    campus = next(l for l in nets.stdout_text.splitlines() if l.startswith("campus "))
    # A network given as a dict has no file to show; without `protocol:` it models TCP.
    assert campus.split() == ["campus", "our", "campus", "network", "(protocol:", "tcp)",
                              "[exoframe-everyother]"]

    run = cli("run", "--strategy", "everyother", "-p", "period=3", "--nodes", "2", "--steps", "6",
              "--workload", "mlp", "--out", "runs", "--net", "campus")
    assert run.returncode == 0, run.stderr_text
    assert "everyother" in run.stdout_text and "campus" in run.stdout_text
    (folder,) = (cli.cwd / "runs").iterdir()
    assert '"period": 3' in (folder / "summary.json").read_text()
    assert cli.leftovers() == []


BROKEN = "raise ImportError('no gpu here')\n"

SINK_AND_COMMAND = textwrap.dedent('''
    import json
    import click
    import exoframe

    class Lifecycle:
        """Records what a sink is told, in order, in lifecycle.jsonl."""

        def __init__(self, run, file="lifecycle.jsonl", label="none", fail=None):
            if fail == "open":
                raise ValueError("cannot open")
            self.fail = fail
            self.file = open(run.dir / file, "w")
            self.record("open", name=run.name, strategy=run.strategy, nodes=run.nodes,
                        steps=run.steps, seed=run.seed, config_nodes=run.config.get("nodes"),
                        label=label)

        def record(self, event, **fields):
            self.file.write(json.dumps({"event": event, **fields}) + "\\n")
            self.file.flush()

        def write(self, row):
            if str(row["step"]) == str(self.fail):
                raise ValueError("tracker rejected the row")
            self.record("write", row=row)

        def finish(self, summary):
            self.record("finish", status=summary["status"], steps=summary.get("steps_completed"))

        def close(self):
            self.record("close")
            self.file.close()

    @click.command()
    @click.argument("who")
    def hello(who):
        """Say hello."""
        click.echo(f"hello {who}")

    @exoframe.hookimpl
    def exoframe_register_sinks(register):
        register("lifecycle", Lifecycle)

    @exoframe.hookimpl
    def exoframe_register_commands(register):
        register("hello", hello)
''')


def manager(folder, monkeypatch, **kw):
    """A fresh manager that sees the plugins written under `folder` (and nothing from the
    environment's EXOFRAME_* variables)."""
    monkeypatch.syspath_prepend(str(folder))
    return PluginManager(**{"disabled": (), "strict": False, **kw})


def test_plugin_json_lists_hooks_items_versions_and_failures(cli):
    write_plugin(cli.cwd, "exoframe-everyother", "everyother_plugin", GOOD, version="1.2.3")
    write_plugin(cli.cwd, "exoframe-broken", "broken_plugin", BROKEN)
    listed = cli("plugins", "--json")
    assert listed.returncode == 0, listed.stderr_text
    plugins = {p["name"]: p for p in json.loads(listed.stdout_text)}
    assert plugins["everyother_plugin"] == {
        "name": "everyother_plugin", "source": "exoframe-everyother", "version": "1.2.3",
        "status": "active", "error": "", "warning": "",
        "hooks": ["exoframe_register_networks", "exoframe_register_strategies"],
        "items": {"strategies": ["everyother"], "networks": ["campus"]}}
    assert plugins["broken_plugin"]["status"] == "failed"
    assert plugins["broken_plugin"]["error"] == "ImportError: no gpu here"
    assert plugins["exoframe.sinks"]["items"] == {"sinks": ["jsonl", "csv"]}
    assert "plugins" in plugins["exoframe.cli.commands"]["items"]["commands"]


def test_strict_mode_turns_a_broken_plugin_into_an_error_naming_it(cli):
    write_plugin(cli.cwd, "exoframe-broken", "broken_plugin", BROKEN)
    for strict in (cli("--strict-plugins", "strategies"),
                   cli("nets", env={"EXOFRAME_STRICT_PLUGINS": "1"})):
        assert strict.returncode != 0
        assert "plugin 'broken_plugin' (exoframe-broken 0.1.0) failed to load: " \
               "ImportError: no gpu here" in strict.stderr_text
        assert strict.stdout_text == ""
    disabled = cli("--strict-plugins", "plugins",
                   env={"EXOFRAME_DISABLE_PLUGINS": "other, broken_plugin"})
    assert disabled.returncode == 0, disabled.stderr_text
    line = next(l for l in disabled.stdout_text.splitlines() if l.startswith("broken_plugin"))
    assert line.split() == ["broken_plugin", "exoframe-broken", "0.1.0", "disabled"]


def test_disabled_plugins_are_not_imported(tmp_path, monkeypatch):
    write_plugin(tmp_path, "exoframe-everyother", "everyother_plugin", GOOD)
    write_plugin(tmp_path, "exoframe-broken", "broken_plugin", BROKEN)
    pm = manager(tmp_path, monkeypatch, disabled={"broken_plugin", "exoframe-everyother"})
    assert pm.plugins["broken_plugin"].status == "disabled"  # importing it would have failed
    assert pm.plugins["everyother_plugin"].status == "disabled"  # disabled by package name
    assert pm.strategies.get_entry_or_none("everyother") is None
    with pytest.raises(ExoframeError, match="broken_plugin"):
        manager(tmp_path, monkeypatch, strict=True)


@pytest.mark.parametrize("source, error", [
    ('@exoframe.hookimpl\ndef exoframe_register_strategies(register):\n'
     '    register("ddp", exoframe.Strategy)\n',
     "strategy 'ddp' is registered twice: by exoframe and by exoframe-bad."),
    ('@exoframe.hookimpl\ndef exoframe_register_commands(register):\n'
     '    import click\n    register("run", click.Command("run"))\n',
     "command 'run' is registered twice: by exoframe and by exoframe-bad."),
    ('@exoframe.hookimpl\ndef exoframe_register_commands(register):\n'
     '    register("go", print)\n',
     "command 'go' is builtin_function_or_method, not a click.Command."),
    ('@exoframe.hookimpl\ndef exoframe_register_strategy(register):\n    pass\n',
     "implements unknown hook 'exoframe_register_strategy'. Did you mean "
     "'exoframe_register_strategies'?"),
])
def test_a_plugin_that_registers_wrongly_fails_alone(tmp_path, monkeypatch, source, error):
    module = f"bad_plugin_{uuid.uuid4().hex}"  # a fresh module: this process imports each one
    write_plugin(tmp_path, "exoframe-bad", module, "import exoframe\n" + source)
    write_plugin(tmp_path, "exoframe-everyother", "everyother_plugin", GOOD)
    pm = manager(tmp_path, monkeypatch)
    assert (pm.plugins[module].status, pm.plugins[module].error) == ("failed", error)
    assert pm.plugins[module].items == {}
    assert pm.strategies.get("ddp").source == "exoframe"
    assert pm.commands.get("run").source == "exoframe"
    assert pm.strategies.get("everyother").source == "exoframe-everyother"


def lifecycle(folder, file="lifecycle.jsonl"):
    return [json.loads(line) for line in (folder / file).read_text().splitlines()]


def test_plugin_sink_and_command(cli):
    write_plugin(cli.cwd, "exoframe-extras", "extras_plugin", SINK_AND_COMMAND)
    hello = cli("hello", "world")
    assert (hello.returncode, hello.stdout_text) == (0, "hello world\n"), hello.stderr_text
    assert "hello" in cli("--help").stdout_text
    run = cli("run", "--workload", "mlp", "--nodes", "2", "--steps", "5", "--eval-every", "2",
              "--out", "runs", "--sink", "csv,lifecycle", "--sink", "jsonl")
    assert run.returncode == 0, run.stderr_text
    (folder,) = (cli.cwd / "runs").iterdir()
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5]
    # Opened with the run's info, every row in order, the summary, closed: in that order.
    events = lifecycle(folder)
    assert events[0] == {"event": "open", "name": folder.name, "strategy": "ddp", "nodes": 2,
                         "steps": 5, "seed": 0, "config_nodes": 2, "label": "none"}
    assert [e["row"] for e in events[1:-2]] == rows
    assert events[-2:] == [{"event": "finish", "status": "completed", "steps": None},
                           {"event": "close"}]
    with open(folder / "metrics.csv", newline="") as f:
        table = list(csv.DictReader(f))
    assert [float(r["loss"]) for r in table] == [r["loss"] for r in rows]
    assert [r["val_loss"] for r in table][:2] == ["", str(rows[1]["val_loss"])]
    assert "sinks:\n- csv\n- lifecycle\n- jsonl\n" in (folder / "config.yaml").read_text()
    unknown = cli("run", "--workload", "mlp", "--sink", "parquet", "--out", "runs")
    assert unknown.returncode == 2
    assert "unknown metrics sink 'parquet'" in unknown.stderr_text
    assert "csv, jsonl, lifecycle" in unknown.stderr_text


def test_sink_options_from_flags_and_yaml_and_its_lifetime_in_a_failed_run(cli):
    write_plugin(cli.cwd, "exoframe-extras", "extras_plugin", SINK_AND_COMMAND)
    write_crashy_plugin(cli.cwd, step=3)
    (cli.cwd / "run.yaml").write_text("sinks:\n- jsonl\n- lifecycle: {file: a.jsonl, label: 7}\n")
    crashed = cli("run", "--config", "run.yaml", "--strategy", "crashy", "--workload", "mlp", "--nodes", "2",
                  "--steps", "6", "--out", "runs")
    assert crashed.returncode != 0 and "boom on rank one" in crashed.stderr_text
    (folder,) = (cli.cwd / "runs").iterdir()
    events = lifecycle(folder, "a.jsonl")
    assert events[0]["label"] == 7  # YAML keeps its types; flags give strings
    # The steps both ranks finished before rank 1 raised at step 3, in order: 1 and 2, or
    # fewer when the crash reached the launcher before rank 0's end of step.
    written = [e["row"]["step"] for e in events if e["event"] == "write"]
    assert written == [1, 2][:len(written)]
    assert events[-2:] == [{"event": "finish", "status": "failed", "steps": len(written)},
                           {"event": "close"}]

    flagged = cli("run", "--workload", "mlp", "--nodes", "2", "--steps", "2", "--out", "more",
                  "--sink", "csv,lifecycle:file=b.jsonl,label=x")  # options: the last sink's
    assert flagged.returncode == 0, flagged.stderr_text
    (folder,) = (cli.cwd / "more").iterdir()
    assert lifecycle(folder, "b.jsonl")[0]["label"] == "x"
    assert (folder / "metrics.csv").is_file()
    for sink, says in (("lifecycle:fle=c.jsonl", "sink 'lifecycle' has no option 'fle'. "
                        "Did you mean 'file'? Its options: file, label, fail."),
                       ("csv:x=1", "sink 'csv' has no option 'x'. It takes no options."),
                       ("lifecycle:file", "options follow the name as KEY=VALUE pairs")):
        bad = cli("run", "--workload", "mlp", "--sink", sink, "--out", "bad")
        assert bad.returncode == 2 and says in bad.stderr_text, bad.stderr_text
        assert bad.stderr_text.count("\n") == 1 and not (cli.cwd / "bad").exists()


def test_csv_sink_widens_its_header_when_a_metric_first_appears(tmp_path):
    sink = CsvSink(RunInfo(dir=tmp_path, name="run", strategy="ddp", workload="mlp", nodes=2,
                           steps=3, seed=0, net="ideal"))
    sink.write({"step": 1, "loss": 2.5})
    sink.write({"step": 2, "loss": 2.0, "val_loss": 2.1})
    sink.write({"step": 3, "loss": 1.5})
    sink.close()
    assert (tmp_path / "metrics.csv").read_text().splitlines() == [
        "step,loss,val_loss", "1,2.5,", "2,2.0,2.1", "3,1.5,"]


def test_new_plugin_readme_points_to_what_exists(tmp_path):
    from exoframe.cli.scaffold import write_skeleton

    folder = write_skeleton("every-h", tmp_path)
    text = (folder / "README.md").read_text()
    for target in re.findall(r"\]\(([^)]*)\)", text):  # a link: to a file of the package
        assert (folder / target).is_file(), f"README links to {target}"
    documents = re.findall(r"`(docs/[\w-]+\.md)`", text)
    assert documents and all((REPO / name).is_file() for name in documents), documents


def test_new_plugin_skeleton_installs_passes_its_test_and_runs(cli):
    made = cli("new-plugin", "every-h")
    assert made.returncode == 0, made.stderr_text
    package = cli.cwd / "exoframe-every-h"
    assert cli("new-plugin", "every-h").returncode == 2  # never overwrites
    site = cli.cwd / "site"
    install = pip_install_into(site, package)
    assert install.returncode == 0, install.stderr
    env = cli.env({"PYTHONPATH": f"{site}:{cli.env()['PYTHONPATH']}"})
    tests = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                            str(package / "tests")], cwd=cli.cwd, env=env,
                           capture_output=True, text=True, timeout=300)
    assert tests.returncode == 0, tests.stdout + tests.stderr
    assert "3 passed" in tests.stdout
    (cli.cwd / "exoframe-every-h").rename(cli.cwd / "source")  # only the installed copy is left
    listed = cli("strategies", env={"PYTHONPATH": env["PYTHONPATH"]})
    line = next(l for l in listed.stdout_text.splitlines() if l.startswith("every-h "))
    assert line.endswith("[exoframe-every-h]")
    run = cli("run", "--strategy", "every-h", "-p", "H=2", "--workload", "mlp", "--nodes", "2",
              "--steps", "4", "--out", "runs", env={"PYTHONPATH": env["PYTHONPATH"]})
    assert run.returncode == 0, run.stderr_text
    assert cli.leftovers() == []
    # registered by name: with the skeleton installed, help and listings import no torch
    for command in ("--help", "strategies"):
        blocked = subprocess.run(
            [sys.executable, "-c", "import sys; sys.modules['torch'] = None\n"
             f"from exoframe.cli import main\nmain([{command!r}])"],
            cwd=cli.cwd, env=cli.env({"PYTHONPATH": env["PYTHONPATH"]}), capture_output=True,
            text=True, timeout=120)
        assert blocked.returncode == 0, blocked.stderr
        assert command == "--help" or "every-h " in blocked.stdout


def test_two_packages_with_one_plugin_name_keep_the_first_and_report_the_second(
        tmp_path, monkeypatch):
    write_plugin(tmp_path, "exoframe-everyother", "everyother_plugin", GOOD)
    info = tmp_path / "exoframe_clash-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: exoframe-clash\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text("[exoframe]\neveryother_plugin = everyother_plugin\n")
    infos = [i for i in manager(tmp_path, monkeypatch).plugins.values()
             if i.name == "everyother_plugin"]
    assert sorted(i.status for i in infos) == ["active", "failed"]
    active, failed = sorted(infos, key=lambda i: i.status)
    assert failed.error == f"plugin name 'everyother_plugin' is already taken by {active.source}."


def test_a_plugin_made_for_another_plugin_api_is_named_in_a_warning(cli):
    old = GOOD.replace("import exoframe\n", "import exoframe\nEXOFRAME_PLUGIN_API = '>=1,<2'\n", 1)
    write_plugin(cli.cwd, "exoframe-everyother", "everyother_plugin", old, version="0.3.0")
    write_plugin(cli.cwd, "exoframe-current", "current_plugin",
                 "import exoframe\nEXOFRAME_PLUGIN_API = f'=={exoframe.PLUGIN_API}'\n")
    listed = cli("strategies")
    assert listed.returncode == 0 and "everyother" in listed.stdout_text  # still loaded
    assert listed.stderr_text == (
        "warning: plugin 'everyother_plugin' (exoframe-everyother 0.3.0) works with exoframe "
        f"plugin API >=1,<2, but exoframe {exoframe.__version__} has plugin API "
        f"{exoframe.PLUGIN_API}: it may fail; install a version of exoframe-everyother made "
        "for it.\n")
    plugins = {p["name"]: p for p in json.loads(cli("plugins", "--json").stdout_text)}
    assert plugins["everyother_plugin"]["warning"] in listed.stderr_text
    assert plugins["current_plugin"]["warning"] == ""


def test_a_strategy_registered_by_name_loads_when_used_and_a_missing_one_is_one_line(cli):
    write_plugin(cli.cwd, "exoframe-named", "named_plugin", textwrap.dedent('''
        import exoframe
        from exoframe.plugins import lazy

        @exoframe.hookimpl
        def exoframe_register_strategies(register):
            register("everyother", lazy("everyother_impl:EveryOther"))
            register("ghost", lazy("nowhere_to_be_found:Ghost"), description="never there")
    '''))
    (cli.cwd / "everyother_impl.py").write_text(GOOD)
    listed = cli("strategies")
    assert "Average parameters every other step.  [exoframe-named]" in listed.stdout_text
    assert re.search(r"^ghost +never there  \[exoframe-named\]$", listed.stdout_text, re.M)
    ran = cli("run", "--strategy", "everyother", "--workload", "mlp", "--nodes", "2",
              "--steps", "2", "--out", "runs")
    assert ran.returncode == 0, ran.stderr_text
    ghost = cli("run", "--strategy", "ghost", "--workload", "mlp", "--out", "runs")
    assert ghost.returncode == 2 and ghost.stderr_text == (
        "error: 'ghost' from exoframe-named 0.1.0 could not be loaded: ModuleNotFoundError: "
        "No module named 'nowhere_to_be_found'\n")


def test_a_sink_that_fails_is_named_and_the_run_folder_still_says_what_happened(cli):
    write_plugin(cli.cwd, "exoframe-extras", "extras_plugin", SINK_AND_COMMAND)
    failed = cli("run", "--workload", "mlp", "--nodes", "2", "--steps", "6", "--out", "runs",
                 "--sink", "jsonl,lifecycle:fail=3")
    assert failed.returncode != 0
    assert failed.stderr_text.endswith("error: sink 'lifecycle' failed at step 3: ValueError: "
                                       "tracker rejected the row\n"), failed.stderr_text
    (folder,) = (cli.cwd / "runs").iterdir()
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["status"] == "failed" and "sink 'lifecycle'" in summary["error"]
    assert [e["event"] for e in lifecycle(folder)] == ["open", "write", "write", "finish", "close"]

    # A sink that cannot start: the ones opened before it are finished with the failure.
    refused = cli("run", "--workload", "mlp", "--nodes", "2", "--steps", "6", "--out", "more",
                  "--sink", "lifecycle", "--sink", "lifecycle:file=b.jsonl,fail=open")
    assert refused.returncode == 2 and refused.stderr_text == (
        "error: sink 'lifecycle' could not start: ValueError: cannot open\n")
    (folder,) = (cli.cwd / "more").iterdir()
    assert [e["event"] for e in lifecycle(folder)] == ["open", "finish", "close"]
    assert lifecycle(folder)[1]["status"] == "failed"
    assert json.loads((folder / "summary.json").read_text())["status"] == "failed"
    assert cli.leftovers() == []


def test_registering_reads_no_description_and_a_listing_reads_each_once(monkeypatch):
    """A run's start registers every built-in and installed item: the descriptions (a
    docstring line read from the source, a preset file's description) are read only when
    an entry is listed, and then once."""
    import exoframe.builtins
    from exoframe.plugins import Lazy
    from exoframe.sim.network import presets

    read = []
    first_doc_line, preset_description = Lazy.first_doc_line, presets.description
    monkeypatch.setattr(Lazy, "first_doc_line", lambda self: read.append(self.module) or
                        first_doc_line(self))
    monkeypatch.setattr(exoframe.builtins, "preset_description",
                        lambda path: read.append(path.stem) or preset_description(path))
    pm = PluginManager()
    diloco, wan = pm.strategies.get("diloco"), pm.networks.get("wan-100mbps")
    assert diloco.obj.__name__ == "DiLoCo" and read == []
    assert diloco.describe() == diloco.obj.__doc__.strip().splitlines()[0]
    assert wan.describe() == yaml.safe_load(wan.target.read_text())["description"]
    assert "100" in wan.describe()
    diloco.describe(), wan.describe()  # asked again: not read again
    assert read == ["exoframe.strategies.diloco", "wan-100mbps"]


def test_a_description_that_cannot_be_read_is_said_in_its_entry_and_the_listing_goes_on():
    """A strategy registered by name whose module is gone: its listing line says why it has
    no description; the other entries are listed (the run that uses it fails, naming it)."""
    from exoframe.cli.listings import _print_registry
    from exoframe.plugins import lazy

    class Ghost:
        @exoframe.hookimpl
        def exoframe_register_strategies(self, register):
            register("ghost", lazy("exoframe_no_such_module:Ghost"))

    pm = PluginManager()
    pm.register(Ghost(), name="ghost_plugin", source="exoframe-ghost")
    assert pm.plugins["ghost_plugin"].status == "active"
    output = click.testing.CliRunner().invoke(
        click.command()(lambda: _print_registry(pm.strategies))).output
    lines = {line.split()[0]: line for line in output.splitlines()}
    assert "(no description: ModuleNotFoundError: No module named 'exoframe_no_such_module')" \
        in lines["ghost"]
    assert set(lines) == {entry.name for entry in pm.strategies} and "diloco" in lines
