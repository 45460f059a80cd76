"""`exoframe emulate` end to end on three network files (a star, two sites, asymmetric
links), each with a stated latency, loss and queue (the uplinks', the site link's): the job runs on namespaces, tc
and the delay line under torchrun, and in the simulator, and the command prints both
clocks and leaves nothing behind. Needs root (skipped cleanly without); what does not need
it (bad input, missing root) is one line either way."""
import os
import re
import subprocess
import sys

import pytest
import yaml
from test_delay_line import why_not

from exoframe.emulation.netns import EmulationError, check_can_emulate

JOB = ["--workload", "mlp", "-w", "hidden=128", "--steps", "3", "--no-progress"]
NETWORKS = {
    "star": {"description": "star, 50 Mbit/s, 5 ms, 0.1 % loss", "bandwidth": "50mbit",
             "latency": "5ms", "loss": "0.1%", "queue": "fifo 50ms"},
    "sites": {"description": "two sites", "bandwidth": "200mbit", "latency": "1ms",
              "sites": {"a": {}, "b": {}},
              "links": [{"between": ["a", "b"], "bandwidth": "50mbit", "latency": "10ms",
                         "loss": 0.001, "queue": "fifo 50ms"}], "queue": "fair"},
    "asymmetric": {"description": "home broadband", "upload": "20mbit",
                   "download": "100mbit", "latency": "8ms", "jitter": "1ms", "loss": 0.0005,
                   "queue": "fifo 100 packets"},
}


def emulate(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "exoframe", "emulate", *args],
                          capture_output=True, text=True, timeout=600, cwd=cwd)


def namespaces() -> list[str]:
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return [line.split()[0] for line in listed.splitlines() if line.startswith("exo-e")]


@pytest.mark.skipif(why_not() is not None, reason=f"no emulated network: {why_not()}")
@pytest.mark.parametrize("name", list(NETWORKS))
def test_emulate_runs_a_file_on_its_emulation_and_its_twin(tmp_path, name):
    net = tmp_path / f"{name}.yaml"
    net.write_text(yaml.safe_dump(NETWORKS[name]))
    before = namespaces()
    done = emulate("--net", str(net), "--nodes", "2", "--keep", str(tmp_path / "kept"), "--",
                   *JOB, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    real = float(re.search(r"emulated \(real\)\s+([\d.]+) s", done.stdout).group(1))
    simulated = float(re.search(r"simulated \(twin\)\s+([\d.]+) s", done.stdout).group(1))
    ratio = float(re.search(r"real / simulated\s+([\d.]+)", done.stdout).group(1))
    assert real > 0 and simulated > 0 and ratio == pytest.approx(real / simulated, rel=0.01)
    assert "same losses and bytes yes" in done.stdout
    assert f"uplink queues {NETWORKS[name]['queue']}," in done.stdout
    links = NETWORKS[name].get("links", [])
    assert ("links between sites" in done.stdout) == bool(links)
    assert all(f"links between sites {link['queue']}," in done.stdout for link in links)
    # the twin read the same file, with the congestion control the ranks used
    twin = yaml.safe_load((tmp_path / "kept" / "network.yaml").read_text())
    assert twin["protocol"]["congestion"] == "cubic"
    assert namespaces() == before


@pytest.mark.skipif(why_not() is not None, reason=f"no emulated network: {why_not()}")
def test_readmes_emulate_lines_run_shrunk(tmp_path):
    from test_readme import readme_commands, with_option

    lines = [c.argv for c in readme_commands() if c.argv[:3] == ["sudo", "exoframe", "emulate"]]
    assert lines, "README and docs show no `sudo exoframe emulate` line"
    for argv in lines:
        args = with_option(argv[3:], "--steps", "2")
        done = emulate(*args, cwd=tmp_path)
        assert done.returncode == 0, f"{' '.join(argv)}\n{done.stderr[-2000:]}"
        assert "real / simulated" in done.stdout


@pytest.mark.parametrize("args,says", [
    (["--net", "nosuch.yaml", "--", *JOB], "network file 'nosuch.yaml' not found"),
    (["--net", "wan-100mbps", "--", "--nodes", "4"], "--nodes: give it to `exoframe emulate`"),
])
def test_bad_input_is_one_line(args, says):
    done = emulate(*args)
    assert done.returncode != 0 and says in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


@pytest.mark.parametrize("text, field", [("loss: 5%%", "loss"), ("queue: lifo", "queue")])
def test_a_bad_loss_or_queue_is_one_line_naming_the_field(tmp_path, text, field):
    net = tmp_path / "net.yaml"
    net.write_text(f"bandwidth: 10mbit\n{text}\n")
    done = emulate("--net", str(net), "--", *JOB)
    assert done.returncode != 0 and f"{net}: {field}: " in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_without_root_it_says_so_in_one_line(monkeypatch):
    """The check the command makes before anything (as a user who is not root)."""
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(EmulationError, match="needs root"):
        check_can_emulate()

