"""exoframe-wandb: registered by its package; a real run logs, offline, every metric of
metrics.jsonl, the config and the summary into a .wandb file in the run folder; a bad option
is one line. wandb runs offline with every folder of its own under tmp_path: no account, and
nothing is sent anywhere."""
import json
import os
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import pytest
import yaml
from wandb.proto import wandb_internal_pb2

from exoframe.plugins import PluginManager


@pytest.fixture
def env(tmp_path):
    """The environment of an exoframe subprocess: wandb offline, silent, its folders under
    tmp_path, no error reports, and none of the caller's WANDB_* settings (an API key)."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("WANDB_")}
    home = tmp_path / "wandb-home"
    env.update(WANDB_MODE="offline", WANDB_SILENT="true", WANDB_ERROR_REPORTING="false",
               WANDB_DIR=str(home), WANDB_CONFIG_DIR=str(home / "config"),
               WANDB_CACHE_DIR=str(home / "cache"), WANDB_DATA_DIR=str(home / "data"))
    home.mkdir()
    return env


def exoframe_run(out: Path, env: dict, *sinks: str) -> subprocess.CompletedProcess:
    """`exoframe run` in its own session (so that what it leaves running can be found), with
    what it left running as .leftovers."""
    args = [sys.executable, "-m", "exoframe", "run", "--workload", "mlp", "--steps", "6",
            "--nodes", "2", "--eval-every", "3", "--out", str(out)]
    for sink in sinks:
        args += ["--sink", sink]
    process = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, env=env, start_new_session=True)
    try:
        stdout, stderr = process.communicate(timeout=300)
    finally:
        process.kill()
    result = subprocess.CompletedProcess(args, process.returncode, stdout, stderr)
    result.leftovers = processes_left_by(process.pid)
    return result


def processes_left_by(pid: int) -> list[str]:
    """Processes still running that `pid` started: in its session (the ranks, the
    evaluator), or a wandb service started for it (`wandb-core ... --pid PID`, which runs in
    a session of its own)."""
    left = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            stat = (proc / "stat").read_text()
            args = (proc / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:  # it ended meanwhile
            continue
        state, _, _, session = stat.rsplit(")", 1)[1].split()[:4]
        for_pid = any(a == "--pid" and b == str(pid) for a, b in zip(args, args[1:]))
        if state != "Z" and (int(session) == pid or for_pid):
            left.append(" ".join(args))
    return left


# The .wandb file is a LevelDB log (https://github.com/google/leveldb/blob/main/doc/log_format.md)
# after a 7-byte header; each record in it is a serialized wandb Record (protobuf). wandb 0.31
# reads it in wandb-core (Go) and no longer ships a Python reader, so the framing is read
# here and the records are parsed with wandb's own protobuf classes.
BLOCK = 32768
HEADER = 7  # file header: ":W&B", magic 0xBEE1, version 0; chunk header: crc32, length, type
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def read_records(path: Path) -> list:
    data = path.read_bytes()
    assert struct.unpack("<4sHB", data[:HEADER]) == (b":W&B", 0xBEE1, 0)
    records, pending, position = [], b"", HEADER
    while position + HEADER <= len(data):
        if BLOCK - position % BLOCK < HEADER:  # a block's last bytes: zero padding
            position += BLOCK - position % BLOCK
            continue
        checksum, length, kind = struct.unpack("<IHB", data[position:position + HEADER])
        chunk = data[position + HEADER:position + HEADER + length]
        position += HEADER + length
        assert zlib.crc32(bytes([kind]) + chunk) == checksum, f"bad checksum at {position}"
        pending += chunk
        if kind in (FULL, LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
            pending = b""
    assert not pending, "the file ends inside a record"
    return records


def items(updates) -> dict:
    """{key: value} of a config, summary or history record's items."""
    return {item.key or ".".join(item.nested_key): json.loads(item.value_json)
            for item in updates}


def test_sink_is_registered_by_its_package():
    entry = PluginManager().sinks.get("wandb")
    assert entry.source == "exoframe-wandb"
    assert "Weights & Biases" in entry.describe()


def test_loading_the_plugin_does_not_import_wandb():
    check = ("import sys; from exoframe.plugins import PluginManager; "
             "assert PluginManager().sinks.get('wandb'); "
             "assert 'wandb' not in sys.modules, 'wandb imported'")
    result = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr


def test_a_run_logs_every_metric_the_config_and_the_summary_offline(tmp_path, env):
    out = tmp_path / "runs"
    run = exoframe_run(out, env, "jsonl", "wandb:project=test")
    assert run.returncode == 0, run.stderr
    assert run.leftovers == []
    (folder,) = out.iterdir()
    (wandb_file,) = folder.glob("wandb/offline-run-*/run-*.wandb")
    records = read_records(wandb_file)

    expected = sorted((row["step"], name, value)
                      for row in map(json.loads, (folder / "metrics.jsonl").read_text().splitlines())
                      for name, value in row.items() if name != "step" and value is not None)
    logged = sorted((record.history.step.num, name, value)
                    for record in records if record.HasField("history")
                    for name, value in items(record.history.item).items()
                    if not name.startswith("_"))  # wandb's own: _step, _runtime, _timestamp
    assert logged == expected
    assert {"loss", "val_loss", "sim_time"} <= {name for _, name, _ in logged}

    (run_record,) = [r.run for r in records if r.HasField("run")]
    assert run_record.project == "test"
    assert run_record.display_name == folder.name
    config = items(run_record.config.update)
    config.pop("_wandb")
    assert config == yaml.safe_load((folder / "config.yaml").read_text())

    summary = {}
    for record in records:
        if record.HasField("summary"):
            summary.update(items(record.summary.update))
    written = json.loads((folder / "summary.json").read_text())
    assert summary["status"] == "completed"
    assert summary["final_loss"] == written["final_loss"]
    assert summary["num_nodes"] == 2
    (exit_record,) = [r.exit for r in records if r.HasField("exit")]
    assert exit_record.exit_code == 0


def test_a_bad_mode_is_one_line_naming_the_option(tmp_path, env):
    run = exoframe_run(tmp_path, env, "wandb:mode=cloud")
    assert run.returncode != 0
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1, run.stderr
    assert "'mode'" in lines[0] and "cloud" in lines[0] and "offline" in lines[0]
    assert "Traceback" not in run.stderr
    assert not list(tmp_path.glob("*/wandb"))
    assert run.leftovers == []
