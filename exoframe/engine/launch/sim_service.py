"""The network simulator, run in the launcher for the ranks: each rank's requests and step
ends go into its Feed (in that rank's order), the simulator's answers go back to the ranks,
and a Post's content waits here until the simulator delivers it."""
from __future__ import annotations

from dataclasses import replace

from ...sim import SimulationError, Simulator
from ...sim.clocks.feed import Feed
from ...sim.clocks.protocol import Mail, StepEnd
from ..ipc.messages import SimRequest
from ..ipc.processes import RankFailed
from ..plan.job import Job


class SimService:
    def __init__(self, job: Job, send):
        """send(rank, message): to a rank, ignoring a rank that died (its sentinel says so)."""
        self.sim = Simulator(job.sim.topology, job.sim.algorithms, seed=job.seed,
                             overlap_rate=job.sim.compute.overlap_rate)
        resumed = job.resume_from  # a Checkpoint: its simulator inputs first
        self.feed = Feed(self.sim, resumed.sim_inputs if resumed else None,
                         record=job.checkpoint_every is not None)
        self.payloads = {}  # (rank, msg_id) -> the content of a Post not yet delivered
        self.send = send

    def request(self, message: SimRequest):
        if message.payload is not None:  # a Post: its content waits for its delivery
            self.payloads[(message.rank, message.message.msg_id)] = message.payload
        self.feed.message(message.rank, message.message)

    def step_end(self, rank: int, end: StepEnd):
        self.feed.message(rank, end)

    def rank_done(self, rank: int):
        self.feed.rank_done(rank)

    def resume_if_held(self, waiting_outside) -> bool:
        """Simulator.resume_if_held, answered now."""
        resumed = self.sim.resume_if_held(waiting_outside)
        if resumed:
            self.advance()
        return resumed

    def advance(self):
        """Run the simulator as far as every rank's inputs let it, and answer the ranks."""
        try:
            replies = self.feed.advance()
            stuck = self.sim.stuck()
        except SimulationError as e:
            raise RankFailed("simulator", str(e)) from None
        for rank, reply in replies:
            if isinstance(reply, Mail):
                reply = replace(reply, payloads=tuple(self.payloads.pop((src, msg_id))
                                                      for src, msg_id, _ in reply.messages))
            self.send(rank, reply)
        if stuck:
            raise RankFailed("simulator", stuck)
