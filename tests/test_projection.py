"""Projections against closed forms computed here from first principles: DDP's buckets one
after another on one stream per rank, a declared overlappable outer sync, payload bits; and
`sweep --config` honouring the file, flags overriding it."""
import json
import math
from pathlib import Path

import pytest
import yaml
from conftest import REPO, SMALL_GPT, SMALL_GPT_FLAGS, one_line_error as bad

from exoframe.cli import main
from exoframe.config import RunConfig
from exoframe.engine import execute, job_from_config
from exoframe.experiments.run_replays import Projection, replay_trace
from exoframe.plugins import get_plugin_manager
from exoframe.sim import resolve_sim

MIB = 2 ** 20


def train(strategy, nodes, steps, **params):
    config = RunConfig(workload_params=dict(SMALL_GPT), strategy=strategy, strategy_params=params,
                       nodes=nodes, steps=steps, compute="fixed:10ms").validate()
    return execute(job_from_config(config)).trace


@pytest.fixture(scope="module")
def traces():
    return {"ddp": train("ddp", 3, 3), "diloco": train("diloco", 2, 4, H=2),
            "localsgd": train("localsgd", 2, 4, H=2), "topk-ef": train("topk-ef", 2, 2),
            "streaming-tau0": train("streaming-diloco", 2, 8, H=4, fragments=2, tau=0),
            "streaming-tau1": train("streaming-diloco", 2, 8, H=4, fragments=2, tau=1)}


def network(tmp_path, bandwidth: str, latency: str) -> str:
    """A network file for the closed forms here: the exact alpha-beta model (protocol: none)."""
    path = tmp_path / f"net-{bandwidth}-{latency}.yaml"
    path.write_text(f"bandwidth: {bandwidth}\nlatency: {latency}\nprotocol: none\n")
    return str(path)


def project(trace, net, projection):
    sim = resolve_sim(net, "measured", "", trace["nodes"], get_plugin_manager())
    return replay_trace(trace, sim, projection)


def ring_all_reduce(nbytes, n, bandwidth, latency):
    """2(n-1) rounds, in each of which every node sends nbytes/n to its neighbour."""
    return 2 * (n - 1) * (latency + nbytes / n / bandwidth)


def streamed_step(compute, nbytes, n, bandwidth, latency, bucket_bytes=25 * MIB):
    """A step whose all-reduce of nbytes goes out in equal buckets during the backward pass,
    one after another: the forward pass is 1/3 of the compute, the backward's k equal
    slices each make one bucket's gradients ready, and a bucket starts once they are ready
    and the bucket before it is done."""
    k = math.ceil(nbytes / bucket_bytes)
    forward, backward_slice = compute / 3, compute * 2 / 3 / k
    done = 0.0
    for i in range(k):
        ready = forward + (i + 1) * backward_slice
        done = max(ready, done) + ring_all_reduce(nbytes / k, n, bandwidth, latency)
    return done


def step_durations(record):
    times = [0.0, *record["sim_times"]]
    return [after - before for before, after in zip(times, times[1:])]


def check_clocks_add_up(record):
    for rank in record["per_rank"]:
        parts = rank["compute_seconds"] + rank["comm_seconds"] + rank["idle_seconds"]
        assert math.isclose(parts, rank["simulated_seconds"], rel_tol=1e-9), rank


@pytest.mark.parametrize("params,step,bandwidth,bandwidth_text", [
    # The case, latency-bound: 153 buckets, each waiting for the one before.
    (1e9, 0.5, 1e12 / 8, "1tbit"),
    (1e8, 6.0, 1e10 / 8, "10gbit"),  # compute-bound: every bucket waits for its gradients
])
def test_ddp_buckets_go_one_after_another_on_a_40ms_wan(traces, tmp_path, params, step,
                                                        bandwidth, bandwidth_text):
    trace = traces["ddp"]
    record = project(trace, network(tmp_path, bandwidth_text, "40ms"), Projection(params, step))
    expected = streamed_step(step, 4 * params, 3, bandwidth, 0.040)
    for duration in step_durations(record):
        assert math.isclose(duration, expected, rel_tol=1e-6), (duration, expected)
    assert math.isclose(record["compute_utilization"], step / expected, rel_tol=1e-6)
    check_clocks_add_up(record)
    for rank in record["per_rank"]:  # what the backward pass hides is not communication time
        exposed = rank["comm_seconds"] + rank["idle_seconds"]
        assert math.isclose(exposed, 3 * (expected - step), rel_tol=1e-6), rank


def test_a_declared_overlappable_outer_sync_streams_through_the_sync_steps_backward(
        traces, tmp_path):
    """diloco (declared) with H=2: steps 2 and 4 end with its outer all-reduce streamed in
    100 MiB buckets through their backward pass; steps 1 and 3 are compute only. localsgd
    (not declared) runs the same all-reduce after the compute."""
    net = network(tmp_path, "1gbit", "40ms")
    bandwidth, latency, params, step = 1e9 / 8, 0.040, 1e8, 1.0
    projection = Projection(params, step, bucket_mb=100)
    assert traces["diloco"]["overlapped_outer_sync"]
    assert not traces["localsgd"]["overlapped_outer_sync"]

    sync = streamed_step(step, 4 * params, 2, bandwidth, latency, bucket_bytes=100 * MIB)
    overlapped = step_durations(project(traces["diloco"], net, projection))
    for duration, expected in zip(overlapped, [step, sync, step, sync], strict=True):
        assert math.isclose(duration, expected, rel_tol=1e-6), (duration, expected)

    blocking = step + ring_all_reduce(4 * params, 2, bandwidth, latency)
    after = step_durations(project(traces["localsgd"], net, projection))
    for duration, expected in zip(after, [step, blocking, step, blocking], strict=True):
        assert math.isclose(duration, expected, rel_tol=1e-6), (duration, expected)
    assert sync < blocking  # 4 buckets: the backward hides more than their extra latency


@pytest.mark.parametrize("strategy", ["ddp", "diloco", "topk-ef"])
def test_16_bit_payloads_halve_every_strategys_bytes(traces, tmp_path, strategy):
    net = network(tmp_path, "1gbit", "10ms")
    fp32 = project(traces[strategy], net, Projection(1e8, 0.5))
    bf16 = project(traces[strategy], net, Projection(1e8, 0.5, payload_bits=16))
    assert fp32["bytes_sent_per_node"] > 0
    assert math.isclose(bf16["bytes_sent_per_node"], fp32["bytes_sent_per_node"] / 2,
                        rel_tol=1e-12)
    assert bf16["projection"] == "1e+08 params, 0.5 s/step, 16-bit payloads"
    assert bf16["simulated_seconds"] < fp32["simulated_seconds"]


def test_16_bit_ddp_matches_the_closed_form_with_half_the_bytes(traces, tmp_path):
    record = project(traces["ddp"], network(tmp_path, "10gbit", "40ms"),
                     Projection(1e9, 0.5, payload_bits=16))
    expected = streamed_step(0.5, 2e9, 3, 1e10 / 8, 0.040)
    for duration in step_durations(record):
        assert math.isclose(duration, expected, rel_tol=1e-6), (duration, expected)


def test_bad_projection_input_is_one_clear_line(tmp_path, capsys):
    projection = ["--project-params", "1e9", "--step-time", "1s"]
    sweep = ["sweep", "--out", tmp_path / "s", "--no-progress", "--no-plots"]
    assert "--payload-bits must be more than 0 and at most 32" in bad(
        capsys, *sweep, *projection, "--payload-bits", "0")
    assert "--payload-bits must be more than 0 and at most 32" in bad(
        capsys, "replay", tmp_path, "--net", "wan-1gbps", *projection, "--payload-bits", "64")
    assert "--payload-bits is a projection parameter" in bad(
        capsys, "replay", tmp_path, "--net", "wan-1gbps", "--payload-bits", "16")
    assert "--bucket-mb must be a positive size in MiB" in bad(
        capsys, *sweep, *projection, "--bucket-mb", "-1")
    config = tmp_path / "stray.yaml"
    config.write_text("strategy_params: {H: 5}\n")
    assert "strategy_params: none of ddp has a parameter 'H'" in bad(
        capsys, *sweep, "--config", config, "--strategy", "ddp")
    assert not (tmp_path / "s").exists()  # nothing was started


def run_configs(rows):
    return {r["strategy"]: yaml.safe_load((Path(r["run_dir"]) / "config.yaml").read_text())
            for r in rows}


def given(config: dict, *names) -> dict:
    return {name: config["strategy_params"][name] for name in names}


def test_sweep_config_uses_the_files_fields_and_flags_override_them(tmp_path, capsys):
    example = REPO / "examples" / "diloco.yaml"
    shrink = ["--steps", "4", "--nodes", "2", *SMALL_GPT_FLAGS, "--no-progress", "--no-plots"]
    main(["sweep", "--config", example, *shrink, "--out", str(tmp_path / "file")])
    (folder,) = (tmp_path / "file").glob("*-sweep")
    rows = json.loads((folder / "sweep.json").read_text())
    assert [(r["strategy"], r["net"], r["source"]) for r in rows] == [
        ("diloco", "wan-100mbps", "run")]
    config = run_configs(rows)["diloco"]
    # (config.yaml records every parameter, those not given at their defaults)
    assert given(config, "H", "outer_lr", "outer_momentum") == {"H": 25, "outer_lr": 0.7,
                                                                  "outer_momentum": 0.9}
    assert (config["nodes"], config["steps"], config["lr"]) == (2, 4, 0.003)
    assert config["compute"] == "fixed:100ms"
    assert math.isclose(rows[0]["simulated_seconds"], 4 * 0.1)  # H=25: no sync in 4 steps

    # The same file with a seed and an out: the sweep's seeds and folder; flags override the
    # strategy, the net and one of the strategy's parameters.
    edited = tmp_path / "diloco.yaml"
    edited.write_text(example.read_text() + f"seed: 3\nout: {tmp_path / 'from-file'}\n")
    main(["sweep", "--config", edited, *shrink, "--strategy", "ddp,diloco", "--net",
          "wan-1gbps", "-p", "diloco.H=2"])
    (folder,) = (tmp_path / "from-file").glob("*-sweep")
    rows = json.loads((folder / "sweep.json").read_text())
    assert sorted((r["strategy"], r["net"], r["seed"]) for r in rows) == [
        ("ddp", "wan-1gbps", 3), ("diloco", "wan-1gbps", 3)]
    configs = run_configs(rows)
    assert "H" not in configs["ddp"]["strategy_params"]  # the file's H is diloco's, not ddp's
    assert given(configs["diloco"], "H", "outer_lr", "outer_momentum") == {
        "H": 2, "outer_lr": 0.7, "outer_momentum": 0.9}
    by = {r["strategy"]: r for r in rows}
    assert by["diloco"]["bytes_sent_per_node"] > 0  # it synced, at steps 2 and 4
    assert by["diloco"]["simulated_seconds"] > 4 * 0.1


def test_an_overlapped_sync_is_never_slower_than_the_same_bytes_sent_blocking(traces, tmp_path):
    """1e9 parameters on 100 Gbit/s, 40 ms: 153 buckets of 25 MiB one after another would
    pay 153 ring latencies; a real implementation sends the outer gradient in one all-reduce
    instead, so diloco takes exactly localsgd's time (same H, same bytes), not more."""
    net = network(tmp_path, "100gbit", "40ms")
    bandwidth, latency, params, step = 1e11 / 8, 0.040, 1e9, 0.5
    projection = Projection(params, step)
    blocking = step + ring_all_reduce(4 * params, 2, bandwidth, latency)
    streamed = streamed_step(step, 4 * params, 2, bandwidth, latency)
    assert streamed > blocking  # bucketing would turn the comparison upside down here
    diloco = project(traces["diloco"], net, projection)
    localsgd = project(traces["localsgd"], net, projection)
    assert diloco["bytes_sent_per_node"] == localsgd["bytes_sent_per_node"]
    for record in (diloco, localsgd):
        for duration, expected in zip(step_durations(record), [step, blocking] * 2, strict=True):
            assert math.isclose(duration, expected, rel_tol=1e-9), (duration, expected)
    assert diloco["simulated_seconds"] <= localsgd["simulated_seconds"]


def fragment_sizes(trace, fragments):
    n = trace["model_parameters"]  # the small gpt has no buffers: weights alone travel
    size = math.ceil(n / fragments)
    return [min(size, n - start) for start in range(0, n, size)]


def test_streaming_diloco_tau0_streams_each_fragment_through_its_steps_backward(
        traces, tmp_path):
    """H=4, 2 fragments, τ=0: fragment 0 syncs at steps 2 and 6, fragment 1 at 4 and 8, each
    waited for in its step; projected, each fragment's all-reduce goes out in 100 MiB buckets
    through that step's backward pass, as the paper's simulator overlaps it."""
    trace = traces["streaming-tau0"]
    assert trace["overlapped_outer_sync"]
    net = network(tmp_path, "1gbit", "40ms")
    bandwidth, latency, params, step = 1e9 / 8, 0.040, 2e8, 1.0
    ratio = params / trace["model_parameters"]
    sizes = [4 * m * ratio for m in fragment_sizes(trace, 2)]
    synced = {2: sizes[0], 6: sizes[0], 4: sizes[1], 8: sizes[1]}
    expected = [streamed_step(step, synced[s], 2, bandwidth, latency, 100 * MIB)
                if s in synced else step for s in range(1, 9)]
    for s, nbytes in synced.items():  # the overlap pays off here: 4 buckets
        assert expected[s - 1] < step + ring_all_reduce(nbytes, 2, bandwidth, latency)
    record = project(trace, net, Projection(params, step, bucket_mb=100))
    for duration, want in zip(step_durations(record), expected, strict=True):
        assert math.isclose(duration, want, rel_tol=1e-6), (duration, want)
    check_clocks_add_up(record)


def test_streaming_diloco_tau1_sends_its_buckets_during_the_backward_pass(traces, tmp_path):
    """τ=1: a fragment's buckets go out as the backward pass makes them ready and are waited
    for a step later. On a link where one fragment (4e8 bytes) takes 3.28 s to all-reduce,
    three steps, that earlier start saves time against sending it after the compute, and
    the run still computes every step in full."""
    from exoframe.sim.traces.projection import project as project_traces
    from exoframe.sim.traces.replay import replay
    trace = traces["streaming-tau1"]
    net = network(tmp_path, "1gbit", "40ms")
    sim = resolve_sim(net, "measured", "", 2, get_plugin_manager())
    ratio = 2e8 / trace["model_parameters"]

    def total(overlapped):
        ranks = project_traces(trace["ranks"], ratio, 1.0, overlapped_sync=overlapped,
                               bucket_bytes=100 * MIB)
        return replay(ranks, sim.topology, sim.algorithms).simulated_seconds

    overlapped, after = total(True), total(False)
    assert 8.0 < overlapped < after
    assert project(trace, net, Projection(2e8, 1.0, bucket_mb=100))["simulated_seconds"] \
        == pytest.approx(overlapped, rel=1e-12)


def test_projections_at_the_papers_scale_follow_the_rule_computed_step_by_step(tmp_path):
    """benchmarks/paper_table4.py's comparison with Streaming DiLoCo's Table 4 rests on the
    projection following its documented rule; here the projected utilization of a 1B model
    (24 layers, 0.1 s steps, bf16, one-layer buckets) equals the rule computed step by step
    without exoframe (`rule_utilization`) for DP, DiLoCo H=100 and streaming DiLoCo with 8
    fragments, blocking (τ=0) and overlapped (τ=1), on ideal links at three bandwidths. The
    compared times are simulated."""
    import sys
    sys.path.insert(0, str(REPO / "benchmarks"))
    import paper_table4 as table

    parameters, layers, step = table.SCALES["1B"]
    for method in list(table.METHODS)[:4]:  # the FP4 row differs by its payload bits only
        strategy, params, steps = table.setting("1B", method, table.H)
        trace = table.train(strategy, params, steps)
        projection = table.projection_for("1B", method, trace)
        for gbit in (0.8, 20.0, 300.0):  # the link busy all the time, often, rarely
            sim = table.two_nodes_at(tmp_path, gbit, "none")
            projected = replay_trace(trace, sim, projection)["compute_utilization"]
            rule = table.rule_utilization(parameters, layers, step, 16, method, steps, gbit)
            assert projected == pytest.approx(rule, rel=1e-9), (method, gbit)
            assert projected < 0.999 or gbit == 300.0  # each compared where it stalls
