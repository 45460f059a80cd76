"""What a node keeps of its process's globals (engine/node/packing.py's nodes share one)."""
from __future__ import annotations

import random

import torch

from ... import distributed


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
