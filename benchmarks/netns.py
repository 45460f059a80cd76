"""An emulated network on this machine, built from an exoframe Topology: one Linux network
namespace per rank, joined through bridges in a switch namespace, every direction of every
link shaped with `tc tbf`. Needs root; touches only the namespaces it creates (all named
`exo-<tag>-...`) and the private addresses inside them; nothing is created in, or routed
out of, the machine's own namespace.

    rank r's namespace   d0 (data, 10.213.1.r+1)  --veth--  p<r> on bridge bd<site>
                         c0 (control, 10.213.2.r+1) -veth-- q<r> on bridge bc (unshaped)
    switch namespace     bd<a> --veth w<a>_<b> / w<b>_<a>-- bd<b> for each pair of sites

A rank's uplink is shaped on its d0, its downlink on p<r>, the link from site a to site b
on w<a>_<b>. The control network carries torchrun's rendezvous, exoframe's own messages
and evaluation; gloo is bound to d0 (GLOO_SOCKET_IFNAME), so only training exchanges
cross the shaped links. tc's byte counters say what crossed them.
"""
from __future__ import annotations

import math
import os
import re
import subprocess

DATA_NET, CONTROL_NET = "10.213.1", "10.213.2"
DATA_IF, CONTROL_IF = "d0", "c0"


class EmulationError(Exception):
    """What went wrong, in one line."""


def sh(*command: str, check: bool = True) -> str:
    done = subprocess.run(command, capture_output=True, text=True)
    if check and done.returncode:
        raise EmulationError(f"`{' '.join(command)}` failed: {done.stderr.strip()}")
    return done.stdout


def check_can_emulate():
    """Raise EmulationError (one line) where namespaces and tbf cannot be used."""
    if not os.path.exists("/proc/self/ns/net"):
        raise EmulationError("network namespaces need Linux; this machine has none.")
    if os.geteuid() != 0:
        raise EmulationError("building network namespaces needs root: run as root "
                             "(sudo python benchmarks/emulated_network.py).")
    for tool in ("ip", "tc"):
        if subprocess.run(["which", tool], capture_output=True).returncode:
            raise EmulationError(f"`{tool}` is not installed (iproute2).")


class Emulation:
    """The namespaces of one network; a context manager that removes all of them.
    uplink/downlink[r]: rank r's NIC in bytes/s (math.inf: unshaped); site_of[r]; inter:
    (site a, site b) -> bytes/s of the directed link between them."""

    def __init__(self, tag: str, uplink, downlink, site_of, inter: dict,
                 congestion_control: str | None = None, sysctls: dict | None = None):
        self.tag = tag
        self.uplink, self.downlink, self.site_of = list(uplink), list(downlink), list(site_of)
        self.inter = dict(inter)
        self.congestion_control = congestion_control
        self.sysctls = dict(sysctls or {})  # set in every rank's namespace (its own TCP stack)
        self.created: list[str] = []
        self.shaped: list[tuple[str, str]] = []  # (namespace, device)
        self.allowed_before: str | None = None  # the machine's list, while widened

    @property
    def switch(self) -> str:
        return f"exo-{self.tag}-sw"

    def rank_ns(self, rank: int) -> str:
        return f"exo-{self.tag}-r{rank}"

    @staticmethod
    def data_addr(rank: int) -> str:
        return f"{DATA_NET}.{rank + 1}"

    @staticmethod
    def control_addr(rank: int) -> str:
        return f"{CONTROL_NET}.{rank + 1}"

    def __enter__(self) -> Emulation:
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc):
        self.close()

    def _netns(self, name: str):
        sh("ip", "netns", "add", name)
        self.created.append(name)
        self._in(name, "ip", "link", "set", "lo", "up")

    def _in(self, ns: str, *command: str, check: bool = True) -> str:
        return sh("ip", "netns", "exec", ns, *command, check=check)

    def _build(self):
        sw = self.switch
        self._netns(sw)
        sites = sorted(set(self.site_of))
        for site in sites:
            self._bridge(f"bd{site}")
        self._bridge("bc")
        for rank, site in enumerate(self.site_of):
            ns = self.rank_ns(rank)
            self._netns(ns)
            for key, value in self.sysctls.items():
                self._in(ns, "sysctl", "-q", "-w", f"{key}={value}")
            if self.congestion_control:
                self._allow(self.congestion_control)
                self._in(ns, "sysctl", "-q", "-w",
                         f"net.ipv4.tcp_congestion_control={self.congestion_control}")
            self._veth(ns, DATA_IF, f"p{rank}", f"bd{site}", f"{self.data_addr(rank)}/24")
            self._veth(ns, CONTROL_IF, f"q{rank}", "bc", f"{self.control_addr(rank)}/24")
            self._shape(ns, DATA_IF, self.uplink[rank])
            self._shape(sw, f"p{rank}", self.downlink[rank])
        for (a, b), rate in self.inter.items():
            if a < b:
                self._in(sw, "ip", "link", "add", f"w{a}_{b}", "type", "veth", "peer", "name",
                         f"w{b}_{a}")
                for x, y in ((a, b), (b, a)):
                    self._in(sw, "ip", "link", "set", f"w{x}_{y}", "master", f"bd{x}", "up")
            self._shape(sw, f"w{a}_{b}", rate)

    def _allow(self, algorithm: str):
        """A namespace may pick only a congestion control the machine allows: add it to the
        machine's list while the emulation lasts (close() puts the list back)."""
        key = "net.ipv4.tcp_allowed_congestion_control"
        allowed = sh("sysctl", "-n", key).split()
        if algorithm in allowed:
            return
        if algorithm not in sh("sysctl", "-n", "net.ipv4.tcp_available_congestion_control").split():
            raise EmulationError(f"congestion control {algorithm} is not available here "
                                 f"(modprobe tcp_{algorithm}).")
        self.allowed_before = " ".join(allowed)
        sh("sysctl", "-q", "-w", f"{key}={' '.join([*allowed, algorithm])}")

    def _bridge(self, name: str):
        self._in(self.switch, "ip", "link", "add", name, "type", "bridge")
        self._in(self.switch, "ip", "link", "set", name, "up")

    def _veth(self, ns: str, inner: str, outer: str, bridge: str, address: str):
        sw = self.switch
        self._in(sw, "ip", "link", "add", outer, "type", "veth", "peer", "name", inner,
                 "netns", ns)
        self._in(sw, "ip", "link", "set", outer, "master", bridge, "up")
        self._in(ns, "ip", "addr", "add", address, "dev", inner)
        self._in(ns, "ip", "link", "set", inner, "up")

    def _shape(self, ns: str, dev: str, rate: float):
        """tbf at `rate` bytes/s on dev's egress: a burst of 2 ms at that rate (at least a
        few frames) and a queue of 50 ms."""
        if math.isinf(rate):
            return
        burst = max(16 * 1514, int(rate * 0.002))
        limit = max(64 * 1514, int(rate * 0.05))
        self._in(ns, "tc", "qdisc", "add", "dev", dev, "root", "tbf", "rate",
                 f"{int(rate * 8)}bit", "burst", str(burst), "limit", str(limit))
        self.shaped.append((ns, dev))

    def counters(self) -> dict[str, int]:
        """Bytes each shaped device has sent so far, by 'namespace/device'."""
        sent = {}
        for ns, dev in self.shaped:
            text = self._in(ns, "tc", "-s", "qdisc", "show", "dev", dev)
            match = re.search(r"Sent (\d+) bytes", text)
            sent[f"{ns}/{dev}"] = int(match.group(1)) if match else 0
        return sent

    def close(self):
        """Remove every namespace this emulation made (their links and qdiscs go with
        them); a process still inside one is killed first."""
        for ns in reversed(self.created):
            pids = sh("ip", "netns", "pids", ns, check=False).split()
            for pid in pids:
                try:
                    os.kill(int(pid), 9)
                except (ProcessLookupError, ValueError):
                    pass
            sh("ip", "netns", "del", ns, check=False)
        self.created.clear()
        if self.allowed_before is not None:
            sh("sysctl", "-q", "-w",
               f"net.ipv4.tcp_allowed_congestion_control={self.allowed_before}", check=False)
            self.allowed_before = None


def leftovers(tag: str) -> list[str]:
    """Namespaces named for `tag` that still exist."""
    names = [line.split()[0] for line in sh("ip", "netns", "list").splitlines() if line.strip()]
    return [name for name in names if name.startswith(f"exo-{tag}-")]
