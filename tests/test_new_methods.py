"""The methods of 2025-26 (eager-diloco, desloc, ...) against references written here from
their papers' equations, with real rank processes; their simulated time against closed forms."""
import pytest
import torch
from torch.nn.utils import parameters_to_vector, vector_to_parameters

import exoframe
from test_equivalence import SHARD, all_data, fit, fresh_model, max_diff, per_rank
from test_strategy_catalogue import N_PARAMS, SLOW_NET, bytes_per_step, ring_all_reduce

ADAMW = dict(optimizer="adamw", lr=0.01)


def replicas_and_shards(nodes):
    x, y = all_data(nodes)
    replicas = [fresh_model() for _ in range(nodes)]
    batches = [(x[r * SHARD:(r + 1) * SHARD], y[r * SHARD:(r + 1) * SHARD]) for r in range(nodes)]
    return replicas, batches


def vector(model):
    return parameters_to_vector(model.parameters()).detach().clone()


def average(models):
    """The run's model: the replicas' mean."""
    mean = fresh_model()
    vector_to_parameters(sum(vector(m) for m in models) / len(models), mean.parameters())
    return mean


# -- eager-diloco ---------------------------------------------------------------------------------

def reference_eager_diloco(nodes, rounds, H, lr=0.7, mu=0.9):
    """Each worker m: H AdamW steps from θ_m; Δ_m = θ_m − θ_m,local; eager outer gradient
    Δ̃_m = Ā_prev − Δ_m,prev/M + Δ_m/M; Nesterov: b ← μb + Δ̃, θ_m ← θ_m − lr(Δ̃ + μb)."""
    replicas, batches = replicas_and_shards(nodes)
    inner = [torch.optim.AdamW(m.parameters(), lr=0.01, weight_decay=0.0) for m in replicas]
    theta = [vector(m) for m in replicas]
    momentum = [torch.zeros_like(t) for t in theta]
    previous = [torch.zeros_like(t) for t in theta]
    previous_mean = torch.zeros_like(theta[0])
    for _ in range(rounds):
        deltas = []
        for m, (model, opt) in enumerate(zip(replicas, inner)):
            for _ in range(H):
                model(batches[m]).backward()
                opt.step()
                opt.zero_grad()
            deltas.append(theta[m] - vector(model))
        for m, model in enumerate(replicas):
            eager = previous_mean - previous[m] / nodes + deltas[m] / nodes
            momentum[m] = mu * momentum[m] + eager
            theta[m] = theta[m] - lr * (eager + mu * momentum[m])
            vector_to_parameters(theta[m].clone(), model.parameters())
        previous, previous_mean = deltas, sum(deltas) / nodes
    return average(replicas)


@pytest.mark.parametrize("nodes", [2, 4])
def test_eager_diloco_equals_its_equations(nodes):
    result = fit("eager-diloco", nodes, steps=12, H=3, **ADAMW)
    assert max_diff(result.model, reference_eager_diloco(nodes, 4, 3)) <= 1e-6
    assert max_diff(result.model, fit("diloco", nodes, steps=12, H=3, **ADAMW).model) > 1e-4
    assert bytes_per_step(result) == [0, 0, ring_all_reduce(nodes, 4 * N_PARAMS)] * 4


@pytest.mark.parametrize("compute,hidden", [(0.1, True), (0.01, False)])
def test_eager_diloco_hides_the_outer_all_reduce_behind_the_next_rounds_compute(
        tmp_path, compute, hidden):
    net = tmp_path / "slow.yaml"
    net.write_text(SLOW_NET)  # 10 Mbit/s, 20 ms: a ring all-reduce 2(n−1)(α + S/(nB))
    n, H, steps = 4, 3, 9
    t_all_reduce = 2 * (n - 1) * (0.020 + 4 * N_PARAMS / (n * 10e6 / 8))
    trainer = exoframe.Trainer(fresh_model(), per_rank, batch_size=SHARD)
    run = dict(num_nodes=n, steps=steps, eval_every=1000, net=str(net),
               compute=f"fixed:{compute}s", strategy_params={"H": H}, **ADAMW)
    eager = trainer.fit(strategy="eager-diloco", **run).summary["simulated_seconds"]
    blocking = trainer.fit(strategy="diloco", **run).summary["simulated_seconds"]
    rounds = steps // H
    # a round: H − 1 steps overlap the previous all-reduce, then one more step; the run
    # ends once the last round's all-reduce is done
    assert eager == pytest.approx(H * compute + (rounds - 1) * (
        max((H - 1) * compute, t_all_reduce) + compute) + t_all_reduce, rel=1e-9)
    assert blocking == pytest.approx(rounds * (H * compute + t_all_reduce), rel=1e-9)
    # fast enough: every all-reduce but the last is hidden behind compute
    assert (eager == pytest.approx(steps * compute + t_all_reduce, rel=1e-9)) == hidden


# -- desloc ---------------------------------------------------------------------------------------

def reference_desloc(nodes, steps, Kx, Ku, Kv, lr=0.01, betas=(0.9, 0.999), eps=1e-8):
    """Adam from its equations on each worker, u ← β1·u + (1−β1)g, v ← β2·v + (1−β2)g²,
    θ ← θ − lr·(u/(1−β1^t)) / (sqrt(v/(1−β2^t)) + eps); after step s, θ, u, v are replaced by
    their mean over workers when Kx, Ku, Kv (respectively) divide s."""
    replicas, batches = replicas_and_shards(nodes)
    theta = [vector(m) for m in replicas]
    u = [torch.zeros_like(t) for t in theta]
    v = [torch.zeros_like(t) for t in theta]
    for s in range(1, steps + 1):
        for m, model in enumerate(replicas):
            vector_to_parameters(theta[m].clone(), model.parameters())
            model.zero_grad()
            model(batches[m]).backward()
            g = parameters_to_vector(p.grad for p in model.parameters())
            u[m] = betas[0] * u[m] + (1 - betas[0]) * g
            v[m] = betas[1] * v[m] + (1 - betas[1]) * g * g
            u_hat, v_hat = u[m] / (1 - betas[0] ** s), v[m] / (1 - betas[1] ** s)
            theta[m] = theta[m] - lr * u_hat / (v_hat.sqrt() + eps)
        for state, period in ((theta, Kx), (u, Ku), (v, Kv)):
            if s % period == 0:
                state[:] = [sum(state) / nodes] * nodes
    for m, model in enumerate(replicas):
        vector_to_parameters(theta[m].clone(), model.parameters())
    return average(replicas), replicas


@pytest.mark.parametrize("nodes", [2, 4])
def test_desloc_equals_its_equations(nodes):
    steps, periods = 12, dict(Kx=2, Ku=3, Kv=4)
    result = fit("desloc", nodes, steps=steps, optimizer="adam", lr=0.01, **periods)
    reference, _ = reference_desloc(nodes, steps, **periods)
    assert max_diff(result.model, reference) <= 1e-6
    local_adam = fit("desloc", nodes, steps=steps, optimizer="adam", lr=0.01, Kx=2, Ku=2, Kv=2)
    assert max_diff(result.model, local_adam.model) > 1e-6  # the moments' periods matter
    # bytes: θ at steps 2, 4, ...; u at 3, 6, ...; v at 4, 8, ...: 4N each, one all-reduce a step
    synced = [sum(s % k == 0 for k in (2, 3, 4)) for s in range(1, steps + 1)]
    assert bytes_per_step(result) == [ring_all_reduce(nodes, 4 * N_PARAMS * k) if k else 0
                                      for k in synced]


def test_desloc_needs_adams_moments():
    with pytest.raises(exoframe.errors.ExoframeError, match="desloc.*exp_avg"):
        fit("desloc", 2, steps=2, optimizer="sgd", Kx=1, Ku=1, Kv=1)


# -- hier-diloco ----------------------------------------------------------------------------------

def fit_on(net, strategy, nodes, steps, packing=None, **params):
    trainer = exoframe.Trainer(fresh_model(), per_rank, batch_size=SHARD)
    return trainer.fit(strategy=strategy, num_nodes=nodes, steps=steps, strategy_params=params,
                       eval_every=1000, net=net, compute="fixed:10ms",
                       nodes_per_process=packing, **ADAMW)


def reference_hier_diloco(sites, rounds, H, lr=0.7, mu=0.9):
    """Each site: one AdamW replica stepping on the mean gradient of its ranks' shards; every
    H steps Δ_s = θ − θ_s, mean over ranks (sites weighed by their ranks), Nesterov outer step."""
    nodes = sum(len(site) for site in sites)
    x, y = all_data(nodes)
    replicas = [fresh_model() for _ in sites]
    inner = [torch.optim.AdamW(m.parameters(), lr=0.01, weight_decay=0.0) for m in replicas]
    theta, momentum = vector(replicas[0]), 0
    for _ in range(rounds):
        for site, model, opt in zip(sites, replicas, inner):
            for _ in range(H):
                grads = []
                for r in site:
                    model.zero_grad()
                    model((x[r * SHARD:(r + 1) * SHARD], y[r * SHARD:(r + 1) * SHARD])).backward()
                    grads.append([p.grad.clone() for p in model.parameters()])
                for p, *g in zip(model.parameters(), *grads):
                    p.grad = sum(g) / len(site)
                opt.step()
        mean = sum(len(site) * (theta - vector(m)) for site, m in zip(sites, replicas)) / nodes
        momentum = mu * momentum + mean
        theta = theta - lr * (mean + mu * momentum)
        for model in replicas:
            vector_to_parameters(theta.clone(), model.parameters())
    return replicas[0]


@pytest.mark.parametrize("nodes,sites", [(2, [[0], [1]]), (4, [[0, 1], [2, 3]])])
def test_hier_diloco_equals_its_equations_on_geo_2dc(nodes, sites):
    result = fit_on("geo-2dc", "hier-diloco", nodes, 9, H=3)
    assert max_diff(result.model, reference_hier_diloco(sites, 3, 3)) <= 1e-6
    if nodes == 2:  # one rank per site: DiLoCo
        assert max_diff(result.model, fit_on("geo-2dc", "diloco", 2, 9, H=3).model) == 0


def test_only_the_outer_reduction_crosses_between_the_sites():
    n, S, H, steps = 4, 4 * N_PARAMS, 3, 9
    hier = fit_on("geo-2dc", "hier-diloco", n, steps, H=H).summary
    # The outer ring all-reduce over ranks 0, 1 | 2, 3 crosses at 1 → 2 and 3 → 0, each
    # carrying what one rank sends in a ring: 2(n−1)/n · S per outer step.
    per_outer_step = 2 * (n - 1) / n * S
    assert hier["bytes_between_sites"] == {"us->eu": steps // H * per_outer_step,
                                           "eu->us": steps // H * per_outer_step}
    # each rank: the site's 2-rank ring every step, plus the outer all-reduce
    assert hier["bytes_sent_per_rank"] == [steps * ring_all_reduce(2, S)
                                           + steps // H * ring_all_reduce(n, S)] * n
    ddp = fit_on("geo-2dc", "ddp", n, steps).summary  # every step crosses
    assert ddp["bytes_between_sites"]["us->eu"] == steps * per_outer_step


# -- every new strategy: packed, checkpointed, projected ------------------------------------------

NEW = [("sparseloco", {"H": 2, "chunk": 32, "topk": 4}), ("eager-diloco", {"H": 3}),
       ("desloc", {"Kx": 2, "Ku": 3, "Kv": 4}), ("hier-diloco", {"H": 3})]


@pytest.mark.parametrize("strategy,params", NEW)
def test_packed_and_a_process_per_node_give_the_same_run_on_geo_2dc(strategy, params):
    runs = [fit_on("geo-2dc", strategy, 4, 6, packing=packing, **params) for packing in (4, None)]
    packed, alone = runs
    assert max_diff(packed.model, alone.model) <= 1e-6
    assert max_diff(packed.model, fresh_model()) > 1e-3
    for key in ("simulated_seconds", "bytes_sent_per_rank", "bytes_between_sites"):
        assert packed.summary[key] == alone.summary[key], key


@pytest.mark.parametrize("strategy,params", NEW)
def test_a_resumed_run_equals_the_run_never_stopped(tmp_path, strategy, params):
    def run(steps, **more):
        trainer = exoframe.Trainer(fresh_model(), per_rank, batch_size=SHARD)
        return trainer.fit(strategy=strategy, num_nodes=2, steps=steps, strategy_params=params,
                           eval_every=1000, net="geo-2dc", compute="fixed:10ms",
                           checkpoint_every=3, **ADAMW, **more)
    first = run(6, out=str(tmp_path))
    resumed = run(9, resume=str(first.run_dir))
    whole = run(9, out=str(tmp_path / "whole"))
    assert max_diff(resumed.model, whole.model) == 0
    assert resumed.summary["simulated_seconds"] == whole.summary["simulated_seconds"]
    assert resumed.summary["bytes_sent_per_rank"] == whole.summary["bytes_sent_per_rank"]


@pytest.mark.parametrize("strategy,params", NEW)
def test_a_projection_scales_every_exchange_to_the_projected_model(strategy, params):
    from exoframe.experiments.run_replays import Projection, replay_trace
    from exoframe.plugins import get_plugin_manager
    from exoframe.sim import resolve_sim

    result = fit_on("geo-2dc", strategy, 4, 6, **params)
    sim = resolve_sim("geo-2dc", "measured", "", 4, get_plugin_manager())
    projected = replay_trace(result.trace, sim, Projection(1e6, 0.05))
    assert projected["bytes_sent_per_node"] == pytest.approx(
        result.summary["bytes_sent_per_node"] * 1e6 / N_PARAMS, rel=1e-9)
    assert projected["simulated_seconds"] >= 6 * 0.05


# -- halos ----------------------------------------------------------------------------------------

class ReferenceDelayedNesterov:
    """HALoS's DelayedNesterovOptimizer (c = 0): θ ← θ − lr·g/N each push; each N-th push
    also m ← β·m + (sum of the last N)/N and θ ← θ − lr·β·m."""

    def __init__(self, lr, beta, buffer, like):
        self.lr, self.beta, self.buffer, self.t = lr, beta, buffer, 0
        self.m, self.delta = torch.zeros_like(like), torch.zeros_like(like)

    def step(self, theta, g):
        self.delta = self.delta + g
        if (self.t + 1) % self.buffer == 0:
            self.m = self.beta * self.m + self.delta / self.buffer
            theta = theta - self.lr * (self.beta * self.m + g / self.buffer)
            self.delta = torch.zeros_like(g)
        else:
            theta = theta - self.lr * g / self.buffer
        self.t += 1
        return theta


def reference_halos_one_region(nodes, steps, H, K, alpha, local, global_):
    """HALoS on a network without sites and without delays: rank 0 is the region's server
    (LPS) and the global one (GPS). At a round end the workers push in rank order; the LPS
    applies each push and answers its model; at K versions past the last merge it sends
    u = θ_merged − θ_LPS to the GPS, which steps and answers θ_G; the LPS merges it at its
    next step, θ_LPS ← (1 − α)θ_LPS + α·θ_G."""
    replicas, batches = replicas_and_shards(nodes)
    inner = [torch.optim.AdamW(m.parameters(), lr=0.01, weight_decay=0.0) for m in replicas]
    start = [vector(m) for m in replicas]
    region = merged = start[0].clone()
    global_model = start[0].clone()
    lps = ReferenceDelayedNesterov(*local, region)
    gps = ReferenceDelayedNesterov(*global_, region)
    version = merged_version = 0
    answer = None
    for s in range(1, steps + 1):
        for model, opt, batch in zip(replicas, inner, batches):
            model(batch).backward()
            opt.step()
            opt.zero_grad()
        if answer is not None:  # the LPS's step: merge the GPS's answer
            region = (1 - alpha) * region + alpha * answer
            merged, merged_version, answer = region.clone(), version, None
        if s % H:
            continue
        for r, model in enumerate(replicas):
            region = lps.step(region, start[r] - vector(model))
            version += 1
            if answer is None and version == merged_version + K:
                global_model = gps.step(global_model, merged - region)
                answer = global_model.clone()
            start[r] = region.clone()
            vector_to_parameters(region.clone(), model.parameters())
    return average(replicas)


HALOS = dict(H=2, K=3, alpha=0.5, local_lr=0.8, local_beta=0.9, local_buffer=2, global_lr=0.6,
             global_beta=0.5, global_buffer=2)


@pytest.mark.parametrize("nodes", [2, 4])
def test_halos_equals_its_equations_in_one_region_without_delays(nodes):
    steps = 12  # 6 rounds: 6·nodes pushes, 4 (2 nodes) or 8 (4 nodes) global updates
    result = fit_on("ideal", "halos", nodes, steps, **HALOS)
    reference = reference_halos_one_region(
        nodes, steps, 2, 3, 0.5, (0.8, 0.9, 2), (0.6, 0.5, 2))
    assert max_diff(result.model, reference) <= 1e-6
    assert max_diff(result.model, fresh_model()) > 1e-3


def test_halos_on_geo_2dc_is_the_same_packed_and_only_its_servers_talk_across_sites():
    runs = [fit_on("geo-2dc", "halos", 4, 12, packing=packing, **HALOS) for packing in (4, None)]
    assert max_diff(runs[0].model, runs[1].model) == 0
    assert runs[0].summary["simulated_seconds"] == runs[1].summary["simulated_seconds"]
    summary = runs[0].summary
    sent, across = summary["bytes_sent_per_rank"], summary["bytes_between_sites"]
    # workers 1 and 3 push only to their own site's server, as often as each other
    assert sent[1] == sent[3]
    # the servers answer their own workers alike; beyond that, rank 2 (eu's server) sends
    # its updates to the GPS and rank 0 its answers: exactly what crosses between the sites
    assert sent[2] - sent[0] == across["eu->us"] - across["us->eu"]
    assert 4 * N_PARAMS < across["eu->us"] < 2 * 4 * N_PARAMS  # one update, no push


def test_desloc_goes_on_through_a_failure_and_the_node_back_takes_every_state():
    trainer = exoframe.Trainer(fresh_model(), per_rank, batch_size=SHARD)
    result = trainer.fit(strategy="desloc", num_nodes=4, steps=12, optimizer="adam", lr=0.01,
                         strategy_params={"Kx": 2, "Ku": 3, "Kv": 4}, eval_every=1000,
                         net="geo-2dc", compute="fixed:10ms", faults="2@0.02s:0.03s")
    summary = result.summary
    assert summary["status"] == "completed"
    (failure,) = summary["failures"]
    assert failure["rank"] == 2 and failure["recovered_from"] == 0
    # the parameters and Adam's two moments (fp32) and its step count per parameter
    params = list(result.model.parameters())
    assert failure["recovery_bytes"] == 3 * 4 * N_PARAMS + 4 * len(params)
