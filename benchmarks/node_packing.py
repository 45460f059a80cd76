"""How N nodes could share one process (issue 15's design question): the cost of N mlp
models each taking a training step, in one process with one thread, four ways.

    python benchmarks/node_packing.py [--nodes 16,64] [--steps 20]

- plain: one loop steps the N models in turn (the reference);
- threads: a thread per node, all runnable at once, a barrier per step (the GIL is fought
  over);
- baton threads: a thread per node, exactly one runnable, each handing over to the next
  (the waker's thread wake-up is paid at every hand-over);
- greenlets: a greenlet per node, switched in turn by a hub (needs `pip install greenlet`):
  what a node that blocks in an exchange would do, switch to the hub.
"""
import argparse
import sys
import threading
import time

import torch

from exoframe.config import RunConfig
from exoframe.engine import job_from_config
from exoframe.engine.node.data import Batches


def nodes_of(n: int, steps: int):
    """step(i): node i's training step. step.models: the N models."""
    job = job_from_config(RunConfig(workload="mlp", nodes=n, steps=steps))
    models = [job_from_config(RunConfig(workload="mlp", nodes=n, steps=steps, seed=r)).model
              for r in range(n)]
    optimizers = [torch.optim.AdamW(m.parameters(), lr=job.optimizer.lr) for m in models]
    data = [Batches(job.dataset(r, n, "train"), job.batch_size, 0, r, True, True)
            for r in range(n)]

    def step(i):
        models[i](next(data[i])).backward()
        optimizers[i].step()
        optimizers[i].zero_grad()
    step.models, step.job = models, job
    return step


def average(models, into=None):
    """FedAvg's average as a plain script writes it: each parameter of the models `into`
    (default: the models themselves) set to the models' mean."""
    with torch.no_grad():
        means = [torch.stack(same).mean(0) for same in zip(*(m.parameters() for m in models))]
        for target in models if into is None else into:
            for p, mean in zip(target.parameters(), means):
                p.copy_(mean)


def plain(step, n, steps, average_every: int | None = None, first: int = 1):
    """Steps first, first + 1, ...; average_every: FedAvg's H (the models averaged after each
    step that H divides), or None."""
    for number in range(first, first + steps):
        for i in range(n):
            step(i)
        if average_every and number % average_every == 0:
            average(step.models)


def free_threads(step, n, steps):
    barrier = threading.Barrier(n)

    def node(i):
        for _ in range(steps):
            step(i)
            barrier.wait()
    _run_threads(node, n)


def baton_threads(step, n, steps):
    turns = [threading.Event() for _ in range(n)]

    def node(i):
        for _ in range(steps):
            turns[i].wait()
            turns[i].clear()
            step(i)
            turns[(i + 1) % n].set()
    turns[0].set()
    _run_threads(node, n)


def _run_threads(node, n):
    threads = [threading.Thread(target=node, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def greenlets(step, n, steps):
    import greenlet

    hub = greenlet.getcurrent()

    def node(i):
        for _ in range(steps):
            step(i)
            hub.switch()
    lets = [greenlet.greenlet(lambda i=i: node(i)) for i in range(n)]
    for _ in range(steps):
        for g in lets:
            g.switch()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", default="16,64")
    parser.add_argument("--steps", type=int, default=20)
    options = parser.parse_args()
    torch.set_num_threads(1)
    ways = [("plain", plain)]
    try:
        import greenlet  # noqa: F401
        ways.append(("greenlets", greenlets))
    except ImportError:
        print("(greenlet is not installed: pip install greenlet to measure it)", file=sys.stderr)
    # Threads last: measured after them, greenlets ran ×1.49 instead of ×1.01 at N=64 (an
    # after-effect of the threads' run in this process).
    ways += [("threads", free_threads), ("baton threads", baton_threads)]
    for n in map(int, options.nodes.split(",")):
        step = nodes_of(n, options.steps)
        plain(step, n, 1)  # warm-up
        reference = None
        for name, way in ways:
            start = time.perf_counter()
            way(step, n, options.steps)
            per_step = (time.perf_counter() - start) / options.steps
            reference = reference or per_step
            print(f"N={n} {name:14s} {per_step * 1000:7.1f} ms/step  ×{per_step / reference:.2f}")


if __name__ == "__main__":
    main()
