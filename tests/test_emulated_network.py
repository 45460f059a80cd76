"""The emulated-network benchmark's machinery (benchmarks/emulated_network.py), end to end on
its smallest case: 2 ranks in their own network namespaces on a tc-shaped 20 Mbit/s star,
under torchrun with --net real, and the simulated twin from the same description. Skipped
where namespaces cannot be made (not root, not Linux). The measured times are the
benchmark's to report; this test checks what must hold whatever the machine's load."""
import os
import subprocess
import sys
import uuid

import pytest
from conftest import REPO, processes_with_marker

sys.path.insert(0, str(REPO / "benchmarks"))
import emulated_network  # noqa: E402
from netns import Emulation, EmulationError, check_can_emulate, leftovers  # noqa: E402


def can_emulate() -> str | None:
    try:
        check_can_emulate()
        with Emulation(f"p{os.getpid()}", [1e6], [1e6], [0], {}):
            pass
    except (EmulationError, OSError) as e:
        return str(e)
    return None


why_not = can_emulate()
pytestmark = pytest.mark.skipif(why_not is not None, reason=f"no emulated network: {why_not}")


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
