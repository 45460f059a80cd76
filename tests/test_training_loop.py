"""The training loop (issue 12): schedules, clipping, accumulation, precision, optimizers by
name, metrics, streams, epochs and the time budget, each against a plain single-process
torch computation of the same thing. Runs use real ranks through exoframe.Trainer."""
import json
import math

import pytest
import torch
from conftest import Regressor
from torch.utils.data import IterableDataset, TensorDataset

import exoframe
from exoframe.engine.node.loop import Precision, forward_backward
from exoframe.engine.node.schedule import lr_at
from exoframe.engine.plan import devices
from exoframe.errors import ExoframeError
from exoframe.plugins import PluginManager
from exoframe.strategies import OptimizerSpec

BATCH = 8


def data(n, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 6, generator=g)
    return x, torch.sin(x.sum(1)) + 0.1 * torch.randn(n, generator=g)


def per_rank(shard):
    def factory(rank, num_nodes, split):
        x, y = data(shard, 100 * rank + (split == "val"))
        return TensorDataset(x, y)
    return factory


def fresh_model():
    torch.manual_seed(0)
    return Regressor()


def fit(shard=BATCH, batch=BATCH, nodes=2, **kw):
    trainer = exoframe.Trainer(fresh_model(), per_rank(shard), batch_size=batch)
    kw.setdefault("optimizer", "sgd")
    kw.setdefault("lr", 0.1)
    kw.setdefault("eval_every", 1000)
    return trainer.fit(num_nodes=nodes, **kw)


def weights(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


# -- schedules ------------------------------------------------------------------------------

def torch_schedule(schedule, total, warmup, min_ratio, lr=1.0):
    """The same schedule from torch's own schedulers, one value per step."""
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=lr)
    after = total - warmup
    decays = {
        "constant": lambda: torch.optim.lr_scheduler.ConstantLR(opt, factor=1.0, total_iters=0),
        "linear": lambda: torch.optim.lr_scheduler.LinearLR(
            opt, 1.0, min_ratio, total_iters=after - 1),
        "cosine": lambda: torch.optim.lr_scheduler.CosineAnnealingLR(
            opt, T_max=after - 1, eta_min=min_ratio * lr),
    }
    if schedule == "wsd":
        decay = math.ceil(0.2 * after)
        stable = torch.optim.lr_scheduler.ConstantLR(opt, factor=1.0, total_iters=0)
        fall = torch.optim.lr_scheduler.LinearLR(opt, 1 - (1 - min_ratio) / decay, min_ratio,
                                                 total_iters=decay - 1)
        parts, milestones = [stable, fall], [after - decay]
    else:
        parts, milestones = [decays[schedule]()], []
    if warmup:
        rise = torch.optim.lr_scheduler.LinearLR(opt, 1 / warmup, 1.0, total_iters=warmup - 1)
        parts, milestones = [rise, *parts], [warmup, *(m + warmup for m in milestones)]
    sched = torch.optim.lr_scheduler.SequentialLR(opt, parts, milestones) if len(parts) > 1 \
        else parts[0]
    values = []
    for _ in range(total):
        values.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return values


@pytest.mark.parametrize("schedule", ["constant", "linear", "cosine", "wsd"])
@pytest.mark.parametrize("total,warmup,min_ratio", [(40, 0, 0.0), (40, 5, 0.1), (17, 3, 0.2)])
def test_schedules_equal_torchs_schedulers(schedule, total, warmup, min_ratio):
    ours = [lr_at(k, 1.0, schedule, total, warmup, min_ratio) for k in range(1, total + 1)]
    assert ours == pytest.approx(torch_schedule(schedule, total, warmup, min_ratio), abs=1e-12)


@pytest.mark.parametrize("schedule", ["linear", "cosine", "wsd"])
@pytest.mark.parametrize("total,warmup", [(1, 0), (2, 1), (5, 0), (6, 3)])
def test_short_runs_still_end_at_the_minimum(schedule, total, warmup):
    lrs = [lr_at(k, 1.0, schedule, total, warmup, 0.25) for k in range(1, total + 1)]
    assert lrs[-1] == pytest.approx(0.25) and max(lrs) <= 1.0
    if warmup:
        assert lrs[warmup - 1] == 1.0  # the peak, at the end of warm-up


# -- the run, and each piece against a plain loop ------------------------------------

def test_a_run_with_every_feature_trains_and_logs_its_lr():
    result = fit(shard=64, steps=30, strategy="ddp", optimizer="adamw", lr=0.01,
                 optimizer_params={"betas": [0.9, 0.95]}, schedule="cosine", warmup_steps=10,
                 clip_grad_norm=1.0, accumulate=2, precision="bf16", eval_every=10)
    assert result.summary["samples_seen"] == 30 * BATCH * 2 * 2
    lrs = [row["lr"] for row in result.metrics]
    assert lrs == pytest.approx(torch_schedule("cosine", 30, 10, 0.0, lr=0.01))
    assert all("grad_norm" in row for row in result.metrics)
    assert result.metrics[-1]["val_loss"] < result.metrics[0]["loss"]
    assert result.summary["effective_batch_size"] == BATCH * 2 * 2


def test_clipping_clips_each_ranks_local_gradients_before_the_strategy():
    steps, max_norm = 4, 0.05
    result = fit(strategy="ddp", steps=steps, clip_grad_norm=max_norm)
    model = fresh_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    norms = []
    for _ in range(steps):
        grads, step_norms = [], []
        for rank in range(2):
            model.zero_grad()
            model(data(BATCH, 100 * rank)).backward()
            step_norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(),
                                                                    max_norm)))
            grads.append([p.grad.clone() for p in model.parameters()])
        for p, *rank_grads in zip(model.parameters(), *grads):
            p.grad = sum(rank_grads) / 2
        opt.step()
        norms.append(sum(step_norms) / 2)
    assert [row["grad_norm"] for row in result.metrics] == pytest.approx(norms, rel=1e-6)
    assert min(norms) > max_norm  # every step was clipped
    assert (weights(result.model) - weights(model)).abs().max() < 1e-6


def test_accumulated_gradient_equals_the_large_batch_gradient():
    # One SGD step with lr 1: the weights move by exactly the (averaged) gradient.
    big = fit(shard=32, batch=32, strategy="ddp", steps=1, lr=1.0, shuffle=False)
    small = fit(shard=32, batch=8, strategy="ddp", steps=1, lr=1.0, accumulate=4,
                shuffle=False)
    model = fresh_model()
    for rank in range(2):
        (model(data(32, 100 * rank)) / 2).backward()
    with torch.no_grad():
        for p in model.parameters():
            p -= p.grad
    assert (weights(small.model) - weights(model)).abs().max() < 1e-6
    assert (weights(big.model) - weights(model)).abs().max() < 1e-6
    assert small.summary["effective_batch_size"] == big.summary["effective_batch_size"] == 64


def test_ddp_with_accumulate_4_equals_ddp_with_4x_the_batch():
    small = fit(shard=64, batch=4, strategy="ddp", steps=8, optimizer="adamw", lr=0.01,
                accumulate=4)
    big = fit(shard=64, batch=16, strategy="ddp", steps=8, optimizer="adamw", lr=0.01)
    assert (weights(small.model) - weights(big.model)).abs().max() < 1e-5
    assert [r["loss"] for r in small.metrics] == pytest.approx(
        [r["loss"] for r in big.metrics], rel=1e-5)


def test_bf16_autocast_is_active_and_equals_a_plain_autocast_loop():
    args = dict(strategy="localsgd", steps=1, strategy_params={"H": 100}, shuffle=False)
    bf16, fp32 = fit(precision="bf16", **args), fit(**args)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert fresh_model().net[0](data(BATCH, 0)[0]).dtype == torch.bfloat16
        plain = sum(fresh_model()(data(BATCH, 100 * rank)).item() for rank in range(2)) / 2
    assert bf16.metrics[0]["loss"] == pytest.approx(plain, rel=1e-6)
    assert bf16.metrics[0]["loss"] != pytest.approx(fp32.metrics[0]["loss"], rel=1e-5)


def test_fp16_trains_with_a_loss_scale():
    result = fit(shard=64, strategy="ddp", steps=10, precision="fp16", optimizer="adamw",
                 lr=0.01)
    losses = [row["loss"] for row in result.metrics]
    assert all(math.isfinite(x) for x in losses) and losses[-1] < losses[0]
    # torch's GradScaler at work: its initial scale, kept while no gradient overflows
    assert [row["loss_scale"] for row in result.metrics] == [2.0 ** 16] * 10
    assert "loss_scale" not in fit(strategy="ddp", steps=1).metrics[0]


class FlagProbe(torch.nn.Module):
    """Records torch's TF32 flags as its forward and its backward run."""

    def __init__(self):
        super().__init__()
        self.w, self.seen = torch.nn.Parameter(torch.ones(1)), []

    def flags(self, when):
        self.seen.append((when, torch.backends.cuda.matmul.allow_tf32,
                          torch.backends.cudnn.allow_tf32))

    def forward(self, x):
        self.flags("forward")
        y = self.w * x
        y.register_hook(lambda grad: self.flags("backward"))
        return y.sum()


def test_tf32_holds_torchs_flags_through_a_nodes_passes_and_puts_them_back():
    """tf32 is a mode of CUDA matmuls, set by process-wide flags: on through a node's
    forward and backward, as they were outside them (validation, the user's own code)."""
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    assert before == (False, True)  # torch's defaults: matmuls in fp32, convolutions in TF32
    cpu = torch.device("cpu")
    for name, flags in (("tf32", (True, True)), ("fp32", before)):
        probe = FlagProbe()
        forward_backward(probe, iter([torch.ones(2)] * 2), 2, Precision(name, cpu), cpu, 0)
        assert probe.seen == [("forward", *flags), ("backward", *flags)] * 2
        assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == before
    with pytest.raises(ExoframeError, match=r"^precision: tf32 is how a CUDA GPU multiplies "
                       r"fp32 matrices, and these nodes train on cpu; use --precision fp32 "
                       r"there, or --device cuda\.$"):
        fit(strategy="ddp", steps=1, precision="tf32")


# -- optimizers -----------------------------------------------------------------------------

def test_any_torch_optimizer_by_name_with_its_keyword_arguments():
    spec = OptimizerSpec("adamw", 0.01, params={"betas": (0.9, 0.95), "eps": 1e-6})
    group = spec.build([torch.nn.Parameter(torch.zeros(3))]).param_groups[0]
    assert (group["betas"], group["eps"], group["lr"]) == ((0.9, 0.95), 1e-6, 0.01)
    assert type(OptimizerSpec("rmsprop", 0.01).build([torch.nn.Parameter(torch.zeros(1))])) \
        is torch.optim.RMSprop
    with pytest.raises(ExoframeError, match="unknown optimizer 'adamv'. Did you mean"):
        OptimizerSpec("adamv")
    with pytest.raises(ExoframeError, match="optimizer 'adamw': .*betas"):
        OptimizerSpec("adamw", params={"betas": 3})
    with pytest.raises(ExoframeError, match="takes no momentum"):
        OptimizerSpec("adam", momentum=0.9)
    with pytest.raises(ExoframeError, match="give the learning rate as lr"):
        OptimizerSpec("adamw", params={"lr": 0.1})


def test_rmsprop_run_equals_a_plain_rmsprop_loop():
    result = fit(strategy="ddp", steps=3, optimizer="rmsprop", lr=0.01,
                 optimizer_params={"alpha": 0.9})
    model = fresh_model()
    opt = torch.optim.RMSprop(model.parameters(), lr=0.01, alpha=0.9)
    for _ in range(3):
        opt.zero_grad()
        for rank in range(2):
            (model(data(BATCH, 100 * rank)) / 2).backward()
        opt.step()
    assert (weights(result.model) - weights(model)).abs().max() < 1e-5


def test_diloco_takes_its_outer_optimizer_by_name():
    H, steps = 2, 4
    result = fit(shard=16, strategy="diloco", steps=steps, shuffle=False, strategy_params={
        "H": H, "outer_lr": 0.05, "outer_optimizer": "adam",
        "outer_optimizer_params": {"betas": [0.8, 0.9]}})
    # By hand: each rank runs H SGD steps from the global weights; the outer gradient is
    # global − mean(local), and Adam steps the global weights with it.
    global_model = fresh_model()
    outer = torch.optim.Adam(global_model.parameters(), lr=0.05, betas=(0.8, 0.9))
    batches = [[tuple(t[i:i + BATCH] for t in data(16, 100 * r)) for i in (0, 8)]
               for r in range(2)]
    for sync in range(steps // H):
        locals_ = []
        for rank in range(2):
            local = fresh_model()
            local.load_state_dict(global_model.state_dict())
            inner = torch.optim.SGD(local.parameters(), lr=0.1)
            for batch in batches[rank]:  # H = 2 steps, the shard in order
                inner.zero_grad()
                local(batch).backward()
                inner.step()
            locals_.append(weights(local))
        delta = weights(global_model) - sum(locals_) / 2
        offset = 0
        for p in global_model.parameters():
            p.grad = delta[offset:offset + p.numel()].view_as(p).clone()
            offset += p.numel()
        outer.step()
    assert (weights(result.model) - weights(global_model)).abs().max() < 1e-5


def test_a_plugin_registers_an_optimizer():
    class SignSGD(torch.optim.SGD):
        """SGD on the sign of the gradient."""

        def step(self, closure=None):
            for group in self.param_groups:
                for p in group["params"]:
                    p.grad.sign_()
            return super().step(closure)

    class Plugin:
        @exoframe.hookimpl
        def exoframe_register_optimizers(self, register):
            register("signsgd", SignSGD)

    pm = PluginManager(load_entry_points=False)
    pm.register(Plugin(), name="signsgd-plugin", source="tests")
    entry = pm.optimizers.get("signsgd")
    assert entry.obj is SignSGD and entry.source == "tests"
    assert pm.optimizers.get("adamw").obj is torch.optim.AdamW  # built-ins beside it
    # A run builds it like any optimizer: each step moves every weight by lr·sign(grad).
    model = fresh_model()
    before = weights(model)
    optimizer = OptimizerSpec(entry.name, 0.01, factory=entry.obj).build(model.parameters())
    model(data(BATCH, 0)).backward()
    signs = torch.cat([p.grad.sign().reshape(-1) for p in model.parameters()])
    optimizer.step()
    assert torch.allclose(weights(model), before - 0.01 * signs)


# -- data, metrics and stopping -------------------------------------------------------------

class Stream(IterableDataset):
    """A per-rank stream of `n` examples."""

    def __init__(self, n, seed):
        self.n, self.seed = n, seed

    def __iter__(self):
        x, y = data(self.n, self.seed)
        return iter(zip(x, y))


def test_an_iterable_dataset_factory_trains_and_a_dry_stream_is_one_clear_error():
    def streams(rank, num_nodes, split):
        return Stream(80 if split == "train" else 16, 100 * rank + (split == "val"))

    trainer = exoframe.Trainer(fresh_model(), streams, batch_size=BATCH)
    result = trainer.fit(num_nodes=2, steps=10, optimizer="sgd", lr=0.1, eval_every=5)
    assert len(result.metrics) == 10 and result.metrics[-1]["val_loss"] < result.metrics[0]["loss"]
    # read in order: the first step's loss is the initial model's on each stream's first 8
    first = [fresh_model()(tuple(t[:BATCH] for t in data(80, 100 * r))).item() for r in (0, 1)]
    assert result.metrics[0]["loss"] == pytest.approx(sum(first) / 2, rel=1e-6)
    with pytest.raises(ExoframeError, match=r"rank \d: its training stream .* ran dry after "
                                            r"10 batches of 8"):
        trainer.fit(num_nodes=2, steps=11, optimizer="sgd", lr=0.1)


def test_epochs_replace_steps_and_no_shuffle_keeps_the_shards_order():
    result = fit(shard=40, batch=8, strategy="ddp", epochs=3, shuffle=False, lr=1.0)
    assert result.summary["steps"] == 15  # 3 epochs × 5 batches
    first = fit(shard=40, batch=8, strategy="ddp", steps=1, shuffle=False, lr=1.0)
    in_order = [fresh_model()(tuple(t[:8] for t in data(40, 100 * r))).item() for r in (0, 1)]
    assert first.metrics[0]["loss"] == pytest.approx(sum(in_order) / 2, rel=1e-6)
    kept = fit(shard=36, batch=8, strategy="ddp", epochs=1, drop_last=False)
    assert kept.summary["steps"] == 5  # 4 full batches and a short one
    assert kept.summary["samples_seen"] == 2 * 36  # what the ranks trained on


def test_mlp_reports_accuracy_in_metrics_and_summary(cli):
    result = cli("run", "--workload", "mlp", "--nodes", "2", "--steps", "6", "--eval-every",
                 "3", "--out", "runs", "--no-progress")
    assert result.returncode == 0, result.stderr_text
    (folder,) = (cli.cwd / "runs").iterdir()
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    summary = json.loads((folder / "summary.json").read_text())
    assert [r["step"] for r in rows if "val_accuracy" in r] == [3, 6]
    assert 0 < summary["final_val_accuracy"] == rows[-1]["val_accuracy"] <= 1


def test_accuracy_is_the_averaged_models_accuracy_on_the_validation_data():
    from exoframe.workloads.mlp import mlp

    workload = mlp(train_examples=512, val_examples=128)
    trainer = exoframe.Trainer(workload.build_model(), workload.dataset, batch_size=32,
                               metrics=workload.metrics)
    result = trainer.fit(num_nodes=2, steps=5, eval_every=5)
    correct = total = 0
    for rank in range(2):
        x, y = workload.dataset(rank, 2, "val")[:]
        correct += (result.model.net(x).argmax(1) == y).sum().item()
        total += len(y)
    assert result.metrics[-1]["val_accuracy"] == pytest.approx(correct / total, abs=1e-9)


def test_time_budget_stops_at_the_first_step_whose_end_reaches_it(tmp_path):
    # fixed 10 ms of compute, then a 2-rank ring all-reduce of the gradient on a 100 Mbit/s,
    # 5 ms network: every step takes the same time, in closed form.
    net = tmp_path / "net.yaml"
    net.write_text("bandwidth: 100mbit\nlatency: 5ms\nprotocol: none\n")
    n_params = sum(p.numel() for p in fresh_model().parameters())
    ring = 2 * (2 - 1) * (0.005 + 4 * n_params / (2 * 12.5e6))
    step = 0.010 + ring
    budget = 7.5 * step
    result = fit(strategy="ddp", steps=50, net=str(net), compute="fixed:10ms",
                 time_budget=budget)
    assert result.summary["stopped_by"] == "time_budget"
    assert result.summary["steps"] == len(result.metrics) == 8  # ends at 8·step ≥ 7.5·step
    assert result.metrics[-1]["sim_time"] == pytest.approx(8 * step, rel=1e-9)
    assert result.metrics[-2]["sim_time"] < budget <= result.metrics[-1]["sim_time"]
    assert "val_loss" in result.metrics[-1]  # the step it stopped at is validated
    assert fit(strategy="ddp", steps=5, compute="fixed:10ms").summary["stopped_by"] == "steps"


# -- GPUs -----------------------------------------------------------------------------------

# Counted through NVML (engine/plan/devices.py): is_available() would initialize CUDA in pytest's
# process, and the ranks forked from it could not use CUDA.
needs_cuda = pytest.mark.skipif(devices.gpu_count() == 0, reason="needs a CUDA GPU")


@needs_cuda
@pytest.mark.parametrize("strategy,params", [("ddp", {}), ("diloco", {"H": 2})])
def test_two_ranks_sharing_one_gpu_equal_the_cpu_run(strategy, params):
    gpu = fit(shard=32, strategy=strategy, strategy_params=params, steps=6, device="cuda:0")
    cpu = fit(shard=32, strategy=strategy, strategy_params=params, steps=6)
    assert (weights(gpu.model) - weights(cpu.model)).abs().max() < 1e-4


@pytest.mark.skipif(devices.gpu_count() < 2, reason="needs two CUDA GPUs")
def test_ranks_on_separate_gpus_equal_the_cpu_run():
    gpu = fit(shard=32, strategy="ddp", steps=6, device="cuda")
    cpu = fit(shard=32, strategy="ddp", steps=6)
    assert (weights(gpu.model) - weights(cpu.model)).abs().max() < 1e-4
