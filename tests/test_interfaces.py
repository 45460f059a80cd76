"""The engine's interfaces, written down as Protocols, hold for every implementation: a
rank's Exchange (torch.distributed, in memory), its Clock (simulated, measured, solo) and
every Conn a message crosses (a pipe, a socket, in process, a packed node's)."""
import multiprocessing
import time

from exoframe.comm.exchange import Exchange, TorchExchange, Work
from exoframe.comm.memory import MemoryExchange, MemoryWork, Pack
from exoframe.engine.node.packing import NodeConn
from exoframe.sim.clocks.clock import Clock, RankClock, SoloClock, StepClock
from exoframe.sim.clocks.compute import ComputeClock, parse_compute, parse_stragglers
from exoframe.sim.clocks.measured import RealClock
from exoframe.sim.clocks.transport import Conn, in_process
from exoframe.sim.network.collectives import BUILTIN
from exoframe.sim.network.topology import DEFAULT_ALGORITHMS


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


def test_every_connection_is_a_conn():
    pipe = multiprocessing.Pipe()
    try:
        for conn in (*pipe, *in_process(), NodeConn(node=None)):
            assert isinstance(conn, Conn), type(conn).__name__
    finally:
        for end in pipe:
            end.close()
    assert not isinstance(object(), Conn)
