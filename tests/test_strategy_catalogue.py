"""The strategy catalogue (issue 5) against references computed another way, with real rank
processes: equivalences to the classic strategies, byte counts against their closed forms,
and asynchronous Local SGD's staleness under stragglers."""
import dataclasses
import math

import pytest

import exoframe
from exoframe.errors import ExoframeError
from exoframe.plugins import PluginManager
from test_equivalence import SHARD, fit, fresh_model, max_diff, per_rank

N_PARAMS = sum(p.numel() for p in fresh_model().parameters())  # 6·16 + 16 + 16 + 1 = 129
SLOW_NET = "bandwidth: 10mbit\nlatency: 20ms\nprotocol: none\n"  # closed forms: alpha-beta


def ring_all_reduce(n, nbytes):
    return round(2 * (n - 1) / n * nbytes)


def fit_timed(strategy, nodes, steps, compute, net="ideal", stragglers="", **params):
    """fit() under a network, a compute model and stragglers."""
    trainer = exoframe.Trainer(fresh_model(), per_rank, batch_size=SHARD)
    return trainer.fit(strategy=strategy, num_nodes=nodes, steps=steps, optimizer="adamw",
                       lr=0.01, strategy_params=params, eval_every=1000, net=net,
                       compute=compute, stragglers=stragglers)


def bytes_per_step(result):
    """Bytes sent per node at each step (the metrics rows are cumulative)."""
    totals = [0] + [row["bytes_sent_per_node"] for row in result.metrics]
    return [b - a for a, b in zip(totals, totals[1:])]


# -- exact equivalences -------------------------------------------------------------------------

DILOCO = dict(steps=9, optimizer="adamw", lr=0.01, H=3)


def test_streaming_diloco_with_one_fragment_no_overlap_no_mixing_equals_diloco():
    streaming = fit("streaming-diloco", 4, fragments=1, tau=0, alpha=0.0, bits=32, **DILOCO)
    diloco = fit("diloco", 4, **DILOCO)
    assert max_diff(streaming.model, diloco.model) == 0
    assert max_diff(diloco.model, fresh_model()) > 1e-2


def test_sparta_diloco_with_p0_equals_diloco():
    sparta_diloco = fit("sparta-diloco", 4, p=0.0, **DILOCO)
    assert max_diff(sparta_diloco.model, fit("diloco", 4, **DILOCO).model) == 0
    assert sparta_diloco.summary["bytes_sent_per_node"] == 3 * ring_all_reduce(4, 4 * N_PARAMS)


def test_topk_ef_keeping_every_entry_equals_ddp():
    topk = fit("topk-ef", 4, k_fraction=1.0)
    assert max_diff(topk.model, fit("ddp", 4).model) < 1e-6
    assert max_diff(topk.model, fresh_model()) > 1e-2


def test_gossip_on_the_complete_graph_equals_localsgd_h1():
    gossip = fit("gossip", 4, graph="complete")
    assert max_diff(gossip.model, fit("localsgd", 4, H=1).model) < 1e-6
    assert max_diff(gossip.model, fresh_model()) > 1e-2


def test_compressed_strategies_train_and_differ_from_ddp():
    ddp = fit("ddp", 2).model
    for name, params in (("topk-ef", {"k_fraction": 0.1}), ("randomk-ef", {"k_fraction": 0.1}),
                         ("powersgd", {"rank": 1})):
        model = fit(name, 2, **params).model
        assert 1e-4 < max_diff(model, ddp) and max_diff(model, fresh_model()) > 1e-2, name


# -- bytes against closed forms -------------------------------------------------------------------

def test_topk_ef_bytes_are_values_plus_indices_of_every_other_rank():
    n, k = 4, math.ceil(0.1 * N_PARAMS)  # 13 entries of 4-byte values and 4-byte indices
    summary = fit("topk-ef", n, k_fraction=0.1).summary
    assert summary["bytes_sent_per_node_per_step"] == 8 * k * (n - 1)
    assert summary["bytes_sent_per_rank"] == [10 * 8 * k * (n - 1)] * n


def test_randomk_ef_bytes_are_k_values_and_no_indices():
    n, k = 4, math.ceil(0.1 * N_PARAMS)
    summary = fit("randomk-ef", n, k_fraction=0.1).summary
    assert summary["bytes_sent_per_node_per_step"] == ring_all_reduce(n, 4 * k)


def test_powersgd_bytes_are_the_low_rank_factors_and_the_vectors():
    n = 4
    # weights 16×6 (rank 2) and 1×16 (rank min(2, 1) = 1); biases 16 and 1, uncompressed
    p_values, q_values, vector_values = 16 * 2 + 1 * 1, 6 * 2 + 16 * 1, 16 + 1
    expected = sum(ring_all_reduce(n, 4 * v) for v in (p_values, q_values, vector_values))
    assert fit("powersgd", n, rank=2).summary["bytes_sent_per_node_per_step"] == expected


@pytest.mark.parametrize("bits,value_bytes", [(32, 4 * 43), (4, 43 // 2 + 1 + 4)])
def test_streaming_diloco_peak_and_average_bytes(bits, value_bytes):
    # 129 values in 3 fragments of 43; H = 6 syncs one fragment at steps 2, 4 and 6 of a
    # round. 4-bit: 43 values pack into 22 bytes, plus a 4-byte scale.
    n, H = 4, 6
    result = fit("streaming-diloco", n, steps=12, H=H, fragments=3, tau=2, alpha=0.5, bits=bits)
    per_sync = ring_all_reduce(n, value_bytes)
    assert bytes_per_step(result) == [0, per_sync] * 6
    assert max(bytes_per_step(result)) == per_sync  # the peak
    assert result.summary["bytes_sent_per_node_per_step"] == 3 * per_sync / H  # the average


@pytest.mark.parametrize("graph,degree", [("ring", 2), ("complete", 3)])
def test_gossip_bytes_are_one_model_per_neighbour(graph, degree):
    summary = fit("gossip", 4, graph=graph, H=2).summary
    assert summary["bytes_sent_per_node_per_step"] == degree * 4 * N_PARAMS / 2


def test_gossip_on_a_random_graph_and_noloco_pairs_send_only_to_their_peers():
    gossip = fit("gossip", 4, graph="random", edge_prob=0.5).summary
    per_rank = [b // (10 * 4 * N_PARAMS) for b in gossip["bytes_sent_per_rank"]]
    assert all(1 <= d <= 3 for d in per_rank) and sum(per_rank) % 2 == 0  # degrees of a graph
    noloco = fit("noloco", 4, steps=8, H=2).summary
    assert noloco["bytes_sent_per_rank"] == [4 * 8 * N_PARAMS] * 4  # 4 rounds, Δ and φ each


# -- asynchronous Local SGD -----------------------------------------------------------------------

def test_async_localsgd_without_stragglers_on_an_ideal_net_is_synchronous_diloco():
    asynchronous = fit_timed("async-localsgd", 3, steps=8, compute="fixed:10ms", H=2)
    diloco = fit_timed("diloco", 3, steps=8, compute="fixed:10ms", H=2)
    assert max_diff(asynchronous.model, diloco.model) < 1e-6
    assert max_diff(diloco.model, fresh_model()) > 1e-2
    assert asynchronous.metrics[-1]["mean_staleness"] == 0
    assert asynchronous.summary["simulated_seconds"] == pytest.approx(8 * 0.01)


def test_async_localsgd_straggler_raises_staleness_and_finishes_before_localsgd(tmp_path):
    net = tmp_path / "slow.yaml"
    net.write_text(SLOW_NET)
    run = dict(steps=16, H=2, compute="fixed:50ms", net=str(net))
    balanced = fit_timed("async-localsgd", 3, **run)
    straggler = fit_timed("async-localsgd", 3, stragglers="1:4", **run)
    localsgd = fit_timed("localsgd", 3, stragglers="1:4", **run)
    assert straggler.metrics[-1]["mean_staleness"] > balanced.metrics[-1]["mean_staleness"]
    assert straggler.metrics[-1]["max_staleness"] >= 6  # 3 rounds of the 2 fast ranks
    # localsgd: every round waits for rank 1, then pays an exposed all-reduce; async
    # overlaps rank 1's pushes with its compute, leaving only the last round trip.
    assert straggler.summary["simulated_seconds"] < localsgd.summary["simulated_seconds"] - 0.1
    assert straggler.summary["simulated_seconds"] >= 16 * 4 * 0.05
    assert max_diff(straggler.model, balanced.model) > 1e-4  # staleness changes the numbers


# -- parameters and registration ------------------------------------------------------------------

@pytest.mark.parametrize("name,params,message", [
    ("streaming-diloco", {"H": 6, "tau": 6}, "'tau' must be in [0, H)"),
    ("streaming-diloco", {"bits": 3}, "'bits' must be one of 4, 8, 16, 32"),
    ("streaming-diloco", {"H": 2, "fragments": 3}, "must not exceed H"),
    ("streaming-diloco", {"alpha": 1.5}, "'alpha' must be in [0, 1]"),
    ("sparta-diloco", {"p": -0.1}, "'p' must be in [0, 1]"),
    ("topk-ef", {"k_fraction": 0.0}, "'k_fraction' must be positive"),
    ("randomk-ef", {"k_fraction": 2.0}, "'k_fraction' must be in [0, 1]"),
    ("powersgd", {"rank": 0}, "'rank' must be positive"),
    ("gossip", {"graph": "star"}, "'graph' must be one of ring, complete, random"),
    ("noloco", {"gamma": 2.0}, "'gamma' must be in [0, 1]"),
    ("async-localsgd", {"nesterov_period": -1}, "'nesterov_period' must be 0"),
    ("sparseloco", {"topk": 65, "chunk": 8}, "'topk' (65) must not exceed 'chunk'² (64)"),
    ("sparseloco", {"layout": "flat", "topk": 65, "chunk": 64},
     "'topk' (65) must not exceed 'chunk' (64)"),
    ("sparseloco", {"layout": "tile"}, "'layout' must be one of tiles, flat, got 'tile'"),
    ("sparseloco", {"ef_decay": 1.5}, "'ef_decay' must be in [0, 1]"),
    ("eager-diloco", {"quantizer": "fp3"}, "'quantizer' must be one of"),
    ("desloc", {"Kv": 0}, "'Kv' must be positive"),
    ("hier-diloco", {"H": 0}, "'H' must be positive"),
    ("halos", {"alpha": 2.0}, "'alpha' must be in [0, 1]"),
])
def test_bad_parameters_are_named(name, params, message):
    strategy = PluginManager(load_entry_points=False).strategies.get(name).obj
    with pytest.raises(ExoframeError, match="parameter") as e:
        strategy.parse_params(params, name)
    assert message in str(e.value)


def test_only_the_asynchronous_strategies_depend_on_timing():
    strategies = {e.name: e.obj for e in PluginManager(load_entry_points=False).strategies}
    assert {"streaming-diloco", "sparta-diloco", "topk-ef", "randomk-ef", "powersgd", "gossip",
            "noloco", "async-localsgd", "param-server", "sparseloco", "eager-diloco", "desloc",
            "hier-diloco", "halos"} <= set(strategies)
    assert [n for n, s in strategies.items() if s.traits.timing_dependent] == ["async-localsgd",
                                                                         "halos",
                                                                         "param-server"]


def test_every_built_in_strategy_is_exported_by_its_class_name():
    from exoframe.builtins import STRATEGIES

    for name, target in STRATEGIES.items():
        module, class_name = target.split(":")
        assert class_name in exoframe.strategies.__all__, name
        assert getattr(exoframe.strategies, class_name).__module__ == module


def test_a_strategy_declares_itself_in_its_traits_not_in_loose_flags():
    from exoframe.strategies import DiLoCo, Strategy, Traits

    with pytest.raises(ExoframeError, match=r"strategy Loose sets `survives_failures = \.\.\.` "
                                            r"on its class: declare it in its traits"):
        class Loose(Strategy):
            survives_failures = True

    class Inherits(DiLoCo):
        pass

    class Changes(DiLoCo):
        traits = dataclasses.replace(DiLoCo.traits, survives_failures=False)

    assert Inherits.traits == DiLoCo.traits and Inherits.traits.survives_failures
    assert not Changes.traits.survives_failures and Changes.traits.replicas_equal_after_sync
    assert Strategy.traits == Traits() and Traits().checkpointable
