"""Raw TCP ring rounds on the emulated network, without exoframe or gloo: 4 namespaces in a
tbf-shaped star (exoframe/emulation/netns.py), each rank sending the same bytes to the next one at
once, as one round of a ring all-reduce does. Each round's time (its last flow done) over
the tcp model's (sim/network/tcp.py: frames and the ACKs of the flow coming in share each
uplink) says whether the congestion control itself gets the model's rate there.

    sudo python benchmarks/ring_rounds.py [--rates 20,50,100,200] [--congestion bbr|cubic]
                                          [--rounds 4] [--rank-sysctl KEY=VALUE]
                                          [--host-queue acks-first|fifo]
                                          [--port-queue fifo|acks-first]

Rounds start 3 s apart by the wall clock (about 1 s of sending, then idle, as between a
run's exchanges). Needs root; leaves no namespace behind.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from exoframe.emulation.netns import (OPTION_QUEUES, Emulation, EmulationError,  # noqa: E402
                                      EmulationOptions, add_emulation_options,
                                      check_can_emulate, emulation_options)

from exoframe.sim.network.tcp import TcpModel  # noqa: E402

RANKS = 4
ROUND_GAP = 3.0  # seconds between round starts

# One rank: listens for the previous rank, connects to the next, then in each round sends
# `nbytes` to the next while receiving as much from the previous; prints each round's time.
RANK = r'''
import socket, sys, threading, time
me, nxt, nbytes, rounds, start, gap = (sys.argv[1], sys.argv[2], int(sys.argv[3]),
                                       int(sys.argv[4]), float(sys.argv[5]), float(sys.argv[6]))
server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind((me, 5300))
server.listen(1)
out = None
while out is None:
    try:
        out = socket.create_connection((nxt, 5300))
    except OSError:
        time.sleep(0.05)
incoming, _ = server.accept()
chunk = b"x" * (1 << 16)
def send():
    left = nbytes
    while left > 0:
        left -= out.send(chunk[:min(len(chunk), left)])
times = []
for r in range(rounds):
    time.sleep(max(0.0, start + r * gap - time.time()))
    began = time.time()
    sender = threading.Thread(target=send)
    sender.start()
    got = 0
    while got < nbytes:
        got += len(incoming.recv(1 << 20))
    sender.join()
    times.append(time.time() - began)
print(" ".join(f"{t:.5f}" for t in times))
'''


def rounds_at(mbit: float, congestion: str, rounds: int, emulation_as: EmulationOptions,
              host_queue: str) -> tuple[list, float]:
    """Each round's time (the slowest rank's) and the model's, at `mbit` Mbit/s per link."""
    rate = mbit * 1e6 / 8
    tcp = TcpModel()
    per_payload_byte = (tcp.data_factor + tcp.ack_factor) / rate  # an uplink's two loads
    nbytes = int(1.0 / per_payload_byte)  # about 1 s a round under the model
    with Emulation(f"ring{int(mbit)}", [rate] * RANKS, [rate] * RANKS, [0] * RANKS, {},
                   congestion, emulation_as,
                   uplink_queue=[OPTION_QUEUES[host_queue]] * RANKS) as emulation:
        start = time.time() + 2.0
        ranks = [subprocess.Popen(
            ["ip", "netns", "exec", emulation.rank_ns(r), sys.executable, "-c", RANK,
             emulation.data_addr(r), emulation.data_addr((r + 1) % RANKS), str(nbytes),
             str(rounds), str(start), str(ROUND_GAP)], stdout=subprocess.PIPE, text=True)
            for r in range(RANKS)]
        times = [[float(t) for t in rank.communicate(timeout=60 + rounds * ROUND_GAP)[0].split()]
                 for rank in ranks]
    return [max(rank[i] for rank in times) for i in range(rounds)], nbytes * per_payload_byte


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", default="20,50,100,200", help="Mbit/s per link")
    parser.add_argument("--congestion", default="bbr")
    parser.add_argument("--rounds", type=int, default=4)
    add_emulation_options(parser)
    options = parser.parse_args()
    try:
        emulation_as = emulation_options(options)
        check_can_emulate()
        for mbit in (float(r) for r in options.rates.split(",")):
            host_queue = options.host_queue or "acks-first"
            times, model = rounds_at(mbit, options.congestion, options.rounds, emulation_as,
                                     host_queue)
            print(f"{mbit:g} Mbit/s, {options.congestion}, {host_queue} host "
                  f"queue, {emulation_as.port_queue} switch ports: "
                  f"round / model "
                  + ", ".join(f"{t / model:.3f}" for t in times), flush=True)
    except EmulationError as e:
        print(f"ring_rounds: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
