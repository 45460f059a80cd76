"""Remote calls' one-sided messages in the simulator: each Post is a flow from its sender to
its destination's mailbox; a Listen is answered with the mailbox's content once it has any
(at the delivery's time), or like a Wait if the operation it also waits for completes first.
"""
from __future__ import annotations

from .critical_path import Leg, wait_latency
from .operation import sort_key
from .protocol import Listen, Mail, Post, SimulationError


class Mailboxes:
    def __init__(self, sim):
        """sim: the Simulator, whose network carries the messages and whose ranks listen."""
        self.sim = sim
        self.boxes = [[] for _ in range(sim.topology.size)]  # (src, msg_id, nbytes) delivered
        self.listeners = {}  # rank -> (t, op_id or None): waits for mail

    def post(self, rank: int, message: Post):
        sim = self.sim
        if not 0 <= message.dst < sim.topology.size:
            raise SimulationError(f"rank {rank} posted a message to rank {message.dst}, which "
                                  f"does not exist (ranks 0 to {sim.topology.size - 1})")
        arg = [message.dst, (rank, message.msg_id, message.nbytes), sim.env.now, None]
        arg[3] = sim.network.start_flow(rank, message.dst, message.nbytes, self._arrived, arg,
                                        (sort_key(("mail", message.msg_id)), 0, 1))

    def _arrived(self, arg):
        dst, letter, posted, flow = arg
        self.boxes[dst].append(letter)
        listener = self.listeners.pop(dst, None)
        if listener is not None:
            t, op_id = listener
            if op_id is not None:
                del self.sim.waiters[self.sim.handles[(dst, op_id)]]
            self._deliver(dst, t, self.sim.env.now, posted, Leg(posted, None, flow,
                                                                self.sim.env.now))

    def listen(self, rank: int, message: Listen):
        t, sim = message.t, self.sim
        if self.boxes[rank] or not message.block:
            self._deliver(rank, t, t, t, None)
            return
        if message.op_id is not None:
            op, index = sim.handles[(rank, message.op_id)]
            if op.done_at[index] is not None:
                sim.reply_wait(rank, t, message.op_id)
                return
            sim.waiters[(op, index)] = (rank, t, message.op_id)
        self.listeners[rank] = (t, message.op_id)

    def _deliver(self, rank: int, since: float, end: float, posted: float, leg: Leg | None):
        """Hand over the mailbox; the wait since `since` was communication from when the
        message that ends it (`leg`) was posted, idle before."""
        letters, self.boxes[rank] = tuple(self.boxes[rank]), []
        comm = end - max(since, posted)
        latency = wait_latency(leg, comm, end - comm)
        self.sim.wake(rank, end, Mail(end, end - since - comm, comm, letters,
                                      latency=latency))
