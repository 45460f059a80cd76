"""Hostile round 5 (issue 61), beyond the readers (test_hostile_readers.py): valid seeds in
every mode, and the clear lines that were missing."""
import json

import pytest
from conftest import HANG_GUARD, only_run

TOP_SEED = 2 ** 63 - 1  # the largest valid seed (config.py: [0, 2^63))
TINY = ["--workload", "mlp", "--steps", "2", "--compute", "fixed:10ms"]


@pytest.mark.parametrize("mode", [
    ["--nodes", "2"],                                                   # forked ranks
    ["--nodes", "2", "--in-process"],
    ["--nodes", "4", "--nodes-per-process", "2", "--stack-replicas"],  # stacked
], ids=["forked", "in-process", "stacked"])
def test_the_largest_valid_seed_runs_in_every_mode(cli, tmp_path, mode):
    """Seeds from about 1.8e13 (stacked: 1.85e7) overflowed the generator's seed in a rank:
    `ValueError: Overflow when unpacking long long`."""
    proc = cli("run", *TINY, "--strategy", "diloco", "-p", "H=1", "--seed", TOP_SEED, *mode,
               "--out", tmp_path / "runs", timeout=HANG_GUARD)
    assert proc.returncode == 0, proc.stderr_text
    summary = json.loads((only_run(tmp_path / "runs") / "summary.json").read_text())
    assert summary["seed"] == TOP_SEED


def test_derived_seeds_keep_earlier_streams_and_fit_a_generator():
    from exoframe.strategies.seeds import derive

    assert derive(7, 3) == 7 * 1_000_003 + 3  # the streams of seeds that worked are kept
    assert derive(7, 3, 5) == (7 * 1_000_003 + 3) * 1_000_003 + 5
    for parts in [(TOP_SEED, 0), (TOP_SEED, 1), (2 * 10 ** 7, 3, 9), (TOP_SEED, 2 ** 40, 7)]:
        assert 0 <= derive(*parts) < 2 ** 63
        assert derive(*parts) == derive(*parts)
    assert derive(TOP_SEED, 0) != derive(TOP_SEED, 1)


@pytest.mark.parametrize("args,names", [
    # a sweep given one value twice trained the same run twice
    (["sweep", "--compute", "fixed:10ms", "--compute", "fixed:0.01s"],
     ["--compute", "fixed:10ms", "fixed:0.01s", "given twice"]),
    # an empty value was dropped silently (-p diloco.H=5,,50 was refused)
    (["sweep", "--lr", "0.1,"], ["--lr", "empty value"]),
    (["sweep", "--lr", "0.1,,0.2"], ["--lr", "empty value"]),
])
def test_a_sweep_value_given_twice_or_an_empty_value_is_one_line(tmp_path, monkeypatch,
                                                                 capsys, args, names):
    from conftest import one_line_error

    monkeypatch.chdir(tmp_path)
    err = one_line_error(capsys, *args, "--workload", "mlp", "--steps", "2")
    for name in names:
        assert name in err, err
    assert not any(tmp_path.iterdir())  # refused before anything started


def test_a_sweep_of_a_million_runs_is_refused_in_one_line_before_it_expands(tmp_path,
                                                                           monkeypatch, capsys):
    """Was still checking after 240 s at 2.2 GB, with no output: 100 seeds x 100 learning
    rates x 100 batch sizes. The product is counted from the axes' lengths first."""
    from conftest import one_line_error

    monkeypatch.chdir(tmp_path)
    hundred = lambda fmt: ",".join(fmt(i) for i in range(1, 101))  # noqa: E731
    err = one_line_error(capsys, "sweep", "--seeds", hundred(str), "--lr",
                         hundred(lambda i: f"{i / 1000:g}"), "--batch-size", hundred(str),
                         "--workload", "mlp", "--steps", "2")
    assert "2,000,000 runs and replays" in err and "100 (--seeds)" in err, err  # 2 strategies
    assert "100 (--lr)" in err and "100 (--batch-size)" in err and "10,000" in err, err
    assert not any(tmp_path.iterdir())  # refused before anything started
    from exoframe.engine.sweep import check_size

    check_size({"--seeds": list(range(100)), "--lr": list(range(100))})  # 10,000: accepted


def test_values_of_one_axis_are_compared_as_they_read():
    from exoframe.engine.sweep_axes import check_distinct
    from exoframe.errors import ExoframeError

    with pytest.raises(ExoframeError, match=r"'fixed:0.01s' is given twice \(as 'fixed:10ms'\)"):
        check_distinct("compute", ["fixed:10ms", "fixed:0.01s"])
    check_distinct("compute", ["fixed:10ms", "fixed:10ms,overlap=5mbit", "fixed:20ms"])
    check_distinct("seed", [0, 1])


def test_a_checkpoint_tensor_of_another_shape_is_one_line_naming_it(tmp_path, capsys):
    """Was a 20-line rank traceback (load_state_dict's size mismatch) ending in advice to
    resume from the same checkpoint."""
    import torch
    from click.testing import CliRunner
    from conftest import one_line_error

    from exoframe.cli import cli as exoframe_cli

    result = CliRunner().invoke(exoframe_cli, [
        "run", "--workload", "mlp", "--compute", "fixed:10ms", "--nodes", "2", "--steps", "4",
        "--checkpoint-every", "2",
        "--no-progress", "--out", str(tmp_path / "runs")])
    assert result.exit_code == 0, result.output
    run = only_run(tmp_path / "runs")
    path = run / "checkpoints" / "step-4" / "rank-1.pt"
    state = torch.load(path, weights_only=True)
    name, tensor = next(iter(state["model"].items()))
    state["model"][name] = torch.zeros(tensor.shape[0] + 1, *tensor.shape[1:])
    torch.save(state, path)  # a whole archive: only the shape is wrong
    err = one_line_error(capsys, "resume", run, "--steps", "6")
    wrong = [tensor.shape[0] + 1, *tensor.shape[1:]]
    for part in (str(path), f"'{name}'", str(wrong), str(list(tensor.shape))):
        assert part in err, err
    assert "exoframe resume" not in err and "Traceback" not in err


# A workload whose loss is a scalar or, with mode=nonscalar, a vector (refused by `exoframe
# run` before its ranks start).
MODES = '''
import torch
from torch.utils.data import TensorDataset

import exoframe


class Model(torch.nn.Module):
    def __init__(self, mode):
        super().__init__()
        self.lin, self.mode = torch.nn.Linear(3, 1), mode

    def forward(self, batch):
        x, y = batch
        loss = (self.lin(x).squeeze(1) - y) ** 2
        return loss if self.mode == "nonscalar" else loss.mean()


def data(n):
    return TensorDataset(torch.randn(n, 3), torch.randn(n))


def workload(mode="ok"):
    return exoframe.Workload.from_datasets(lambda: Model(mode), data(64), data(8))
'''
SWEEP = ["sweep", "--strategy", "ddp", "--nodes", "2", "--steps", "2", "--compute",
         "fixed:10ms", "--net", "ideal", "--no-progress", "--no-plots"]


@pytest.mark.parametrize("argv,names", [
    (["--workload", "mlp", "-w", "train_examples=256", "--val-examples", "16,5000,32"],
     ["val_examples", "5000"]),
    (["--workload", "modes:workload", "-w", "mode=ok,nonscalar"], ["scalar loss"]),
    (["--workload", "mlp", "--nodes", "4", "--nodes-per-process", "1,2"],
     ["two points are the same run", "nodes_per_process"]),
], ids=["validation-set", "loss-shape", "packing"])
def test_every_sweep_point_is_checked_as_a_run_before_any_trains(tmp_path, monkeypatch, capsys,
                                                                 argv, names):
    """Each trained its first point(s), then was refused: a folder left, and no sweep.csv."""
    from conftest import one_line_error

    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "modes.py").write_text(MODES)
    err = one_line_error(capsys, *SWEEP, *argv, "--out", tmp_path / "sweeps")
    for name in names:
        assert name in err, err
    assert not (tmp_path / "sweeps").exists()
