"""exoframe-sqlite: registered by its package; a run's metrics land in metrics.sqlite, row
for row what metrics.jsonl holds."""
import json
import sqlite3
import subprocess
import sys

from exoframe.plugins import PluginManager


def test_sink_is_registered_by_its_package():
    entry = PluginManager().sinks.get("sqlite")
    assert entry.source == "exoframe-sqlite"


def test_a_run_writes_the_same_metrics_as_jsonl(tmp_path):
    run = subprocess.run(
        [sys.executable, "-m", "exoframe", "run", "--workload", "mlp", "--steps", "6",
         "--nodes", "2", "--eval-every", "3", "--out", str(tmp_path), "--sink", "jsonl,sqlite"],
        capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    (folder,) = tmp_path.iterdir()
    assert not (folder / "metrics.sqlite-wal").exists()
    expected = sorted((row["step"], name, value)
                      for row in map(json.loads, (folder / "metrics.jsonl").read_text().splitlines())
                      for name, value in row.items() if name != "step")
    db = sqlite3.connect(folder / "metrics.sqlite")
    stored = db.execute("SELECT run, step, name, value FROM metrics").fetchall()
    db.close()
    assert {r[0] for r in stored} == {folder.name}
    assert sorted(r[1:] for r in stored) == expected
    assert {"loss", "val_loss", "sim_time"} <= {r[2] for r in stored}
