"""A training command's start-up: the engine imported with the cyclic garbage collector paused
and stop signals held."""
from __future__ import annotations

import gc
import sys


def import_engine():
    """Import the engine, torch and torch._dynamo (every torch optimizer imports it when it
    is made and at its first step) with the cyclic garbage collector paused, then freeze
    what the imports made.

    They make about 280,000 objects, most of which live as long as the process. With the
    collector on, its passes during the imports cost about 0.65 s of the 4.4 s a one-step
    run took on 2 slow cores, 0.48 s of it in five full passes, each walking every object
    made so far. Frozen (gc.freeze), they are left out of every later pass, in this process
    and in the ranks and evaluator it forks, so that a pass in a child does not copy the
    memory pages it would otherwise touch (as Python's documentation of gc.freeze advises
    before fork). What is made after start-up (the job, the data) is collected as usual. A
    process that has imported torch already (a test, a notebook) is left as it is.
    """
    if "torch" in sys.modules:
        return
    # A stop signal waits for the imports' end: raised inside them, it was lost in a C
    # extension's start-up (the command went on), or left torch half imported.
    from ..engine.ipc.stop_signals import signals_held, stopped_by
    from ..errors import RunInterrupted

    try:
        with signals_held(strict=True):
            enabled = gc.isenabled()
            gc.disable()
            try:
                from ..engine.launch.launcher import preload

                preload()
                gc.freeze()
            finally:
                if enabled:
                    gc.enable()
    except KeyboardInterrupt as e:  # (one line, as in every later phase; not click's Abort)
        raise RunInterrupted(f"interrupted{stopped_by(e)}: exoframe was starting; nothing "
                             "ran.") from e
