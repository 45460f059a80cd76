"""A run's result in Python: a few lines when printed, the command line's table on demand,
its metrics as a DataFrame where pandas is installed."""
import pytest

import exoframe
import exoframe.engine as engine
from exoframe.cli import main
from exoframe.report.summary import format_seconds


def test_a_run_result_prints_in_a_few_lines_and_its_table_is_the_command_lines(
        tmp_path, capsys, monkeypatch):
    """`exoframe run` prints result.table() of the very result it made; print(result) is
    five short lines however long the run's trace."""
    made = []

    def execute(*args, **kwargs):
        made.append(real(*args, **kwargs))
        return made[-1]

    real = engine.execute
    monkeypatch.setattr(engine, "execute", execute)
    main(["run", "--workload", "mlp", "--nodes", "2", "--steps", "40", "--net", "wan-100mbps",
          "--compute", "fixed:10ms", "--out", str(tmp_path), "--no-progress"])
    printed = capsys.readouterr().out
    (result,) = made
    assert isinstance(result, exoframe.RunResult)
    assert printed == result.table() + "\n"
    summary = result.summary
    assert "  bound by " in printed and f"  run folder            {result.run_dir}" in printed
    text = repr(result)
    assert len(text) < 1000 and len(text.splitlines()) == 5 and str(result) == text
    for fact in ("ddp on 2 nodes, 40 steps, network wan-100mbps",
                 f"simulated wall-clock {format_seconds(summary['simulated_seconds'])}",
                 f"final val loss {summary['final_val_loss']:.4f}",
                 f"run folder {result.run_dir}"):
        assert fact in text, text
    # what a dataclass's repr printed: the model, the summary, every step, the trace
    assert len(repr(result.model) + repr(summary) + repr(result.metrics)
               + repr(result.trace)) > 15_000
    pandas = pytest.importorskip("pandas")
    frame = result.dataframe()
    assert isinstance(frame, pandas.DataFrame) and list(frame["step"]) == list(range(1, 41))
    assert list(frame["sim_time"]) == [row["sim_time"] for row in result.metrics]
