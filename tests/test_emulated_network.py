"""The emulated-network benchmark's machinery (benchmarks/emulated_network.py), end to end on
its smallest case: 2 ranks in their own network namespaces on a tc-shaped 20 Mbit/s star,
under torchrun with --net real, and the simulated twin from the same description. Skipped
where namespaces cannot be made (not root, not Linux). The measured times are the
benchmark's to report; this test checks what must hold whatever the machine's load."""
import os
import subprocess
import sys
import time
import uuid

import pytest
from conftest import REPO, processes_with_marker

sys.path.insert(0, str(REPO / "benchmarks"))
import emulated_network  # noqa: E402
from exoframe.emulation.netns import (Emulation, EmulationError, EmulationOptions,  # noqa: E402
                   check_can_emulate, leftovers)
from exoframe.sim.network.topology import Queue  # noqa: E402


def can_emulate() -> str | None:
    try:
        check_can_emulate()
        with Emulation(f"p{os.getpid()}", [1e6], [1e6], [0], {}):
            pass
    except (EmulationError, OSError) as e:
        return str(e)
    return None


why_not = can_emulate()
needs_emulation = pytest.mark.skipif(why_not is not None,
                                     reason=f"no emulated network: {why_not}")


def test_an_unknown_queue_is_one_line():
    with pytest.raises(EmulationError, match=r"^port queue 'red': expected one of "
                                             r"acks-first, fifo\.$"):
        EmulationOptions(port_queue="red")


SEND = """
import socket, sys, time
kind, address, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
if kind == "udp":
    out = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    out.sendto(b"x", (address, 5001))  # its neighbour known first (ARP), then the burst
    time.sleep(0.5)
    for _ in range(count):
        out.sendto(b"x" * 1400, (address, 5001))
else:
    out = socket.create_connection((address, 5001))
    out.sendall(b"x" * count)
    out.shutdown(socket.SHUT_WR)
    out.recv(1)
"""
RECEIVE = """
import socket
server = socket.create_server(("0.0.0.0", 5001))
incoming, _ = server.accept()
while incoming.recv(1 << 20):
    pass
"""


@needs_emulation
def test_the_counters_see_what_the_queues_drop_and_tcp_resends():
    """What the model leaves out, counted: a burst of datagrams into a FIFO uplink of 64
    full frames (1 Mbit/s, so it hardly drains meanwhile) loses all but those; a CUBIC flow from
    a 1 Gbit/s uplink into an 8 Mbit/s downlink (a FIFO port of 64 frames) overflows it, and
    TCP resends. --port-queue acks-first queues the switch's ports as hosts'."""
    ranks = [f"u{os.getpid()}", f"v{os.getpid()}"]
    swapped = EmulationOptions(port_queue="acks-first")
    with Emulation(ranks[0], [125e3, 125e3], [125e3, 125e3], [0, 0], {}, None, swapped,
                   uplink_queue=[Queue("fifo", packets=64)] * 2) as emulation:
        before = emulation.counts()
        # ACK-sized packets first on the switch's ports only
        assert set(before.small) == {f"{emulation.switch}/p0", f"{emulation.switch}/p1"}
        assert sum(before.dropped.values()) == 0
        subprocess.run(["ip", "netns", "exec", emulation.rank_ns(0), sys.executable, "-c",
                        SEND, "udp", emulation.data_addr(1), "300"], check=True, timeout=60)
        # 300 frames of 1442 bytes: the queue holds 96,896 bytes (67 of them) and the bucket
        # passes 2, so 231 are dropped; fewer where the sender is descheduled long enough for
        # the queue to drain (one frame per 11.5 ms), a few more where the kernel's own
        # frames (ARP, IPv6 neighbour discovery) meet the full queue
        assert 150 <= sum((emulation.counts() - before).dropped.values()) <= 240
    with Emulation(ranks[1], [125e6, 125e6], [125e6, 1e6], [0, 0], {}, "cubic") as emulation:
        before = emulation.counts()
        server = subprocess.Popen(["ip", "netns", "exec", emulation.rank_ns(1),
                                   sys.executable, "-c", RECEIVE])
        try:
            for _ in range(50):  # until the receiver listens
                sent = subprocess.run(["ip", "netns", "exec", emulation.rank_ns(0),
                                       sys.executable, "-c", SEND, "tcp",
                                       emulation.data_addr(1), str(2 << 20)],
                                      capture_output=True, timeout=60)
                if sent.returncode == 0:
                    break
                time.sleep(0.1)
            assert sent.returncode == 0, sent.stderr
            server.wait(timeout=60)
        finally:
            server.kill()
            server.wait()
        counted = emulation.counts() - before
        assert sum(counted.dropped.values()) > 0
        assert counted.tcp["retransmitted"] > 0
    assert leftovers(ranks[0]) == leftovers(ranks[1]) == []


@needs_emulation
def test_the_smallest_emulated_case_trains_as_its_twin_and_leaves_nothing(tmp_path,
                                                                          monkeypatch):
    marker = f"EXOFRAME_TEST_{uuid.uuid4().hex}"
    monkeypatch.setenv(marker, "1")  # the agents and ranks inherit it
    monkeypatch.setitem(emulated_network.STRATEGIES, "ddp", (3, []))
    case = emulated_network.Case("tiny-star", emulated_network.star("20mbit"), 0.1)
    tag = f"t{os.getpid()}"
    result = emulated_network.run_case(case, "ddp", nodes=2, seed=0, protocol="tcp",
                                       workdir=str(tmp_path), tag=tag)
    # Same training, same bytes, on the real stack and in the simulator.
    assert result["same_losses"] and result["same_bytes"]
    # The payload crossed the shaped links, in TCP frames and ACKs (a few % more), and
    # nothing else did: the weights sent for evaluation at the last step (as many bytes as
    # a step's exchange) went over the control network.
    assert 1.0 < result["tc_per_payload"] / result["payload"] < 1.2
    # The uplinks sent the ACKs ahead of the data (netns.py's host queue): about 2 % of
    # their bytes (a 66-byte ACK every 2.5 segments of 1514), not none and not the data.
    assert 0.01 < result["small_share"] < 0.04
    assert result["transfer_per_sync"] > 0 and result["simulated"] > 0
    # Nothing left: no namespace, and no process of the run.
    assert leftovers(tag) == []
    assert processes_with_marker(marker) == []


@needs_emulation
def test_a_failure_is_one_line_and_leaves_nothing(tmp_path, monkeypatch):
    """A rank that cannot start (here: an unknown workload parameter) stops the case with
    one line; the namespaces are gone."""
    marker = f"EXOFRAME_TEST_{uuid.uuid4().hex}"
    bench = subprocess.Popen(
        [sys.executable, str(REPO / "benchmarks" / "emulated_network.py"), "--cases",
         "star-20mbit", "--strategies", "ddp", "--nodes", "2", "--keep", str(tmp_path),
         "--extra", "-w no_such_param=1"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, marker: "1", "PYTHONPATH": str(REPO)})
    _, stderr = bench.communicate(timeout=300)
    assert bench.returncode == 2
    errors = [line for line in stderr.splitlines() if line.strip()]
    assert len(errors) == 1 and errors[0].startswith("emulated_network: a rank failed:"), \
        stderr
    assert "no_such_param" in errors[0]
    assert leftovers(f"b{bench.pid}") == []
    assert processes_with_marker(marker) == []
