"""An emulated network on this machine, built from an exoframe Topology: one Linux network
namespace per rank, joined through bridges in a switch namespace, every direction of every
link shaped with `tc tbf`. Needs root; touches only the namespaces it creates (all named
`exo-<tag>-...`) and the private addresses inside them; nothing is created in, or routed
out of, the machine's own namespace.

    rank r's namespace   d0 (data, 10.213.1.r+1)  --veth--  p<r> on bridge bd<site>
                         c0 (control, 10.213.2.r+1) -veth-- q<r> on bridge bc (unshaped)
    switch namespace     bd<a> --veth w<a>_<b> / w<b>_<a>-- bd<b> for each pair of sites

A link with a delay (or loss) has the delay line (delay_line.py) in the switch namespace in
its middle: p<r> is then not on the bridge, and the line forwards between it and l<r>, whose
veth peer m<r> is; a link between sites becomes w<a>_<b> -- v<a>_<b> =line= v<b>_<a> --
w<b>_<a>. The shapers stay where they were, so the queues are where they were.

A rank's uplink is shaped on its d0, its downlink on p<r>, the link from site a to site b
on w<a>_<b>. A rank's uplink is its host's own egress queue, queued as the network file's
`queue:` says (topology.Queue). `fair`, a Linux host's: pure ACKs go ahead of queued data
(the default fq_codel serves sparse flows first; this kernel has neither fq_codel nor fq,
so an htb under the tbf serves packets under SMALL_PACKET bytes first) and the queue holds
txqueuelen's 1000 packets. `fifo`: one FIFO of the depth the file gives, as a modem's.
A link between sites is queued as the file's `links[i].queue` says (a router's port); the
ranks' downlinks in the switch namespace are 50 ms FIFOs by default (a switch's ports;
`port_queue="acks-first"` queues them as hosts' instead). Behind a FIFO, BBR, whose window
is sized from the 35 us round trip of these delay-free links, stalls while its ACKs wait
tens of ms behind the other direction's data (ring rounds took up to 1.4x the model at
20-100 Mbit/s; benchmarks/ring_rounds.py --host-queue fifo), and the flows a rank sends
drop packets in its own queue.

The control network carries torchrun's rendezvous, exoframe's own messages and evaluation;
gloo is bound to d0 (GLOO_SOCKET_IFNAME), so only training exchanges cross the shaped
links. tc's byte counters say what crossed them.
"""
from __future__ import annotations

import math
import os
import re
import subprocess
from dataclasses import dataclass, field, fields

from ..sim.network.topology import Queue
from .delay_line import DelayLine, Direction, EmulationError, Pair

DATA_NET, CONTROL_NET = "10.213.1", "10.213.2"
QUEUES = ("acks-first", "fifo")  # a switch port's queue: ACK-sized packets first, or one FIFO
PORT_QUEUE_SECONDS = 0.05  # a switch port's queue, at its rate (at least 64 frames)
FRAME = 1514  # bytes of a full Ethernet frame, as tc counts it
# each queue option as a network file would write it (a port's, or --host-queue)
OPTION_QUEUES = {"acks-first": Queue("fair"), "fifo": Queue("fifo", seconds=PORT_QUEUE_SECONDS)}
SMALL_PACKET = 128  # bytes: a pure ACK (52-84 bytes with options) is under it, data is not
HOST_QUEUE_PACKETS = 1000  # a host's egress queue: Linux's default txqueuelen
# tbf's bucket, the larger of the two: 2 ms keeps 1 Gbit/s whole on this busy machine (0.5 ms
# lost half of it); a full bucket starts each exchange at line rate, so no more than that
BURST_FRAMES, BURST_SECONDS = 2, 0.002
DATA_IF, CONTROL_IF = "d0", "c0"
SENT, DROPPED = r"Sent (\d+) bytes", r"dropped (\d+)"  # in `tc -s`'s statistics
TCP_COUNTERS = {"RetransSegs": "retransmitted", "TCPTimeouts": "timeouts",
                "TCPLossProbes": "loss_probes"}  # /proc/net/snmp or netstat name -> ours


def _number(pattern: str, said: str) -> int:
    """The number `pattern` finds in what tc said (0 where it says none)."""
    match = re.search(pattern, said)
    return int(match.group(1)) if match else 0


def sh(*command: str, check: bool = True) -> str:
    done = subprocess.run(command, capture_output=True, text=True)
    if check and done.returncode:
        raise EmulationError(f"`{' '.join(command)}` failed: {done.stderr.strip()}")
    return done.stdout


@dataclass(frozen=True)
class EmulationOptions:
    """What a benchmark's user may change in the emulation (add_emulation_options)."""
    sysctls: dict = field(default_factory=dict)  # set in every rank's namespace (its TCP stack)
    port_queue: str = "fifo"  # the switch's ports: a rank's downlink, a link between sites

    def __post_init__(self):
        if self.port_queue not in QUEUES:
            raise EmulationError(f"port queue {self.port_queue!r}: expected one of "
                                 f"{', '.join(QUEUES)}.")


@dataclass
class Counts:
    """What an emulation's queues and its ranks' TCP stacks have counted (`after - before`:
    what happened between two readings). Queues by 'namespace/device'."""
    sent: dict  # bytes each shaped queue sent
    dropped: dict  # packets each shaped queue dropped
    small: dict  # bytes the queues serving ACKs first sent from their first class (the ACKs)
    tcp: dict  # TCP_COUNTERS, summed over the ranks' namespaces
    lost: dict  # frames the delay line dropped on purpose (random loss), by direction

    def __sub__(self, before: Counts) -> Counts:
        return Counts(*({key: value - getattr(before, part.name)[key]
                         for key, value in getattr(self, part.name).items()}
                        for part in fields(self)))

    @staticmethod
    def on_uplinks(counts: dict) -> int:
        """The sum of a queue count over the ranks' uplinks."""
        return sum(value for key, value in counts.items() if key.endswith(f"/{DATA_IF}"))


def add_emulation_options(parser):
    """The options every benchmark on this emulation takes (EmulationOptions)."""
    parser.add_argument("--rank-sysctl", action="append", default=[], metavar="KEY=VALUE",
                        help="a sysctl of every rank's namespace, repeatable (e.g. "
                             "net.ipv4.tcp_slow_start_after_idle=0)")
    parser.add_argument("--host-queue", choices=QUEUES,
                        help="every rank's own egress queue, whatever the network says: "
                             "pure ACKs ahead of data, as Linux's default qdisc serves them "
                             "(a network's `queue: fair`), or a FIFO of 50 ms (`queue: fifo "
                             "50ms`); left out: the network's")
    parser.add_argument("--port-queue", choices=QUEUES, default=EmulationOptions.port_queue,
                        help="the switch's ports' queues (a rank's downlink, a link between "
                             "sites): a FIFO of 50 ms (default), or ACKs ahead of data, "
                             "each class holding the same 50 ms")


def emulation_options(options) -> EmulationOptions:
    """add_emulation_options' values; EmulationError for a --rank-sysctl not KEY=VALUE."""
    if any("=" not in item for item in options.rank_sysctl):
        raise EmulationError("--rank-sysctl: give KEY=VALUE, e.g. "
                             "net.ipv4.tcp_slow_start_after_idle=0.")
    return EmulationOptions(dict(item.split("=", 1) for item in options.rank_sysctl),
                            options.port_queue)


def check_can_emulate():
    """Raise EmulationError (one line) where namespaces and tbf cannot be used."""
    if not os.path.exists("/proc/self/ns/net"):
        raise EmulationError("network namespaces need Linux; this machine has none.")
    if os.geteuid() != 0:
        raise EmulationError("building network namespaces needs root: run it as root "
                             "(sudo).")
    for tool in ("ip", "tc"):
        if subprocess.run(["which", tool], capture_output=True).returncode:
            raise EmulationError(f"`{tool}` is not installed (iproute2).")


class Emulation:
    """The namespaces of one network; a context manager that removes all of them.
    uplink/downlink[r]: rank r's NIC in bytes/s (math.inf: unshaped); site_of[r]; inter:
    (site a, site b) -> bytes/s of the directed link between them."""

    def __init__(self, tag: str, uplink, downlink, site_of, inter: dict,
                 congestion_control: str | None = None,
                 options: EmulationOptions = EmulationOptions(),
                 access_delay: list | None = None, inter_delay: dict | None = None,
                 seed: int = 0, uplink_queue: list | None = None,
                 inter_queue: dict | None = None):
        """access_delay[r]: (up, down) Directions of rank r's link; inter_delay[(a, b)]:
        the Direction from site a to site b (delay_line.py). Left out: no delay.
        uplink_queue[r]: the Queue in front of rank r's uplink (left out: fair);
        inter_queue[(a, b)]: the link from site a to b's (left out: options.port_queue)."""
        self.tag = tag
        self.options = options
        self.uplink, self.downlink, self.site_of = list(uplink), list(downlink), list(site_of)
        self.inter = dict(inter)
        self.congestion_control = congestion_control
        self.access_delay = access_delay or [(Direction(), Direction())] * len(self.site_of)
        self.inter_delay = inter_delay or {}
        self.seed = seed
        self.uplink_queue = list(uplink_queue or [Queue()] * len(self.site_of))
        self.inter_queue = dict(inter_queue or {})
        self.delay_pairs: list[Pair] = []
        self.delay_line: DelayLine | None = None
        self.delay_counts: dict = {}  # the delay line's last counts, once closed
        self.created: list[str] = []
        self.shaped: list[tuple[str, str]] = []  # (namespace, device)
        self.acks_first: list[tuple[str, str]] = []  # those of them serving ACKs first
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
            for key, value in self.options.sysctls.items():
                self._in(ns, "sysctl", "-q", "-w", f"{key}={value}")
            if self.congestion_control:
                self._allow(self.congestion_control)
                self._in(ns, "sysctl", "-q", "-w",
                         f"net.ipv4.tcp_congestion_control={self.congestion_control}")
            up, down = self.access_delay[rank]
            if up.idle and down.idle:
                self._veth(ns, DATA_IF, f"p{rank}", f"bd{site}", f"{self.data_addr(rank)}/24")
            else:
                self._veth(ns, DATA_IF, f"p{rank}", None, f"{self.data_addr(rank)}/24")
                self._in(sw, "ip", "link", "add", f"l{rank}", "type", "veth", "peer", "name",
                         f"m{rank}")
                self._in(sw, "ip", "link", "set", f"m{rank}", "master", f"bd{site}", "up")
                self._in(sw, "ip", "link", "set", f"l{rank}", "up")
                self.delay_pairs.append(Pair(f"p{rank}", f"l{rank}", up, down))
            self._veth(ns, CONTROL_IF, f"q{rank}", "bc", f"{self.control_addr(rank)}/24")
            self._shape(ns, DATA_IF, self.uplink[rank], self.uplink_queue[rank], host=True)
            self._shape(sw, f"p{rank}", self.downlink[rank], self.port_queue)
        for (a, b), rate in self.inter.items():
            if a < b:
                there, back = (self.inter_delay.get(key, Direction()) for key in ((a, b), (b, a)))
                if there.idle and back.idle:
                    self._in(sw, "ip", "link", "add", f"w{a}_{b}", "type", "veth", "peer",
                             "name", f"w{b}_{a}")
                else:
                    for x, y in ((a, b), (b, a)):
                        self._in(sw, "ip", "link", "add", f"w{x}_{y}", "type", "veth", "peer",
                                 "name", f"v{x}_{y}")
                        self._in(sw, "ip", "link", "set", f"v{x}_{y}", "up")
                    self.delay_pairs.append(Pair(f"v{a}_{b}", f"v{b}_{a}", there, back))
                for x, y in ((a, b), (b, a)):
                    self._in(sw, "ip", "link", "set", f"w{x}_{y}", "master", f"bd{x}", "up")
            queue = self.inter_queue.get((a, b), self.port_queue)
            self._shape(sw, f"w{a}_{b}", rate, queue)
        lossy = [pair for pair in self.delay_pairs if pair.a_to_b.loss or pair.b_to_a.loss]
        if lossy:  # a packet each: a lost GSO frame would lose tens of segments at once
            for rank in range(len(self.site_of)):
                self._in(self.rank_ns(rank), "ip", "link", "set", "dev", DATA_IF,
                         "gso_max_segs", "1")
        if self.delay_pairs:
            for device in [name for pair in self.delay_pairs for name in (pair.a, pair.b)]:
                # no IPv6 chatter of their own on the line's ends
                self._in(sw, "sysctl", "-q", "-w", f"net.ipv6.conf.{device}.disable_ipv6=1",
                         check=False)
            self.delay_line = DelayLine(sw, self.delay_pairs, seed=self.seed)

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

    def _veth(self, ns: str, inner: str, outer: str, bridge: str | None, address: str):
        """A veth from rank namespace `ns` to the switch, its outer end on `bridge` (None:
        on none, for the delay line)."""
        sw = self.switch
        self._in(sw, "ip", "link", "add", outer, "type", "veth", "peer", "name", inner,
                 "netns", ns)
        if bridge is None:
            self._in(sw, "ip", "link", "set", outer, "up")
        else:
            self._in(sw, "ip", "link", "set", outer, "master", bridge, "up")
        self._in(ns, "ip", "addr", "add", address, "dev", inner)
        self._in(ns, "ip", "link", "set", inner, "up")

    @property
    def port_queue(self) -> Queue:
        return OPTION_QUEUES[self.options.port_queue]

    def _shape(self, ns: str, dev: str, rate: float, queue: Queue, host: bool = False):
        """tbf at `rate` bytes/s on dev's egress: a burst of BURST_SECONDS at that rate (at
        least BURST_FRAMES frames) and the queue. A FIFO holds its depth (at least
        BURST_FRAMES frames), the tokens a burst passes on included. Fair: under the tbf, an
        htb whose first class (packets under SMALL_PACKET bytes) is served before the second
        (the rest), each holding HOST_QUEUE_PACKETS on a host (its txqueuelen) and
        PORT_QUEUE_SECONDS elsewhere (a port: only the order changes); the classes' rates
        are far above the tbf's, so only their order acts."""
        if math.isinf(rate):
            return
        burst = max(BURST_FRAMES * FRAME, int(rate * BURST_SECONDS))
        limit = max(64 * FRAME, int(rate * PORT_QUEUE_SECONDS))
        if queue.discipline == "fifo":
            limit = max(BURST_FRAMES * FRAME, int(queue.capacity(rate, FRAME)) - burst)
        self._in(ns, "tc", "qdisc", "add", "dev", dev, "root", "handle", "1:", "tbf", "rate",
                 f"{int(rate * 8)}bit", "burst", str(burst), "limit", str(limit))
        if queue.discipline == "fair":
            tc = ("tc", "qdisc", "add", "dev", dev)
            klass = ("tc", "class", "add", "dev", dev)
            self._in(ns, *tc, "parent", "1:1", "handle", "2:", "htb", "default", "20")
            self._in(ns, *klass, "parent", "2:", "classid", "2:1", "htb", "rate", "10gbit",
                     "quantum", "65536")
            for leaf, priority in (("2:10", "0"), ("2:20", "1")):
                self._in(ns, *klass, "parent", "2:1", "classid", leaf, "htb", "rate", "10gbit",
                         "quantum", "65536", "prio", priority)
                depth = ("pfifo", "limit", str(HOST_QUEUE_PACKETS)) if host else \
                    ("bfifo", "limit", str(limit))
                self._in(ns, *tc, "parent", leaf, *depth)
            # IPv4 total length (bytes 2-3) under 128: its bits above the 7th are zero
            self._in(ns, "tc", "filter", "add", "dev", dev, "parent", "2:", "protocol", "ip",
                     "prio", "1", "u32", "match", "u16", "0x0000",
                     f"0x{0xffff & ~(SMALL_PACKET - 1):04x}", "at", "2", "flowid", "2:10")
            self.acks_first.append((ns, dev))
        self.shaped.append((ns, dev))

    def counts(self) -> Counts:
        """What the shaped queues and the ranks' TCP stacks have counted so far: each root
        queue's statistics are read once, for its bytes and its drops."""
        sent, dropped = {}, {}
        for ns, dev in self.shaped:
            said = self._in(ns, "tc", "-s", "qdisc", "show", "dev", dev, "root")
            sent[f"{ns}/{dev}"], dropped[f"{ns}/{dev}"] = _number(SENT, said), \
                _number(DROPPED, said)
        small = {f"{ns}/{dev}": _number(SENT, self._in(ns, "tc", "-s", "class", "show", "dev",
                                                       dev, "classid", "2:10"))
                 for ns, dev in self.acks_first}
        lost = {name: value["lost"] for name, value in
                (self.delay_line.counts() if self.delay_line else {}).items()}
        return Counts(sent, dropped, small, self._tcp_counters(), lost)

    def _tcp_counters(self) -> dict[str, int]:
        """TCP_COUNTERS, summed over the ranks' namespaces (each has its own stack). They
        count the unshaped control network's connections too, which resend next to nothing."""
        total = dict.fromkeys(TCP_COUNTERS.values(), 0)
        for rank in range(len(self.site_of)):
            lines = self._in(self.rank_ns(rank), "cat", "/proc/net/snmp",
                             "/proc/net/netstat").splitlines()
            rows = [line.split() for line in lines]
            for names, values in zip(rows[::2], rows[1::2]):
                if names[0] != values[0]:
                    raise EmulationError(f"/proc/net/snmp: '{names[0]}' is followed by "
                                         f"'{values[0]}', not its values.")
                for name, value in zip(names[1:], values[1:]):
                    if name in TCP_COUNTERS:
                        total[TCP_COUNTERS[name]] += int(value)
        return total

    def close(self):
        """Remove every namespace this emulation made (their links and qdiscs go with
        them); a process still inside one is killed first."""
        try:
            if self.delay_line is not None:
                self.delay_counts = self.delay_line.stop()
        finally:
            self.delay_line = None
            self._remove()

    def _remove(self):
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

