"""The engine's interfaces, written down as Protocols, hold for every implementation: a
rank's Exchange (torch.distributed, in memory) and its Clock (simulated, measured, solo)."""
import time

from exoframe.comm.exchange import Exchange, TorchExchange, Work
from exoframe.comm.memory import MemoryExchange, MemoryWork, Pack
from exoframe.sim.clock import Clock, RankClock, SoloClock, StepClock
from exoframe.sim.compute import ComputeClock, parse_compute, parse_stragglers
from exoframe.sim.measured import RealClock
from exoframe.sim.topology import DEFAULT_ALGORITHMS
from exoframe.sim.collectives import BUILTIN


def test_every_exchange_is_an_exchange():
    pack = Pack([0, 0], 0, post=None, block=None, off_clock=None)
    for exchange in (TorchExchange(), MemoryExchange(0, pack)):
        assert isinstance(exchange, Exchange), type(exchange).__name__
    assert isinstance(MemoryWork(), Work)

    class NoSend(TorchExchange):
        send = None  # (a Protocol member set to None is absent)

    assert not isinstance(NoSend(), Exchange)
    assert not isinstance(object(), Exchange)


def test_every_clock_is_a_clock():
    compute = ComputeClock(parse_compute("fixed:10ms"), parse_stragglers("").for_rank(0, 0))
    simulated = RankClock(0, None, compute, dict(DEFAULT_ALGORITHMS), BUILTIN)
    measured = RealClock(0, time.thread_time, dict(DEFAULT_ALGORITHMS), BUILTIN)
    for clock in (simulated, measured):
        assert isinstance(clock, StepClock), type(clock).__name__
    assert isinstance(SoloClock(), Clock)
    assert not isinstance(SoloClock(), StepClock)  # it has no steps: a Communicator's only
