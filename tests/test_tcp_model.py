"""The network model under `protocol: tcp` (exoframe/sim/network/tcp.py, also a network file that
leaves protocol out) against closed forms derived here from TCP's mechanics, and
`protocol: none` against the exact alpha-beta model."""
import json
import math
import sys
from dataclasses import asdict
from pathlib import Path

import pytest

from test_maxmin import deliveries

from exoframe.errors import ExoframeError
from exoframe.sim.network.netconfig import NetConfig
from exoframe.sim.network.tcp import TcpModel

GBIT = 1e9 / 8


def topology(n=2, **keys):
    return NetConfig.from_dict(keys, "test", "test.yaml").validate().topology(n)


def close(a, b, rel=1e-9):
    return abs(a - b) <= rel * max(abs(a), abs(b))


def test_the_window_caps_a_long_fast_link_at_window_over_the_round_trip():
    # 1 Gbit/s, 50 ms one way, a 64 KiB window: at most 64 KiB per 100 ms round trip,
    # 655,360 B/s, far below the link's 1e9/8 / (1514/1448) of payload.
    window, latency, size = 64 * 1024, 0.050, 10e6
    net = topology(bandwidth="1gbit", latency="50ms", protocol={"window": "64KiB"})
    rate = window / (2 * latency)
    assert rate < GBIT / (1514 / 1448)
    [done] = deliveries(net, [(0.0, 0, 1, size)])
    # slow start first: 10, 20, 40 segments in the first three round trips, then the window
    ramp = 1448 * (10 + 20 + 40)
    assert close(done, 3 * 2 * latency + (size - ramp) / rate + latency)  # 15.45 s


@pytest.mark.parametrize("congestion,restarts", [("cubic", True), ("reno", True),
                                                 ("bbr", False)])
def test_slow_start_on_a_new_connection_and_again_after_an_idle_timeout(congestion, restarts):
    """100 Mbit/s, 25 ms one way: a new connection's window starts at 10 segments and
    doubles every round trip; a second message soon after keeps the window reached (BBR:
    paces at 2.885 x the rate it measured, above the link's here); one after an idle longer
    than the retransmission timeout (RTT + 200 ms) starts again from the window halved for
    each timeout, at least 10 segments (cubic, reno; BBR is exempt)."""
    net = topology(bandwidth="100mbit", latency="25ms", protocol={"congestion": congestion})
    tcp, rtt, B = net.protocol, 0.05, 100e6 / 8 / (1514 / 1448)  # payload bytes/s
    segment = 1448
    # the first message: 10, 20, 40, ... segments per round trip while below B x RTT (BBR's
    # start-up doubles its delivery rate as well)
    rates = tcp.ramp(10 * segment / rtt, rtt, B)
    assert rates == pytest.approx([10 * segment * 2 ** k / rtt
                                   for k in range(len(rates))], rel=1e-12)
    size = 2e6
    sent = sum(r * rtt for r in rates)
    first = len(rates) * rtt + (size - sent) / B + 0.025
    [alone] = deliveries(net, [(0.0, 0, 1, size)])
    assert close(alone, first)
    # a second message right after the first (idle 0): no ramp
    at_once = deliveries(net, [(0.0, 0, 1, size), (first, 0, 1, size)])
    assert close(at_once[1], first + size / B + 0.025)
    # after 1 s idle (3 timeouts of 0.25 s): from max(10 segments, window / 8), or not
    later = deliveries(net, [(0.0, 0, 1, size), (first + 1.0, 0, 1, size)])
    if restarts:
        assert later[1] > first + 1.0 + size / B + 0.025 + rtt / 2
    else:
        assert close(later[1], first + 1.0 + size / B + 0.025)


def test_one_flow_pays_the_frame_headers_and_a_ring_pays_the_acks_coming_back():
    # A 1448-byte segment in a 1514-byte frame; with no latency no window applies.
    net = topology(bandwidth="100mbit", protocol="tcp")
    B, size = 100e6 / 8, 5e6
    [alone] = deliveries(net, [(0.0, 0, 1, size)])
    assert close(alone, size * 1514 / 1448 / B)
    # 0 -> 1 and 1 -> 0 at once: each uplink carries one flow's frames and the other's
    # ACKs, 66 bytes every 2.5 segments.
    both = deliveries(net, [(0.0, 0, 1, size), (0.0, 1, 0, size)])
    per_byte = 1514 / 1448 + 66 / (2.5 * 1448)
    assert all(close(t, size * per_byte / B) for t in both)


def test_two_flows_through_one_bottleneck_get_its_shared_efficiency():
    # Two sites, 1 Gbit/s NICs, 50 Mbit/s between: 0 -> 1 and 2 -> 3 cross the same
    # direction of the site link (no flow comes back, so no ACK shares it).
    net = topology(4, bandwidth="1gbit", protocol={"shared_efficiency": 0.8},
                   sites={"a": {"ranks": [0, 2]}, "b": {"ranks": [1, 3]}},
                   links=[{"between": ["a", "b"], "bandwidth": "50mbit"}])
    size, wan = 2e6, 50e6 / 8
    first, second = deliveries(net, [(0.0, 0, 1, size), (0.0, 2, 3, 2 * size)])
    # Both at 0.8 * wan / 2 (in frames) until the first ends; then the second alone, at
    # the whole link.
    shared = 0.8 * wan / 2 / (1514 / 1448)
    assert close(first, size / shared)
    assert close(second, first + (2 * size - size) / (wan / (1514 / 1448)))


def test_protocol_none_is_the_exact_alpha_beta_model():
    net = topology(bandwidth="100mbit", latency="10ms", protocol="none")
    assert net.protocol is None
    both = deliveries(net, [(0.0, 0, 1, 5e6), (0.0, 1, 0, 5e6)])
    assert both == [5e6 / (100e6 / 8) + 0.010] * 2


def test_a_network_file_without_protocol_gets_the_presets_tcp_model(tmp_path):
    from exoframe.plugins import Registry
    from exoframe.sim.network.netconfig import load_network

    path = tmp_path / "mine.yaml"
    path.write_text("bandwidth: 100mbit\n")  # (no round trip: no slow start)
    net = load_network(str(path), Registry("networks")).topology(2)
    assert net.protocol == TcpModel()
    both = deliveries(net, [(0.0, 0, 1, 5e6), (0.0, 1, 0, 5e6)])
    per_byte = 1514 / 1448 + 66 / (2.5 * 1448)
    assert all(close(t, 5e6 * per_byte / (100e6 / 8)) for t in both)
    # `protocol:` with nothing after it is not a way to say none: one line says what is.
    path.write_text("bandwidth: 100mbit\nprotocol:\n")
    with pytest.raises(ExoframeError, match=r"^\S*mine.yaml: protocol: expected none, tcp "
                                            r"or a dict like \{window: 64KiB\}, got None.$"):
        load_network(str(path), Registry("networks"))


@pytest.mark.parametrize("protocol, says", [
    ("tpc", "expected none, tcp or a dict"),
    ({"windw": 1}, "protocol.windw: unknown key"),
    ({"window": "lots"}, "protocol.window: expected a positive number"),
    ({"shared_efficiency": 1.5}, "protocol.shared_efficiency: at most 1"),
    ({"mtu": 40}, "protocol.mtu: 40 leaves no payload")])
def test_a_bad_protocol_is_one_line_naming_the_field(protocol, says):
    with pytest.raises(ExoframeError, match=says):
        NetConfig.from_dict({"bandwidth": "1gbit", "protocol": protocol}, "t",
                            "t.yaml").validate()


def test_presets_of_real_networks_model_tcp_and_ideal_does_not():
    from exoframe.plugins import get_plugin_manager
    from exoframe.sim.network.netconfig import load_network

    networks = get_plugin_manager().networks
    for name in ("wan-100mbps", "lan-1gbps", "geo-2dc", "home-broadband"):
        assert load_network(name, networks).topology(2).protocol is not None, name
    for entry in networks:  # each TCP preset states its queue and loss
        net = load_network(entry.name, networks)
        assert net.defaults_taken() == [], entry.name
    for name in ("ideal", "nvlink", "dc-100gbps"):
        assert load_network(name, networks).topology(2).protocol is None, name
    assert math.isinf(load_network("ideal", networks).topology(2).uplink[0])


def test_the_emulated_benchmarks_held_out_cases_are_apart_from_those_fitted_on():
    """benchmarks/emulated_network.py checks the model's measured constants on cases that
    were not used to fit them: at least 12 runs (ddp and diloco), each differing from every
    fitted case in its network, payload size, step count or congestion control, and the
    held-out set covers each of those kinds of difference."""
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
    import emulated_network

    cases = emulated_network.cases(4).values()
    fit = [c for c in cases if not c.held_out]
    held_out = [c for c in cases if c.held_out]

    def setup(case):
        return (repr(case.network), case.seconds_per_exchange, case.steps, case.congestion)
    fitted = {setup(c) for c in fit}
    assert not {setup(c) for c in held_out} & fitted
    assert len(held_out) * len(("ddp", "diloco")) >= 12
    assert {"ddp", "diloco"} <= set(emulated_network.STRATEGIES)
    networks = {repr(c.network) for c in fit}
    assert any(repr(c.network) not in networks for c in held_out)  # layouts, bandwidths
    # payload sizes (a case's seconds_per_exchange sizes its model: a parameter, not a timing)
    assert any(c.seconds_per_exchange not in {f.seconds_per_exchange for f in fit}
               for c in held_out)
    assert any(c.steps is not None for c in held_out)  # step counts
    assert any(c.congestion == "cubic" for c in held_out)


def test_fit_tcp_model_rescales_as_the_simulator_and_recovers_the_constants(tmp_path):
    """benchmarks/fit_tcp_model.py refits segments_per_ack (on the stars) and
    shared_efficiency (on shared links) from emulated runs, by rescaling each row's simulated
    communication. The rescaling is checked against the simulator (a ring's flows on a
    star, and across two sites whose link two of them share), and the fit recovers the
    constants that made two files of rows simulated with other constants."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
    import fit_tcp_model as fitting

    used, truth = (TcpModel(segments_per_ack=2.2, shared_efficiency=0.93),
                   TcpModel(segments_per_ack=3.0, shared_efficiency=0.85))
    ring = [(0.0, r, (r + 1) % 4, 4e6) for r in range(4)]
    two_sites = dict(bandwidth="1gbit", sites={"a": {"ranks": [0, 2]}, "b": {"ranks": [1, 3]}},
                     links=[{"between": ["a", "b"], "bandwidth": "50mbit"}])
    for keys, shared in ((dict(bandwidth="100mbit"), False), (two_sites, True)):
        assert fitting.site_link_flows(keys, 4) == (2 if shared else 0)
        before, after = (max(deliveries(topology(4, protocol=asdict(model), **keys), ring))
                         for model in (used, truth))
        row = {"case": "x", "real": after, "simulated": before, "comm_share": 1.0}
        assert close(fitting.rescaled_ratio(row, shared, used, truth), 1.0)

    def made_by_truth(names, shared):
        rows = []
        for i, name in enumerate(names):
            simulated, comm = 3.0 + i, 0.8 + 0.05 * i
            factor = (1514 + 66 / 3.0) / (1514 + 66 / 2.2) * (0.93 / 0.85 if shared else 1)
            rows.append({"case": name, "simulated": simulated, "comm_share": comm,
                         "real": simulated * (comm * factor + 1 - comm)})
        return rows

    (tmp_path / "a.json").write_text(json.dumps(
        made_by_truth(["star-20mbit ddp", "star-100mbit diloco"], False)
        + made_by_truth(["sites-2flows ddp"], True)))
    (tmp_path / "b.json").write_text(json.dumps(
        made_by_truth(["sites-1flow ddp"], False)
        + made_by_truth(["sites-2flows-cubic diloco"], True)))
    runs = [fitting.load(f"{tmp_path / name}:segments_per_ack=2.2,shared_efficiency=0.93", 4)
            for name in ("a.json", "b.json")]
    assert [sorted(case for case, yes in one.star.items() if yes) for one in runs] == \
        [["star-100mbit diloco", "star-20mbit ddp"], []]
    assert [sorted(case for case, yes in one.shared.items() if yes) for one in runs] == \
        [["sites-2flows ddp"], ["sites-2flows-cubic diloco"]]
    best = fitting.fit(runs, TcpModel())
    assert (best.segments_per_ack, best.shared_efficiency) == (3.0, 0.85)
    # Rows that record their twins' model (emulated_network.py's "tcp") need no spec.
    recorded = [{**row, "tcp": asdict(used)} for row in runs[0].rows]
    (tmp_path / "c.json").write_text(json.dumps(recorded))
    assert fitting.load(str(tmp_path / "c.json"), 4).simulated_with == used
    assert all(close(x, 1.0) for x in fitting.ratios(runs, best))


def test_bbr_paces_a_connection_of_small_messages_at_what_it_measured():
    """BBR's estimate is the delivery rate of a burst (what the connection sent without a
    pause, over that time and the first byte's round trip); it then paces at 2/ln 2 of it,
    so small messages with pauses between them stay slower than the link (as `ss` shows
    on the emulation: 5 Mbit/s measured, 14.4 Mbit/s paced for 19 KB segments at 50 ms)."""
    tcp, rtt = TcpModel(congestion="bbr"), 0.05
    first = tcp.after(None, began=0.0, now=0.010, size=19e3, start_rate=1e6,
                      reached_rate=1e6, rtt=rtt)
    assert first.bandwidth == pytest.approx(19e3 / (0.010 + rtt))
    behind = tcp.after(first, began=0.010, now=0.020, size=19e3, start_rate=1e6,
                       reached_rate=1e6, rtt=rtt)  # right behind it: one burst
    assert (behind.burst_start, behind.burst) == (0.0, 38e3)
    assert behind.bandwidth == pytest.approx(38e3 / (0.020 + rtt))
    later = tcp.after(behind, began=0.5, now=0.51, size=19e3, start_rate=1e6,
                      reached_rate=1e6, rtt=rtt)  # after a pause: a burst of its own
    assert later.burst == 19e3 and later.bandwidth == behind.bandwidth  # (the larger kept)
    assert tcp.start_rate(later, 1.0, rtt) == pytest.approx(2 / math.log(2) * 38e3 / 0.070)
    assert tcp.start_rate(None, 0.0, rtt) == 10 * 1448 / rtt  # a new connection


def test_a_lossy_path_delays_a_messages_end_by_its_expected_tail_repair():
    """0.1 % loss, 100 Mbit/s, 25 ms one way, BBR (which does not slow down for loss): a
    message ends later by the chance that its last window (bandwidth x RTT, 432 segments
    here) lost a packet, times the round trip the repair takes; the lost bytes go again."""
    net = topology(bandwidth="100mbit", latency="25ms", loss="0.1%",
                   protocol={"congestion": "bbr", "initial_window": 10 ** 6})
    tcp, rtt, B = net.protocol, 0.05, 100e6 / 8
    payload = B / tcp.data_factor
    window = payload * rtt / tcp.mss
    repair = (1 - 0.999 ** window) * rtt
    [done] = deliveries(net, [(0.0, 0, 1, 4e6)])
    assert close(done, 4e6 / (payload * 0.999) + 0.025 + repair)
    # a message smaller than the window: only its own packets can be lost at its tail
    [small] = deliveries(net, [(0.0, 0, 1, 20 * 1448)])
    assert close(small, 20 * 1448 / (payload * 0.999) + 0.025 + (1 - 0.999 ** 20) * rtt)


@pytest.mark.parametrize("congestion", ["cubic", "reno"])
def test_random_loss_holds_a_loss_based_flow_to_padhyes_response_function(congestion):
    """1 % loss, 20 Mbit/s, 5 ms one way: a loss-based congestion control, from its
    connection's first expected loss on (100 packets), moves Padhye et al.'s
    1 / (RTT sqrt(2p/3) + T0 min(1, 3 sqrt(3p/8)) p (1 + 32 p^2)) packets a second, with
    T0 = RTT + 200 ms, written out here (CUBIC's cubic window, 1.05 segments at this
    round trip, is below Reno's): 9.6 Mbit/s of payload, under half the link; BBR is not
    held back."""
    p, rtt = 0.01, 0.01
    rate = 1448 / (rtt * math.sqrt(2 * p / 3) + (rtt + 0.2) * 3 * math.sqrt(3 * p / 8) * p
                   * (1 + 32 * p * p))
    assert rate * 8 == pytest.approx(9.63e6, rel=1e-3)
    keys = dict(bandwidth="20mbit", latency="5ms", loss="1%")
    net = topology(**keys, protocol={"congestion": congestion, "initial_window": 10 ** 6})
    tcp = net.protocol
    assert tcp.loss_cap(rtt, p) == pytest.approx(rate)
    first = 200 * 1448  # past the first expected loss: the next message is held
    second = 2e6
    done = deliveries(net, [(0.0, 0, 1, first), (10.0, 0, 1, second)])
    repair = (1 - (1 - p) ** (rate * rtt / (1 - p) / 1448)) * rtt  # its last window's loss
    assert close(done[1], 10.0 + second / rate + 0.005 + repair)
    bbr = topology(**keys, protocol={"congestion": "bbr", "initial_window": 10 ** 6})
    assert bbr.protocol.loss_cap(rtt, p) == math.inf
    [alone] = deliveries(bbr, [(0.0, 0, 1, second)])
    assert alone < 10.0 + second / rate / 2


def two_sites(queue, congestion="cubic", ranks_a=1):
    """Site a (ranks 0..ranks_a-1) and site b (the next rank), 1 Gbit/s NICs, 50 Mbit/s
    and 25 ms between them through a port queued as `queue`."""
    keys = dict(bandwidth="1gbit", sites={"a": {"ranks": list(range(ranks_a))},
                                          "b": {"ranks": [ranks_a]}},
                links=[{"between": ["a", "b"], "bandwidth": "50mbit", "latency": "25ms",
                        "queue": queue}],
                protocol={"congestion": congestion, "initial_window": 10 ** 6})
    return topology(ranks_a + 1, **keys)


def test_a_fifo_between_sites_holds_a_loss_based_flow_to_the_burst_it_absorbs():
    """A loss-based flow bursts its window at its NIC's 1 Gbit/s into the 50 Mbit/s port:
    a burst over depth / (1 - C / R) bytes overflows a FIFO of that depth. The window grows
    up to that; from its first loss on (a message that large, burst whole), CUBIC's
    window falls to 0.7 of it at each loss, so
    it holds 0.85 of it on average (the emulation's `ss` showed 77-80 segments against 74
    for a 20 ms FIFO). Alone a flow moves its window every 50 ms round trip. Both ways at
    once, every round trip's ACKs wait in the other direction's port behind the rest of
    its burst, window / C - 25 ms: at 100 ms depth the round trip grows to about 115 ms
    (`ss`: 104-111 ms). A notice crossing the port waits as long. BBR, which paces, and a
    fair queue are timed as before."""
    C, R, d, size = 50e6 / 8, 1e9 / 8, 0.025, 4e6
    fifo20 = two_sites("fifo 20ms")
    df = fifo20.protocol.data_factor
    limit = 0.020 * C / (1 - C / R)  # bytes on the wire
    assert 0.85 * limit / 1514 == pytest.approx(73.9, abs=0.1)
    first, second = deliveries(fifo20, [(0.0, 0, 1, size), (10.0, 0, 1, size)])
    assert close(first, size / (limit / df / (2 * d)) + d)  # up to the limit, then a loss
    assert close(second, 10.0 + size / (0.85 * limit / df / (2 * d)) + d)  # sawing
    # messages smaller than the limit burst no more than themselves: no loss, no sawing
    small = 0.5 * limit / df
    *_, big = deliveries(fifo20, [(0.0, 0, 1, small), (1.0, 0, 1, small), (2.0, 0, 1, size)])
    assert close(big, 2.0 + size / (limit / df / (2 * d)) + d)

    fifo100 = two_sites("fifo 100ms", ranks_a=2)
    window = 0.85 * min(0.1 * C / (1 - C / R), 0.1 * C + C * 2 * d)
    wait = window / C - d
    rate = window / df / (2 * d + wait)
    assert rate < C / df and 2 * d + wait == pytest.approx(0.1145, abs=1e-3)
    both = deliveries(fifo100, [(0.0, 0, 2, size), (0.0, 2, 0, size),  # (the first loss)
                                (10.0, 0, 2, size), (10.0, 2, 0, size),
                                (10.5, 1, 2, 0.0)])  # a notice from site a at 10.5 s
    assert close(both[2], 10.0 + size / rate + d) and close(both[3], both[2])
    assert close(both[4], 10.5 + d + wait)

    for net in (two_sites("fair", ranks_a=2), two_sites("fifo 100ms", "bbr", ranks_a=2)):
        full = deliveries(net, [(0.0, 0, 2, size), (0.0, 2, 0, size), (10.0, 0, 2, size),
                                (10.0, 2, 0, size), (10.5, 1, 2, 0.0)])
        assert full[2] - 10.0 < (both[2] - 10.0) / 1.2 and close(full[4], 10.5 + d)
