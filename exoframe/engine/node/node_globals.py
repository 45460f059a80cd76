"""What a node keeps of its process's globals (engine/node/packing.py's nodes share one),
and what a run in the caller's own process (--in-process) gives back to it."""
from __future__ import annotations

import os
import random
import sys
import threading
import weakref

import numpy
import torch

from ... import distributed

# A turn at the process's globals: a node's (packing.Hub) or the evaluator's. They take
# turns in one process only under --in-process, where both are threads of the launcher's.
TURNS = threading.Lock()

# Threads a run in this process left running (not daemons), named in a warning: the
# `exoframe` command does not wait for them at its exit (cli/__init__.py, entry).
LEFT_RUNNING: weakref.WeakSet = weakref.WeakSet()

# The environment variables exoframe sets for a run (launcher.py, bind_to_loopback).
RUN_ENVIRONMENT = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")


class NodeGlobals:
    """What a node keeps of its process's globals, swapped in for its turns and out after:
    torch's and Python's random generators (and its GPU's), grad mode, and the rank that
    exoframe.distributed serves. A node starts from the process's state, as a forked rank
    from the launcher's."""

    def __init__(self, cuda: bool):
        self.cuda = cuda
        self.torch_rng, self.python_rng = torch.get_rng_state(), random.getstate()
        self.cuda_rng = None  # on a GPU: its CUDA generator's, once it has run
        self.grad = torch.is_grad_enabled()
        self.bound = None  # its Communicator

    def swap_in(self):
        torch.set_rng_state(self.torch_rng)
        random.setstate(self.python_rng)
        if torch.is_grad_enabled() != self.grad:
            torch.set_grad_enabled(self.grad)
        distributed.bind(self.bound)
        if self.cuda and self.cuda_rng is not None:
            torch.cuda.set_rng_state(self.cuda_rng)

    def swap_out(self):
        if self.cuda:
            self.cuda_rng = torch.cuda.get_rng_state()
        self.torch_rng, self.python_rng = torch.get_rng_state(), random.getstate()
        self.grad, self.bound = torch.is_grad_enabled(), distributed.current()


class ProcessGlobals:
    """What a run whose nodes and evaluator are threads of this process (--in-process)
    changes of it, saved before and put back after: the random generators (torch's, Python's,
    numpy's, and the GPUs' where CUDA was already running), torch's thread count, and the
    rank exoframe.distributed serves."""

    def __init__(self):
        self.node = NodeGlobals(cuda=False)  # torch's and Python's generators, the binding
        self.numpy_rng = numpy.random.get_state()
        self.cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
        self.threads = torch.get_num_threads()

    def restore(self):
        self.node.swap_in()
        numpy.random.set_state(self.numpy_rng)
        if self.cuda_rng is not None:
            torch.cuda.set_rng_state_all(self.cuda_rng)
        torch.set_num_threads(self.threads)


class CallerState:
    """What a run in the caller's own process (--in-process) may change of it beyond
    ProcessGlobals, taken before any of the run's code and given back at its end: the
    working directory (a strategy's os.chdir) and the environment variables exoframe sets
    for a run. The threads its code leaves running (not daemons) cannot be stopped: they are
    named in one warning line, and the `exoframe` command does not wait for them."""

    def __init__(self):
        self.cwd = _working_directory()
        self.environment = {name: os.environ.get(name) for name in RUN_ENVIRONMENT}
        self.threads = set(threading.enumerate())

    def give_back(self):
        if self.cwd is not None and _working_directory() != self.cwd:
            try:
                os.chdir(self.cwd)
            except OSError:
                pass  # (removed since: nothing to go back to)
        for name, value in self.environment.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        left = [thread for thread in threading.enumerate() if thread not in self.threads
                and thread.is_alive() and not thread.daemon]
        if left:
            LEFT_RUNNING.update(left)
            names = ", ".join(repr(thread.name) for thread in left)
            them = "it" if len(left) == 1 else "them"
            print(f"exoframe: warning: the run's own code (its strategy or workload) left "
                  f"{len(left)} non-daemon thread{'s' if len(left) > 1 else ''} running in "
                  f"this process: {names}; a thread cannot be stopped from outside, and the "
                  f"exoframe command exits without waiting for {them} (a Python program "
                  f"that ran the run waits for {them} as it exits).", file=sys.stderr,
                  flush=True)


def _working_directory() -> str | None:
    try:
        return os.getcwd()
    except OSError:  # (removed while the process was in it)
        return None
