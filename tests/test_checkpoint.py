"""Checkpoints and resume: a run killed outright after a checkpoint and resumed gives the
rows, trace and final weights of the same run never stopped (real processes, real SIGKILL)."""
import csv
import json
import re
import signal

import pytest
import torch
from click.testing import CliRunner

from exoframe.cli import cli as exoframe_cli
from exoframe.config import resolve_config
from exoframe.engine import job_from_config
from exoframe.engine.records.checkpoint import Checkpoint, CheckpointFolder, identity
from exoframe.engine.resume import check_resumable, resume
from exoframe.errors import ExoframeError
from exoframe.sim import Simulator, Topology
from exoframe.sim.clocks.feed import Feed
from exoframe.sim.clocks.protocol import Op, StepEnd
from exoframe.sim.network.collectives import BUILTIN

from conftest import HANG_GUARD, HANGING_WORKLOAD, metric_lines, only_run, wait_for

S = 4e6  # bytes of an all-reduce
RUN = ["--workload", "hanging:workload", "--nodes", "2", "--steps", "12",
       "--checkpoint-every", "4", "--eval-every", "3", "--compute", "fixed:100ms",
       "--stragglers", "lognormal:0.3", "--net", "wan-100mbps", "--no-progress",
       "--sink", "jsonl,csv"]


@pytest.mark.parametrize("strategy, params, checkpoint_step", [
    ("ddp", [], 4),
    ("diloco", ["-p", "H=3"], 4),
    # Fragments are in flight at the end of every even step: the checkpoint waits for step 5.
    # They move at the compute model's overlap rate while the ranks compute: the rebuilt
    # simulator knows when they did.
    ("streaming-diloco", ["-p", "H=4", "-p", "fragments=2", "-p", "tau=1",
                          "--compute", "fixed:100ms,overlap=2mbit"], 5),
    # Node 1 fails at step 4 (down at the checkpoint and when killed) and rejoins at step 9.
    ("diloco", ["-p", "H=3", "--faults", "1@0.25s:0.7s"], 4),
    # Node 1 rejoins at step 3: at the checkpoint, rank 0 has not yet waited for its send of
    # the state (it does at its next sync); the checkpoint keeps that send.
    ("diloco", ["-p", "H=3", "--faults", "1@0.05s:0.15s"], 4),
])
def test_killed_and_resumed_run_equals_the_run_never_stopped(cli, monkeypatch, strategy, params,
                                                             checkpoint_step):
    (cli.cwd / "hanging.py").write_text(HANGING_WORKLOAD)
    monkeypatch.chdir(cli.cwd)
    monkeypatch.syspath_prepend(str(cli.cwd))
    args = [*RUN, "--strategy", strategy, *params]
    # The run never stopped, and the resume, in this process; the run killed, apart.
    reference = CliRunner().invoke(exoframe_cli, ["run", *args, "--out", "reference"])
    assert reference.exit_code == 0, reference.output

    proc = cli.popen("run", *args, "--out", "cut", env={"EXOFRAME_TEST_HANG_AFTER": "6"})
    wait_for(lambda: any((cli.cwd / "cut").glob("*/metrics.jsonl")), "the run folder")
    run = only_run(cli.cwd / "cut")
    # Every rank hangs in step 7: rows 5 and 6 are written after the checkpoint.
    wait_for(lambda: len(metric_lines(run)) == 6, "six rows")
    assert CheckpointFolder(run).latest().step == checkpoint_step
    proc.kill()  # SIGKILL: nothing more is written
    proc.communicate(timeout=HANG_GUARD)
    wait_for(lambda: not cli.leftovers(), "the ranks to die with the launcher")

    resumed = CliRunner().invoke(exoframe_cli, ["resume", str(run)])
    assert resumed.exit_code == 0, resumed.output
    ref = only_run(cli.cwd / "reference")
    assert metric_lines(run) == metric_lines(ref)  # byte for byte, rows 1..12 once each
    assert (run / "metrics.csv").read_text() == (ref / "metrics.csv").read_text()
    assert (run / "trace.json").read_bytes() == (ref / "trace.json").read_bytes()
    summaries = [json.loads((r / "summary.json").read_text()) for r in (run, ref)]
    assert summaries[0]["status"] == "completed"
    assert summaries[0]["resumed_from_step"] == checkpoint_step
    for key in ("simulated_seconds", "final_loss", "final_val_loss", "compute_utilization"):
        assert summaries[0][key] == summaries[1][key], key
    weights = [torch.load(r / "model.pt") for r in (run, ref)]
    assert weights[0].keys() == weights[1].keys()
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])


@pytest.mark.parametrize("strategy, params", [
    ("ddp", []), ("diloco", ["-p", "H=3"]),
    ("diloco", ["-p", "H=3", "--nodes-per-process", "2"]),  # nodes sharing a worker
    # ... that take turns of several steps (no exchange, no state sent before step 12)
    ("localsgd", ["-p", "H=100", "--eval-every", "12", "--nodes-per-process", "2"]),
])
def test_a_stop_signal_checkpoints_first_and_the_resume_equals_the_run_never_stopped(
        cli, monkeypatch, strategy, params):
    (cli.cwd / "hanging.py").write_text(HANGING_WORKLOAD)
    monkeypatch.chdir(cli.cwd)
    monkeypatch.syspath_prepend(str(cli.cwd))
    args = [*RUN, "--strategy", strategy, *params]
    args[args.index("--checkpoint-every") + 1] = "100"  # no periodic checkpoint
    args[args.index("--steps") + 1] = "24"
    reference = CliRunner().invoke(exoframe_cli, ["run", *args, "--out", "reference"])
    assert reference.exit_code == 0, reference.output

    # Ranks wait in step 7 until the launcher has asked for the checkpoint, however late
    # it handles the signal: a run never ends before it is asked.
    gate = cli.cwd / "gate"
    gate.touch()
    proc = cli.popen("run", *args, "--out", "cut",
                     env={"EXOFRAME_TEST_GATE": str(gate), "EXOFRAME_TEST_GATE_AFTER": "6"})
    wait_for(lambda: (cli.cwd / "gate.reached").exists(), "a rank at step 7")
    run = only_run(cli.cwd / "cut")
    proc.send_signal(signal.SIGTERM)
    asked = next((line for line in iter(proc.stderr.readline, "") if "saves a" in line), "")
    assert "saves a checkpoint at step" in asked, asked
    gate.unlink()
    _, err = proc.communicate(timeout=HANG_GUARD)
    assert proc.returncode != 0
    wait_for(lambda: not cli.leftovers(), "the ranks to stop with the launcher")
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "interrupted", summary
    # At step 7 (where the ranks were held), or after it where the ask came for an earlier
    # step: a rank past it waits for the next ask, for a step after its own.
    step = int(re.search(r"saved a checkpoint at step (\d+)", err)[1])
    assert 7 <= step < 24 and CheckpointFolder(run).latest().step == step, err

    resumed = CliRunner().invoke(exoframe_cli, ["resume", str(run)])
    assert resumed.exit_code == 0, resumed.output
    ref = only_run(cli.cwd / "reference")
    assert metric_lines(run) == metric_lines(ref)
    assert (run / "trace.json").read_bytes() == (ref / "trace.json").read_bytes()
    weights = [torch.load(r / "model.pt") for r in (run, ref)]
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])


@pytest.mark.parametrize("overrides, expected", [
    ({"strategy": "async-localsgd"}, "strategy 'async-localsgd' cannot be checkpointed"),
    ({"target_loss": 0.5}, "a run with target_loss cannot be checkpointed"),
    ({"checkpoint_every": 0}, "checkpoint_every must be at least 1"),
    ({"strategy": "streaming-diloco", "strategy_params": {"H": 50, "fragments": 4, "tau": 13}},
     "with tau=13 some fragment is always in flight"),
])
def test_runs_that_cannot_be_checkpointed_say_so(overrides, expected):
    with pytest.raises(ExoframeError, match=re.escape(expected)):
        job_from_config(resolve_config(None, {"workload": "mlp", "steps": 4,
                                              "checkpoint_every": 2, **overrides}))


def test_resume_of_a_folder_without_checkpoint_says_how_to_make_one(tmp_path):
    (tmp_path / "config.yaml").write_text("workload: mlp\nsteps: 4\n")
    with pytest.raises(ExoframeError, match="saved no checkpoint.*--checkpoint-every N"):
        resume(tmp_path)
    with pytest.raises(ExoframeError, match="not a run folder"):
        resume(tmp_path / "nothing")


def test_a_resumed_simulator_drops_the_answers_its_ranks_had_before_the_checkpoint():
    """Ranks 0 and 2 exchange in step 1; rank 1 ends step 1 early, and the transfer's answer
    comes only once rank 1 has moved past its checkpoint. Fed the recorded inputs, a fresh
    simulator answers that transfer to no one (the ranks had the answer) and then gives the
    live ranks the answers of the run never stopped."""
    everyone = (0, 1, 2)
    transfer_end = 1.0 + 0.01  # 1e7 bytes at 1e7 B/s, then the latency

    def rank_1_in_step_2(feed):
        feed.message(1, Op(0.001, 0, ("c", everyone, 0), "all_reduce", S, everyone, 0, True))
        return feed.advance()

    def ranks_0_and_2_in_step_2(feed):
        for rank in (0, 2):
            feed.message(rank, Op(transfer_end, 1, ("c", everyone, 0), "all_reduce", S,
                                  everyone, 0, True))
        return feed.advance()

    topology = Topology.uniform(3, 1e7, 0.01)
    live = Feed(Simulator(topology, BUILTIN))
    live.message(0, Op(0.0, 0, ("p", 0, 2, 0), "send", 1e7, (0, 2), 0, True))
    live.message(2, Op(0.0, 0, ("p", 0, 2, 0), "recv", 1e7, (0, 2), 0, True))
    live.message(1, StepEnd(0.001))
    assert live.advance() == []  # rank 1 could still send something earlier
    transfer = rank_1_in_step_2(live)
    assert [(r, a.end) for r, a in transfer] == [(0, transfer_end), (2, transfer_end)]
    for rank in (0, 2):
        live.message(rank, StepEnd(transfer_end))
    # The checkpoint of step 1: each rank's inputs up to its end of step 1.
    cut = [live.log[0][:], live.log[1][:1], live.log[2][:]]
    expected = ranks_0_and_2_in_step_2(live)
    assert sorted(r for r, _ in expected) == [0, 1, 2]

    resumed = Feed(Simulator(topology, BUILTIN), recorded=json.loads(json.dumps(cut)))
    assert resumed.replaying()
    assert rank_1_in_step_2(resumed) == []  # the transfer's answers: dropped
    assert not resumed.replaying()
    assert ranks_0_and_2_in_step_2(resumed) == expected


def test_a_commit_keeps_the_later_step_ranks_are_saving_and_removes_the_older(tmp_path):
    folder = CheckpointFolder(tmp_path)
    for step in (2, 4, 8):
        folder.staging(step).mkdir(parents=True)
        (folder.staging(step) / "rank-0.pt").write_bytes(b"state")
    folder.commit(2, {"nodes": 1}, [[]], [{"step": 1}, {"step": 2}])
    folder.commit(4, {"nodes": 1}, [[["s", 1.0]]], [{"step": s} for s in range(1, 5)])
    names = sorted(p.name for p in folder.path.iterdir())
    assert names == [".partial-step-8", "step-4"]
    latest = folder.latest()
    assert (latest.step, latest.sim_inputs, len(latest.rows)) == (4, [[["s", 1.0]]], 4)
    assert latest.rank_file(0).read_bytes() == b"state"


def test_the_python_api_checkpoints_and_resumes_with_more_steps(tmp_path):
    from exoframe import Trainer
    from exoframe.testing import tiny_data, tiny_model

    run = dict(strategy="diloco", num_nodes=2, strategy_params={"H": 2}, compute="fixed:10ms",
               checkpoint_every=2, sinks=("jsonl", "csv"))
    first = Trainer(tiny_model(), tiny_data(), batch_size=4).fit(steps=4, out=str(tmp_path),
                                                                 **run)
    with pytest.raises(ExoframeError, match="give more steps"):  # it is at its last step
        Trainer(tiny_model(), tiny_data(), batch_size=4).fit(steps=4, resume=first.run_dir,
                                                             **run)
    again = Trainer(tiny_model(), tiny_data(), batch_size=4).fit(
        steps=6, resume=str(first.run_dir), **run)
    assert again.run_dir == first.run_dir
    assert [row["step"] for row in again.metrics] == list(range(1, 7))
    assert again.metrics[:4] == first.metrics
    steps = [json.loads(line)["step"] for line in metric_lines(first.run_dir)]
    assert steps == list(range(1, 7))
    with open(first.run_dir / "metrics.csv", newline="") as f:
        assert [int(row["step"]) for row in csv.DictReader(f)] == list(range(1, 7))
    # the simulated clock (not real time) goes on from the checkpoint's
    assert again.summary["simulated_seconds"] > first.summary["simulated_seconds"]
    assert [p.name for p in (first.run_dir / "checkpoints").iterdir()] == ["step-6"]
    assert "steps: 6" in (first.run_dir / "config.yaml").read_text()
    with pytest.raises(ExoframeError, match="resume it there: Trainer.fit"):
        resume(first.run_dir)


@pytest.mark.parametrize("change, expected", [
    ({"nodes": 3}, "resumes only the run that made it"),
    ({"net": "wan-100mbps"}, "network, stragglers, faults or seed differ"),
    ({"seed": 1}, "network, stragglers, faults or seed differ"),
    ({"faults": "1@1s:1s"}, "network, stragglers, faults or seed differ"),
    ({"steps": 12, "schedule": "cosine"}, "'cosine' learning-rate schedule runs over 8 steps"),
])
def test_a_checkpoint_resumes_only_the_run_that_made_it(tmp_path, change, expected):
    base = {"workload": "mlp", "strategy": "diloco", "steps": 8, "checkpoint_every": 4}
    made = job_from_config(resolve_config(None, {**base, **{k: v for k, v in change.items()
                                                             if k == "schedule"}}))
    checkpoint = Checkpoint(tmp_path, 4, identity(made), [[], []], [])
    later = job_from_config(resolve_config(None, {**base, "steps": 12, **change}))
    with pytest.raises(ExoframeError, match=re.escape(expected)):
        check_resumable(later, checkpoint, tmp_path)
    same = job_from_config(resolve_config(None, {**base, "steps": 12}))
    if "schedule" not in change:  # a constant schedule may train on
        assert check_resumable(same, checkpoint, tmp_path).resume_from is checkpoint
        assert same.resume_from is None  # (a Job is frozen: resuming is a new one)


@pytest.mark.parametrize("change, expected", [
    ({"optimizer": "sgd"}, "optimizer is 'sgd' now but was 'adamw'"),
    ({"precision": "bf16"}, "precision is 'bf16' now but was 'fp32'"),
    ({"strategy_params": {"H": 7}}, "strategy_params is {H=7, "),
    ({"workload_params": {"hidden": 64}}, "workload_params is {hidden=64} now but was {}"),
    ({"batch_size": 16}, "batch_size is 16 now but was 64"),
])
def test_a_resume_names_the_field_it_would_change(tmp_path, change, expected):
    """Compared as config.yaml records them (Job.config_record: the values resolved)."""
    base = {"workload": "mlp", "strategy": "diloco", "steps": 8, "checkpoint_every": 4}
    made = job_from_config(resolve_config(None, base))
    checkpoint = Checkpoint(tmp_path, 4, identity(made, made.config_record()), [[], []], [])
    # What may change on resume does not count: more steps, other sinks, another timeout.
    same = job_from_config(resolve_config(None, {**base, "steps": 12, "sinks": ["csv"],
                                                 "hang_timeout": 9.0}))
    check_resumable(same, checkpoint, tmp_path, same.config_record())
    later = job_from_config(resolve_config(None, {**base, "steps": 12, **change}))
    with pytest.raises(ExoframeError, match=re.escape(expected)):
        check_resumable(later, checkpoint, tmp_path, later.config_record())


def test_a_checkpoint_that_recorded_its_options_as_given_still_resumes(tmp_path):
    """A checkpoint an earlier exoframe made of a sweep's run or Trainer.fit recorded the
    options as given (lr None, the strategy's parameters given only): it resumes, and a
    parameter it did record is still compared."""
    from exoframe.config import config_to_dict

    base = {"workload": "mlp", "strategy": "diloco", "steps": 8, "checkpoint_every": 4,
            "strategy_params": {"H": 5}}
    config = resolve_config(None, base)
    assert config_to_dict(config)["lr"] is None  # (as given)
    checkpoint = Checkpoint(tmp_path, 4, identity(job_from_config(config),
                                                  config_to_dict(config)), [[], []], [])
    same = job_from_config(resolve_config(None, {**base, "steps": 12}))
    check_resumable(same, checkpoint, tmp_path, same.config_record())
    other = job_from_config(resolve_config(None, {**base, "steps": 12,
                                                  "strategy_params": {"H": 7}}))
    with pytest.raises(ExoframeError, match=re.escape("strategy_params is {H=7} now but was "
                                                      "{H=5}")):
        check_resumable(other, checkpoint, tmp_path, other.config_record())


def test_a_resume_of_another_model_names_its_size(tmp_path):
    """A model given in Python (no workload parameters to compare) is compared by its
    tensors' shapes."""
    config = {"workload": "mlp", "strategy": "ddp", "steps": 8, "checkpoint_every": 4}
    made = job_from_config(resolve_config(None, {**config, "workload_params": {"hidden": 32}}))
    checkpoint = Checkpoint(tmp_path, 4, identity(made), [[], []], [])
    later = job_from_config(resolve_config(None, {**config, "steps": 12}))
    def mlp_size(h):  # 32 inputs -> h -> h -> 10 classes, with biases
        return 32 * h + h + h * h + h + h * 10 + 10

    with pytest.raises(ExoframeError, match=f"model: the checkpoint's model has "
                                            f"{mlp_size(32):,} parameters and this run's "
                                            f"{mlp_size(128):,}"):
        check_resumable(later, checkpoint, tmp_path)
