"""Third-party strategies arrive through entry points; a broken plugin does not take exoframe down."""
import textwrap

from conftest import write_plugin

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

    nets = cli("nets")
    campus = next(l for l in nets.stdout_text.splitlines() if l.startswith("campus "))
    assert campus.split() == ["campus", "our", "campus", "network", "[exoframe-everyother]"]

    run = cli("run", "--strategy", "everyother", "-p", "period=3", "--nodes", "2", "--steps", "6",
              "--workload", "mlp", "--out", "runs", "--net", "campus")
    assert run.returncode == 0, run.stderr_text
    assert "everyother" in run.stdout_text and "campus" in run.stdout_text
    (folder,) = (cli.cwd / "runs").iterdir()
    assert '"period": 3' in (folder / "summary.json").read_text()
    assert cli.leftovers() == []
