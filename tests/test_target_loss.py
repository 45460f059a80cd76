"""Time to a target validation loss: validated every step, stopped after the same step on
every rank, independent of the evaluation schedule, and deterministic."""
import json
import random

import pytest
import torch
from conftest import Regressor
from torch.utils.data import TensorDataset

import exoframe
from exoframe.cli import main
from exoframe.config import RunConfig
from exoframe.engine.plan.target import LAG, StopVerdicts
from exoframe.experiments.sweep import sweep
from exoframe.errors import ExoframeError

SHARD, STEPS = 12, 30
WEIGHTS = torch.linspace(-1, 1, 6)


def per_rank(rank, num_nodes, split):
    g = torch.Generator().manual_seed(1000 * rank + (split == "val"))
    x = torch.randn(SHARD, 6, generator=g)
    y = torch.tanh(x @ WEIGHTS) + 0.05 * torch.randn(SHARD, generator=g)
    return TensorDataset(x, y)


def fit(strategy="ddp", nodes=2, seed=0, **kw):
    torch.manual_seed(seed)
    trainer = exoframe.Trainer(Regressor(), per_rank, batch_size=SHARD)
    return trainer.fit(strategy=strategy, num_nodes=nodes, steps=STEPS, optimizer="sgd",
                       lr=0.1, seed=seed, compute="fixed:10ms", **kw)


def first_at(metrics, target):
    return next(row for row in metrics if row["val_loss"] <= target)


def pick_target(metrics, step):
    """A target first reached at about `step` of a run validated every step."""
    target = metrics[step - 1]["val_loss"]
    return target, first_at(metrics, target)["step"]


@pytest.fixture(scope="module")
def ddp_reference():
    return fit(eval_every=1).metrics


def test_the_run_stops_lag_steps_after_the_target_and_reports_its_time(ddp_reference):
    target, reached = pick_target(ddp_reference, 12)
    assert 3 < reached < STEPS - LAG
    result = fit(target_loss=target)
    summary, metrics = result.summary, result.metrics
    assert [row["step"] for row in metrics] == list(range(1, reached + LAG + 1))
    assert summary["steps"] == reached + LAG
    assert summary["steps_to_target"] == reached
    assert summary["time_to_target"] == first_at(metrics, target)["sim_time"]
    assert summary["time_to_target"] == pytest.approx(reached * 0.01, rel=1e-9)
    # Every step validated, with the numbers of the run that never stopped.
    for ours, full in zip(metrics, ddp_reference):
        assert ours["val_loss"] == full["val_loss"] and ours["sim_time"] == full["sim_time"]
    assert summary["final_val_loss"] == metrics[-1]["val_loss"]
    assert result.trace["steps"] == reached + LAG


def test_time_to_target_does_not_depend_on_eval_every_and_repeats(ddp_reference):
    target, reached = pick_target(ddp_reference, 9)
    runs = [fit(target_loss=target, eval_every=every) for every in (None, 7, 7)]
    assert {r.summary["steps_to_target"] for r in runs} == {reached}
    assert len({r.summary["time_to_target"] for r in runs}) == 1
    assert {len(r.metrics) for r in runs} == {reached + LAG}
    # Without a target, the schedule decides where the loss is seen.
    coarse = fit(eval_every=7).metrics
    seen = [row for row in coarse if row.get("val_loss") is not None]
    assert [row["step"] for row in seen] == [7, 14, 21, 28, 30]


def test_partners_held_back_by_a_straggler_do_not_deadlock_the_stop():
    """NoLoCo on 4 ranks with a slow rank 3: ranks 0 and 1 wait for the verdict on a step
    that ranks 2 and 3 can only finish once the simulator moves past 0's and 1's clocks.
    The launcher answers "continue" there; the run still stops on a step every rank agrees
    on, the same one each time."""
    kw = dict(strategy="noloco", nodes=4, stragglers="3:4", strategy_params={"H": 2})
    reference = fit(eval_every=1, **kw).metrics
    target, reached = pick_target(reference, 10)
    runs = [fit(target_loss=target, **kw) for _ in range(2)]
    assert runs[0].metrics == runs[1].metrics
    for result in runs:
        summary, metrics = result.summary, result.metrics
        assert summary["steps_to_target"] == reached
        assert summary["time_to_target"] == reference[reached - 1]["sim_time"]
        assert reached + LAG <= summary["steps"] == len(metrics) < STEPS
        assert [row["val_loss"] for row in metrics] == [
            row["val_loss"] for row in reference[:len(metrics)]]


def stopping(target, budget, schedule: random.Random, ranks=3, steps=12):
    """StopVerdicts driven as the launcher drives it, in an order the schedule draws: each
    rank runs its steps, asking after each (as Job.asks_to_stop says) and waiting for the
    answer; once every rank has run step k, its row (its end at 0.1·k s) and its validation
    loss come in, either first. What each rank ran, the stop step and its rule."""
    losses = [0.9, 0.8, 0.8, 0.7, 0.6, 0.6, 0.5, 0.4, 0.4, 0.3, 0.2, 0.1]
    rules = StopVerdicts(target, budget)
    ran, asking, stopped = [0] * ranks, {}, set()
    rows, validations = 0, 0  # the steps whose row, and validation, came in

    def answer(answers):
        for rank, stop in answers:
            del asking[rank]
            if stop:
                stopped.add(rank)
    while len(stopped) < ranks and min(ran) < steps or rows < min(ran) or validations < min(ran):
        moves = [rank for rank in range(ranks)
                 if rank not in asking and rank not in stopped and ran[rank] < steps]
        moves += ["row"] * (rows < min(ran)) + ["validation"] * (validations < min(ran))
        move = schedule.choice(moves)
        if move == "row":
            rows += 1
            answer(rules.add_finished(rows, 0.1 * rows))
        elif move == "validation":
            validations += 1
            answer(rules.add_val(validations, losses[validations - 1]))
        else:
            ran[move] += 1
            step = ran[move]
            if step < steps and (budget is not None or (target is not None and step > LAG)):
                asking[move] = step
                answer(rules.ask(move, step))
    return tuple(ran), rules.stop_step, rules.stopped_by


@pytest.mark.parametrize("target,budget,stop_step,rule", [
    (0.55, None, 8, "target_loss"),  # 0.5 at step 7, so 7 + LAG
    (None, 0.45, 5, "time_budget"),  # step 5 ends at 0.5 s
    (0.75, 0.55, 5, "target_loss"),  # 4 + LAG before 6
    (0.55, 0.3, 3, "time_budget"),
    (0.45, 0.8, 8, "time_budget"),  # 8 before 8 + LAG
    (0.65, 0.6, 6, "target_loss"),  # both at step 6
])
def test_where_a_run_stops_does_not_depend_on_what_the_launcher_hears_first(
        target, budget, stop_step, rule):
    """Rows, validation losses and questions in every order that 200 schedules draw: every
    rank stops after the same step, the same one in every order, by the rule that stops
    first (the target, where both stop at the same step)."""
    outcomes = {stopping(target, budget, random.Random(seed)) for seed in range(200)}
    assert outcomes == {((stop_step,) * 3, stop_step, rule)}


def test_a_sweep_validates_every_step_and_replays_read_the_target_step(tmp_path):
    base = RunConfig(workload="mlp", steps=80, compute="fixed:10ms")
    _, rows = sweep(base, ["ddp"], ["wan-100mbps", "wan-1gbps"], [0], str(tmp_path),
                    target_loss=1.9, plots=False)
    run, replay = sorted(rows, key=lambda r: r["source"] == "replay")
    summary = json.loads(next(tmp_path.glob("*-sweep/runs/*/summary.json")).read_text())
    reached = summary["steps_to_target"]
    assert reached is not None and len(run["val_losses"]) == reached + LAG
    assert None not in run["val_losses"]
    assert run["time_to_target"] == summary["time_to_target"] == run["sim_times"][reached - 1]
    assert replay["time_to_target"] == replay["sim_times"][reached - 1]
    assert replay["time_to_target"] < run["time_to_target"]  # 1 Gbit/s against 100 Mbit/s


def test_bad_target_input_is_one_clear_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["run", "--workload", "mlp", "--target-loss", "nan", "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.count("\n") == 1
    assert "target_loss must be a finite number" in err
    x = torch.randn(8, 6)
    trainer = exoframe.Trainer(Regressor(), TensorDataset(x, x.sum(1)), batch_size=4)
    with pytest.raises(ExoframeError, match="target_loss needs validation data"):
        trainer.fit(num_nodes=2, steps=3, target_loss=0.1)
