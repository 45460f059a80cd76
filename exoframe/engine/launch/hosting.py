"""Where the ranks run, as the launcher sees it: the processes it forks for them, how it
reaches each rank, and how they meet. A process per rank (ProcessPerNode), nodes packed into
workers (PackedWorkers, engine/node/packing.py), or every node in the launcher's own process
(InProcess: the worker and the evaluator are threads); the Placement decides which
(hosting_for). The node's side of the same choice is engine/node/node_host.py."""
from __future__ import annotations

import copy
import dataclasses
import resource
import sys
import threading
from typing import Protocol

from ..ipc.messages import NodeMessage
from ..ipc.processes import child_entry, closing, stack_file, stop_all, thread_entry
from ..ipc.sender import Outbox, Sender
from ..node.node_globals import ProcessGlobals
from ..node.packing import run_nodes
from ..node.rank import run_rank
from ..plan.job import Job
from .evaluator import evaluate
from .monitor import EVALUATOR, Channel


class Hosting(Protocol):
    # Pipe ends that children inherit and the launcher closes once they are forked.
    inherited: list

    def forks(self, job: Job) -> int:
        """How many children (processes, or threads InProcess) run the ranks."""

    def children(self, job: Job, batches: dict, context, folder: str,
                 to_evaluator: list) -> list:
        """(who, target, arguments) for each child to start: target(*arguments, conn).
        to_evaluator: each child's pipe end to the evaluator."""

    def closing(self, ends: list, target):
        """target, run in a child that has no use for the pipe `ends`."""

    def evaluator(self, job: Job, val_set, readers: list, writers: list) -> tuple:
        """(who, target, arguments) of the evaluator's child; readers: its ends of the
        ranks' pipes to it, writers: theirs."""

    def start(self, children: list, context, folder: str, spare: list) -> tuple[list, list]:
        """Start every child: (the launcher's end of each one's pipe, each one's process,
        None for a thread). spare: pipe ends only the children use."""

    def rank_ends(self, job: Job, conns: list, processes: list, remote: dict) -> tuple:
        """(each rank's connection, each rank's process, the Channels the monitor reads),
        from the forked processes' conns and processes and, under torchrun, the other
        ranks' connections (`remote`: rank -> conn)."""

    def meet(self, rank_conns: list, rendezvous):
        """Tell the ranks how to meet (messages.Rendezvous), once all are there."""

    def close(self):
        """The run is over: let go of what the hosting started."""


class Forked:
    """Children that are forked processes: each closes the inherited pipe ends it has no use
    for, and so does the launcher once they are started."""

    def closing(self, ends, target):
        return closing(ends, target)

    def evaluator(self, job, val_set, readers, writers):
        return EVALUATOR, closing([*self.inherited, *writers], evaluate), (job, val_set, readers)

    def start(self, children, context, folder, spare):
        pipes = [context.Pipe() for _ in children]
        processes = [context.Process(target=child_entry,
                                     args=(who, target, args, child, stack_file(folder, who)),
                                     daemon=True, name=f"exoframe-{who}")
                     for (who, target, args), (_, child) in zip(children, pipes)]
        try:
            for process in processes:
                process.start()
        except BaseException:
            stop_all([process for process in processes if process.pid is not None])
            raise
        for end in [*(child for _, child in pipes), *self.inherited, *spare]:
            end.close()  # (the children's own)
        return [parent for parent, _ in pipes], processes


class ProcessPerNode(Forked):
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


class PackedWorkers(Forked):
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


class InProcess(PackedWorkers):
    """Every node in the launcher's process: the nodes are one worker (as under
    --nodes-per-process), which runs in a thread beside the launcher's, and so does the
    evaluator, on a copy of the model. Nothing is forked: a breakpoint in a strategy stops
    there, and a test needs no process. Exits are seen as closed pipes (as a remote rank's)."""

    def __init__(self):
        super().__init__()
        self.threads: list = []
        self.caller = None  # the process's globals before the run (ProcessGlobals)
        self.conns: list = []  # the launcher's ends of the threads' pipes
        self.spare: list = []  # the ends between the threads (the pipes to the evaluator)

    def children(self, job, batches, context, folder, to_evaluator):
        ranks = list(job.placement.groups[0])
        return [(ranks[0], run_nodes, (ranks, job, batches, [0] * job.nodes, 0, {}, None,
                                       to_evaluator[0]))]

    def closing(self, ends, target):
        return target  # (a thread's ends are the other threads' too)

    def evaluator(self, job, val_set, readers, writers):
        own = dataclasses.replace(job, model=copy.deepcopy(job.model))  # (it loads weights)
        return EVALUATOR, evaluate, (own, val_set, readers)

    def start(self, children, context, folder, spare):
        self.caller = ProcessGlobals()  # given back at close()
        pipes = [context.Pipe() for _ in children]
        self.spare, self.conns = spare, [parent for parent, _ in pipes]
        self.threads = [threading.Thread(target=thread_entry, args=(who, target, args, child),
                                         daemon=True, name=f"exoframe-{who}")
                        for (who, target, args), (_, child) in zip(children, pipes)]
        for thread in self.threads:
            thread.start()
        return self.conns, [None] * len(children)

    def close(self):
        """Each thread reads the end of its pipe and stops (and closes its own end); then
        the pipes between the threads close."""
        super().close()
        for conn in self.conns:
            conn.close()
        for thread in self.threads:
            thread.join(timeout=5)
        stuck = [thread.name for thread in self.threads if thread.is_alive()]
        if stuck:  # (a thread cannot be killed: a node stuck in its own code stays so)
            print(f"exoframe: warning: the run's thread {', '.join(stuck)} did not stop within "
                  "5 s of its end (a node stuck in its own code?) and is left running in this "
                  "process.", file=sys.stderr, flush=True)
        else:
            for end in self.spare:  # (one a live thread waits on stays open: it is its)
                end.close()
        if self.caller is not None:
            self.caller.restore()


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
    if job.placement.in_process:
        return InProcess()
    return PackedWorkers() if job.placement.packed else ProcessPerNode(remote)
