"""What a node keeps of its process's globals (engine/node/packing.py's nodes share one),
and what a run in the caller's own process (--in-process) gives back to it."""
from __future__ import annotations

import random
import threading

import numpy
import torch

from ... import distributed

# A turn at the process's globals: a node's (packing.Hub) or the evaluator's. They take
# turns in one process only under --in-process, where both are threads of the launcher's.
TURNS = threading.Lock()


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
