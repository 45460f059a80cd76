"""Where the ranks run, as the launcher sees it: the processes it forks for them, how it
reaches each rank, and how they meet. A process per rank (ProcessPerNode), or nodes packed
into workers (PackedWorkers, engine/node/packing.py); the Placement decides which (hosting_for).
The node's side of the same choice is node_host.py."""
from __future__ import annotations

import resource
from typing import Protocol

from ..ipc.messages import NodeMessage
from ..ipc.processes import closing, stack_file
from ..ipc.sender import Sender
from ..node.packing import Outbox, run_nodes
from ..node.rank import run_rank
from ..plan.job import Job
from .monitor import Channel


class Hosting(Protocol):
    # Pipe ends that children inherit and the launcher closes once they are forked.
    inherited: list

    def forks(self, job: Job) -> int:
        """How many processes this launcher forks for the ranks."""

    def children(self, job: Job, batches: dict, context, folder: str,
                 to_evaluator: list) -> list:
        """(who, target, arguments) for each process to fork: target(*arguments, conn).
        to_evaluator: each process's pipe end to the evaluator."""

    def rank_ends(self, job: Job, conns: list, processes: list, remote: dict) -> tuple:
        """(each rank's connection, each rank's process, the Channels the monitor reads),
        from the forked processes' conns and processes and, under torchrun, the other
        ranks' connections (`remote`: rank -> conn)."""

    def meet(self, rank_conns: list, rendezvous):
        """Tell the ranks how to meet (messages.Rendezvous), once all are there."""

    def close(self):
        """The run is over: let go of what the hosting started."""


class ProcessPerNode:
    """A process per rank, joined in a torch process group; with `remote` (torchrun), this
    launcher forks rank 0 alone and the other ranks connect from their own processes."""

    def __init__(self, remote: bool = False):
        self.remote, self.inherited = remote, []

    def forks(self, job):
        return 1 if self.remote else job.nodes

    def children(self, job, batches, context, folder, to_evaluator):
        return [(rank, run_rank, (rank, job, batches[rank], to_evaluator[rank]))
                for rank in range(self.forks(job))]

    def rank_ends(self, job, conns, processes, remote):
        rank_conns = [*conns, *(remote[r] for r in range(len(conns), job.nodes))]
        rank_processes = [*processes, *[None] * (job.nodes - len(processes))]
        return rank_conns, rank_processes, [Channel(conn, (r,))
                                            for r, conn in enumerate(rank_conns)]

    def meet(self, rank_conns, rendezvous):
        for conn in rank_conns:
            conn.send(rendezvous)

    def close(self):
        pass


class PackedWorkers:
    """A worker per placement group, a pipe between every pair of workers, and a NodeLink
    per node into its worker's outbox, which the monitor flushes (through a thread: a worker
    that stops reading cannot block the monitor)."""

    def __init__(self):
        self.inherited: list = []
        self.sender = None

    def forks(self, job):
        return len(job.placement.groups)

    def children(self, job, batches, context, folder, to_evaluator):
        raise_open_files_limit()
        groups = job.placement.groups
        home = [i for i, group in enumerate(groups) for _ in group]
        pairs = {(a, b): context.Pipe() for a in range(len(groups))
                 for b in range(a + 1, len(groups))}
        self.inherited = [end for pair in pairs.values() for end in pair]
        children = []
        for i, group in enumerate(groups):
            peers = {**{b: pipe[0] for (a, b), pipe in pairs.items() if a == i},
                     **{a: pipe[1] for (a, b), pipe in pairs.items() if b == i}}
            mine = set(map(id, peers.values()))
            others = [end for end in self.inherited if id(end) not in mine]
            children.append((group[0], closing(others, run_nodes),
                             (list(group), job, {r: batches[r] for r in group}, home, i, peers,
                              stack_file(folder, group[0]), to_evaluator[i])))
        return children

    def rank_ends(self, job, conns, processes, remote):
        self.sender = Sender()
        self.sender.start()
        groups = job.placement.groups
        outboxes = [Outbox(conn, self.sender.sender_for(conn)) for conn in conns]
        channels = [Channel(conn, group, outbox)
                    for conn, group, outbox in zip(conns, groups, outboxes)]
        links = [NodeLink(outbox, rank) for outbox, group in zip(outboxes, groups)
                 for rank in group]
        return links, [p for p, group in zip(processes, groups) for _ in group], channels

    def meet(self, rank_conns, rendezvous):
        pass  # (packed nodes exchange in memory and through their workers' pipes)

    def close(self):
        if self.sender is not None:
            self.sender.close(timeout=5)


class NodeLink:
    """The launcher's connection to one packed node: what it sends goes into the worker's
    outbox (the monitor flushes it)."""

    def __init__(self, outbox: Outbox, rank: int):
        self.outbox, self.rank = outbox, rank

    def send(self, message):
        self.outbox.pending.append(NodeMessage(self.rank, message))

    def close(self):
        pass


def raise_open_files_limit():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def hosting_for(job: Job, remote: bool) -> Hosting:
    """remote: under torchrun, where other processes run the other ranks."""
    return PackedWorkers() if job.placement.packed else ProcessPerNode(remote)
