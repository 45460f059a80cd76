"""The delay line checked against physics before anything is measured with it: two hosts
(namespaces) joined through it, no shaper, and
- round trip: UDP probes echoed across it take 2 x the one-way delay, idle and while a
  TCP flow fills the line (within 2 % + 0.2 ms: the probes' own cost is tens of us);
- window / RTT: one TCP flow whose window is clamped moves window / RTT (within 5 %);
- loss: of many frames, the fraction dropped is the configured one within its binomial
  spread (4 standard deviations).
`python -m exoframe.emulation.physics` prints the figures (root, Linux)."""
from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass

from .delay_line import DelayLine, Direction, Pair
from .netns import sh

TAG = "phys"
ADDRESSES = ("10.214.1.1", "10.214.1.2")
PORT = 47311

# Run inside a host's namespace: a UDP echo server, and a TCP sink with a clamped window.
ECHO = """
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind((sys.argv[1], int(sys.argv[2])))
print('ready', flush=True)
while True:
    data, peer = s.recvfrom(2048)
    s.sendto(data, peer)
"""
PROBE = """
import json, socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(2)
count, gap, rtts = int(sys.argv[3]), float(sys.argv[4]), []
for i in range(count):
    start = time.perf_counter()
    s.sendto(i.to_bytes(8, 'big'), (sys.argv[1], int(sys.argv[2])))
    while int.from_bytes(s.recv(2048)[:8], 'big') != i:
        pass
    rtts.append(time.perf_counter() - start)
    time.sleep(gap)
print(json.dumps(rtts))
"""
SINK = """
import socket, sys, time
clamp = int(sys.argv[3])
server = socket.socket(); server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
if clamp:
    server.setsockopt(socket.IPPROTO_TCP, socket.TCP_WINDOW_CLAMP, clamp)
server.bind((sys.argv[1], int(sys.argv[2]))); server.listen(1)
print('ready', flush=True)
conn, _ = server.accept()
got, marks, step = 0, [], int(sys.argv[4])
while True:
    data = conn.recv(1 << 20)
    if not data:
        break
    got += len(data)
    while got >= (len(marks) + 1) * step:
        marks.append(time.perf_counter())
print(' '.join(map(str, marks)), flush=True)
"""
SOURCE = """
import socket, statistics, struct, sys
s = socket.create_connection((sys.argv[1], int(sys.argv[2])))
chunk, left, windows = b'x' * (1 << 16), int(sys.argv[3]), []
while left > 0:
    s.sendall(chunk[:min(left, len(chunk))]); left -= len(chunk)
    info = s.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 232)
    windows.append(struct.unpack_from('I', info, 228)[0])  # tcpi_snd_wnd: the peer's window
s.close()
print(statistics.median(windows))
"""
BLAST = """
import socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for i in range(int(sys.argv[3])):
    s.sendto(b'y' * 200, (sys.argv[1], int(sys.argv[2])))
    if i % 50 == 49:
        time.sleep(0.001)
"""


@dataclass
class Figures:
    delay: float  # one way, s
    idle_rtt: float  # median, s
    loaded_rtt: float
    load_rate: float  # bytes/s the TCP flow moved meanwhile
    load_cpu: float  # the delay line's CPU seconds per second meanwhile (1: a whole core)
    window: int  # bytes
    windowed_rate: float  # bytes/s
    loss: float  # configured
    frames: int
    lost: int

    def report(self) -> list[str]:
        rtt = 2 * self.delay
        expected = self.window / rtt
        p, n = self.loss, self.frames
        spread = math.sqrt(n * p * (1 - p))
        return [f"round trip, idle: {self.idle_rtt * 1e3:.3f} ms (configured {rtt * 1e3:g} ms)",
                f"round trip beside a TCP flow of {self.load_rate * 8 / 1e6:.0f} Mbit/s: "
                f"{self.loaded_rtt * 1e3:.3f} ms (the delay line meanwhile: "
                f"{self.load_cpu:.0%} of a core)",
                f"one flow, window {self.window / 1024:g} KiB: "
                f"{self.windowed_rate * 8 / 1e6:.1f} Mbit/s (window / RTT "
                f"{expected * 8 / 1e6:.1f} Mbit/s, ratio {self.windowed_rate / expected:.3f})",
                f"loss {p:g}: {self.lost} of {n} frames ({self.lost / n:.5f}; binomial "
                f"{n * p:.0f} +- {spread:.0f})"]

    def failures(self) -> list[str]:
        rtt, problems = 2 * self.delay, []
        for name, measured in (("idle", self.idle_rtt), ("loaded", self.loaded_rtt)):
            if abs(measured - rtt) > 0.02 * rtt + 0.0002:
                problems.append(f"{name} round trip {measured * 1e3:.3f} ms, configured "
                                f"{rtt * 1e3:g} ms")
        expected = self.window / rtt
        if abs(self.windowed_rate / expected - 1) > 0.05:
            problems.append(f"windowed flow at {self.windowed_rate / expected:.3f} x "
                            f"window / RTT")
        mean, spread = self.frames * self.loss, math.sqrt(self.frames * self.loss * (1 - self.loss))
        if abs(self.lost - mean) > 4 * spread + 1:
            problems.append(f"{self.lost} frames lost of {self.frames}, expected {mean:.0f} "
                            f"+- {spread:.0f}")
        return problems


@contextmanager
def two_hosts(direction: Direction, seed: int = 0):
    """Host namespaces h0 and h1, each with one interface, joined through the delay line
    in a middle namespace; yields (run-in-host function, delay line)."""
    names = [f"exo-{TAG}-h0", f"exo-{TAG}-h1", f"exo-{TAG}-mid"]
    for name in names:
        sh("ip", "netns", "del", name, check=False)
    line = None
    try:
        for name in names:
            sh("ip", "netns", "add", name)
            sh("ip", "netns", "exec", name, "ip", "link", "set", "lo", "up")
        for host in (0, 1):
            sh("ip", "netns", "exec", names[2], "ip", "link", "add", f"m{host}", "type", "veth",
               "peer", "name", "d0", "netns", names[host])
            sh("ip", "netns", "exec", names[2], "ip", "link", "set", f"m{host}", "up")
            sh("ip", "netns", "exec", names[host], "ip", "addr", "add",
               f"{ADDRESSES[host]}/24", "dev", "d0")
            sh("ip", "netns", "exec", names[host], "ip", "link", "set", "d0", "up")
        line = DelayLine(names[2], [Pair("m0", "m1", direction, direction)], seed=seed)

        def in_host(host: int, code: str, *args, wait: bool = True):
            command = ["ip", "netns", "exec", names[host], sys.executable, "-c", code,
                       *map(str, args)]
            if wait:
                return subprocess.run(command, capture_output=True, text=True, check=True,
                                      timeout=120).stdout
            return subprocess.Popen(command, stdout=subprocess.PIPE, text=True)

        yield in_host, line
    finally:
        if line is not None:
            line.stop()
        for name in reversed(names):
            for pid in sh("ip", "netns", "pids", name, check=False).split():
                subprocess.run(["kill", "-9", pid], capture_output=True)
            sh("ip", "netns", "del", name, check=False)


def _cpu_seconds(pid: int) -> float:
    """The CPU time (user and system) process `pid` has used so far."""
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _probe(in_host, count: int) -> float:
    rtts = json.loads(in_host(0, PROBE, ADDRESSES[1], PORT, count, 0.002))
    return statistics.median(rtts)


def _flow(in_host, window: int, nbytes: int, step: int) -> list[float]:
    """Times at which each `step` bytes of one flow h0 -> h1 had arrived, and the median
    window the receiver advertised (TCP_WINDOW_CLAMP is a bound; the kernel may advertise
    less or, scaled, somewhat more)."""
    sink = in_host(1, SINK, ADDRESSES[1], PORT + 1, window, step, wait=False)
    assert sink.stdout.readline().strip() == "ready"
    advertised = float(in_host(0, SOURCE, ADDRESSES[1], PORT + 1, nbytes))
    marks = [float(x) for x in sink.stdout.readline().split()]
    sink.wait(timeout=60)
    return marks, advertised


def measure(delay: float = 0.025, window: int = 256 * 1024, loss: float = 0.01) -> Figures:
    with two_hosts(Direction(delay=delay)) as (in_host, line):
        echo = in_host(1, ECHO, ADDRESSES[1], PORT, wait=False)
        assert echo.stdout.readline().strip() == "ready"
        idle = _probe(in_host, 200)
        # an unclamped flow fills the line meanwhile (as fast as the delay line forwards)
        sink = in_host(1, SINK, ADDRESSES[1], PORT + 1, 0, 1 << 20, wait=False)
        assert sink.stdout.readline().strip() == "ready"
        source = in_host(0, SOURCE, ADDRESSES[1], PORT + 1, 400 << 20, wait=False)
        time.sleep(1.0)  # past slow start
        cpu_before, started = _cpu_seconds(line.process.pid), time.monotonic()
        loaded = _probe(in_host, 200)
        load_cpu = (_cpu_seconds(line.process.pid) - cpu_before) / (time.monotonic() - started)
        source.wait(timeout=120)
        marks = [float(x) for x in sink.stdout.readline().split()]
        sink.wait(timeout=60)
        late = marks[len(marks) // 3:]
        load_rate = (len(late) - 1) * (1 << 20) / (late[-1] - late[0])
        marks, advertised = _flow(in_host, window, 120 * window, window)
        steady = marks[len(marks) // 3:]  # past slow start
        windowed = (len(steady) - 1) * window / (steady[-1] - steady[0])
        echo.kill()
    frames = 20000
    with two_hosts(Direction(delay=0.001, loss=loss), seed=7) as (in_host, line):
        in_host(0, BLAST, ADDRESSES[1], PORT + 2, frames)
        time.sleep(0.05)
        counts = line.counts()["m0>m1"]
    return Figures(delay, idle, loaded, load_rate, load_cpu, int(advertised), windowed, loss, counts["frames"],
                   counts["lost"])


if __name__ == "__main__":
    figures = measure()
    print("\n".join(figures.report()))
    problems = figures.failures()
    print("physics checks: " + ("passed" if not problems else "FAILED: " + "; ".join(problems)))
    sys.exit(1 if problems else 0)
