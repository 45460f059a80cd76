"""What a run validates on and when: a fixed number of examples, the same for any node count,
every rank's shard represented; the held model at every evaluation, the replicas' average
at the last step (or every evaluation, when asked); the final model folded from every rank."""
import pytest
import torch
from conftest import Regressor
from torch.utils.data import TensorDataset

import exoframe
from exoframe.engine.launch.evaluator import validate
from exoframe.engine.launch.validation_set import validation_set
from exoframe.engine.node.data import fetch
from exoframe.engine.node.model_state import Fold
from exoframe.errors import ExoframeError
from exoframe.workloads.base import shard_factory
from exoframe.workloads.mlp import mlp


def examples(val_set) -> torch.Tensor:
    x, _ = fetch(val_set.dataset, torch.arange(len(val_set.dataset)))
    return x


def test_the_validation_set_is_the_same_examples_for_2_8_and_64_nodes():
    workload = mlp(train_examples=6400, val_examples=1000)
    sets = {n: validation_set(workload.dataset, n, 200) for n in (2, 8, 64)}
    for n, val_set in sets.items():
        assert val_set.examples == len(val_set.dataset) == 200
        assert torch.equal(examples(val_set), examples(sets[2])), n
    # ... spread over the whole validation set, so every rank's (contiguous) shard of it
    # is represented, also for 64 nodes.
    indices = torch.as_tensor(sets[64].dataset.indices)
    assert set((indices // (1000 // 64)).clamp(max=63).tolist()) == set(range(64))
    # A model's loss on it is then the same whatever the node count.
    model = workload.build_model()
    losses = {n: validate(model, s.dataset, 32)[0] for n, s in sets.items()}
    assert len(set(losses.values())) == 1


def non_iid(rank, num_nodes, split):
    """Each rank's data is of one class (its rank), and the shards differ in size."""
    g = torch.Generator().manual_seed(rank + 100 * (split == "val"))
    n = 10 + 7 * rank
    return TensorDataset(torch.randn(n, 4, generator=g), torch.full((n,), rank))


def test_a_non_iid_split_is_represented_by_every_rank():
    for count in (8, 50):
        val_set = validation_set(non_iid, 8, count)
        _, labels = fetch(val_set.dataset, torch.arange(len(val_set.dataset)))
        assert len(labels) == count and set(labels.tolist()) == set(range(8))
        if count == 50:  # in proportion to the shards' sizes: the largest gives the most
            per_rank = torch.bincount(labels, minlength=8)
            assert per_rank[7] > per_rank[0] and per_rank.sum() == 50


def test_a_label_skewed_training_split_still_validates_on_every_shard():
    workload = mlp(train_examples=4000, val_examples=800)
    job_config = dict(workload="mlp", partition="dirichlet:0.1", nodes=8, steps=2)
    from exoframe.config import RunConfig
    from exoframe.engine.plan.resolve import build_job
    job = build_job(RunConfig(**job_config), workload, workload.build_model())
    val_set = validation_set(job.dataset, 8, 64)
    indices = torch.as_tensor(val_set.dataset.indices)
    assert set((indices // 100).tolist()) == set(range(8))  # every rank's 100 examples


@pytest.mark.parametrize("count", [0, -3])
def test_a_validation_size_below_one_is_one_line(cli, count):
    result = cli("run", "--workload", "mlp", "--val-examples", str(count), "--steps", "2",
                 "--out", "runs", "--no-progress")
    assert result.returncode != 0
    assert result.stderr_text.strip().splitlines() == [
        f"error: val_examples must be at least 1, got {count}."]
    assert not (cli.cwd / "runs").exists()


def test_a_validation_size_larger_than_the_data_is_one_line_before_any_folder(cli):
    result = cli("run", "--workload", "mlp", "-w", "val_examples=300", "--val-examples",
                 "301", "--steps", "2", "--out", "runs", "--no-progress")
    assert result.returncode != 0
    (line,) = result.stderr_text.strip().splitlines()
    assert "val_examples: 301 is more than the validation data holds (300 examples)" in line
    assert not (cli.cwd / "runs").exists()
    with pytest.raises(ExoframeError, match="give at most 300"):
        validation_set(shard_factory(*[TensorDataset(torch.zeros(300, 1))] * 2), 2, 301)


def per_rank(rank, num_nodes, split):
    g = torch.Generator().manual_seed(1000 * rank + (split == "val"))
    x = torch.randn(12, 6, generator=g)
    return TensorDataset(x, torch.tanh(x @ torch.linspace(-1, 1, 6)))


def fit(**options):
    torch.manual_seed(0)
    trainer = exoframe.Trainer(Regressor(), per_rank, batch_size=12)
    return trainer.fit(num_nodes=3, optimizer="sgd", lr=0.1, compute="fixed:10ms",
                       progress=False, **options)


def test_the_replicas_average_is_validated_at_the_last_step_unless_asked_every_time():
    options = dict(strategy="diloco", strategy_params={"H": 4}, steps=10, eval_every=2)
    rows = fit(**options).metrics
    assert [r["step"] for r in rows if "val_loss" in r] == [2, 4, 6, 8, 10]
    assert [r["step"] for r in rows if "val_loss_replicas_average" in r] == [10]
    every = fit(**options, val_replicas="every").metrics
    assert [r["step"] for r in every if "val_loss_replicas_average" in r] == [2, 4, 6, 8, 10]
    # The held model and its losses are the same either way; the last average too.
    assert [r.get("val_loss") for r in rows] == [r.get("val_loss") for r in every]
    assert rows[-1]["val_loss_replicas_average"] == every[-1]["val_loss_replicas_average"]


def test_a_run_stopped_between_evaluations_validates_and_keeps_its_last_step(tmp_path):
    net = tmp_path / "net.yaml"
    net.write_text("bandwidth: 100mbit\nlatency: 5ms\n")
    result = fit(strategy="diloco", strategy_params={"H": 3}, steps=40, eval_every=10,
                 net=str(net), time_budget=0.07)
    rows = result.metrics
    last = rows[-1]
    assert result.summary["stopped_by"] == "time_budget" and last["step"] < 10
    assert "val_loss" in last and "val_loss_replicas_average" in last
    # The final model is the held model of that step: its loss is the reported one.
    x = torch.cat([per_rank(r, 3, "val").tensors[0] for r in range(3)])
    y = torch.cat([per_rank(r, 3, "val").tensors[1] for r in range(3)])
    with torch.no_grad():
        loss = torch.nn.functional.mse_loss(result.model.net(x).squeeze(-1), y).item()
    assert loss == pytest.approx(last["val_loss"], rel=1e-6)


def test_a_fold_does_not_depend_on_how_the_ranks_are_grouped():
    g = torch.Generator().manual_seed(0)
    base = torch.randn(1000, generator=g)
    replicas = [base + 1e-3 * torch.randn(1000, generator=g) for _ in range(16)]
    one = Fold()
    for rank, weights in enumerate(replicas):
        one.add(rank, [weights], live=True)
    groups = [Fold() for _ in range(3)]
    for rank, weights in enumerate(replicas):
        groups[rank * 3 // 16].add(rank, [weights], live=True)
    for group in groups[1:]:
        groups[0].merge(group)
    assert torch.equal(one.result(), groups[0].result())
    assert torch.allclose(one.result(), torch.stack(replicas).double().mean(0))
    # A down rank counts only while no rank is up; "rank0" keeps the lowest live rank's.
    down = Fold()
    down.add(0, [replicas[0]], live=False)
    assert torch.equal(down.result(), replicas[0].double())
    down.add(1, [replicas[1]], live=True)
    assert torch.equal(down.result(), replicas[1].double())
    lowest = Fold("rank0")
    for rank in (3, 1, 2):
        lowest.add(rank, [replicas[rank]], live=rank != 1)
    assert torch.equal(lowest.result(), replicas[2].double())
