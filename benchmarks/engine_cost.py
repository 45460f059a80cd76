"""The engine's own cost, each figure a ratio against its plain counterpart, in one run:

1. DiLoCo, 4 nodes, the default tiny GPT, 30 steps (H=10, validation at the end), one
   thread per process: the CPU time of the whole `exoframe run` (launcher, ranks,
   evaluator) against a plain PyTorch script doing the same compute in one process (4
   models with AdamW stepped in turn, the outer Nesterov step every H steps, the same final
   validation), and the same for wall-clock time;
2. a 1-step, 4-node `exoframe run --workload mlp` against `python -c "import torch"`, wall;
3. 64 mlp nodes in one worker (fedavg) against 64 models stepped in turn, per step;
4. 1024 fedavg mlp nodes, default packing, against the plain loop, per step.

    python benchmarks/engine_cost.py [--pairs 3] [--skip 3,4]

Whole processes are timed, exoframe's and the plain one alternated, pairs repeated; each
figure is the median ratio. Run it on an otherwise idle machine.
"""
import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
H, STEPS, NODES = 10, 30, 4
DILOCO = ["--strategy", "diloco", "-p", f"H={H}", "--nodes", str(NODES), "--steps", str(STEPS),
          "--eval-every", str(STEPS), "--threads", "1"]


def timed(command: list[str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the process and every descendant it waited for)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   cwd=tempfile.gettempdir())
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def plain_diloco():
    """The plain counterpart of figure 1 (run in its own process: --plain-diloco)."""
    import copy

    import torch

    from exoframe.config import RunConfig
    from exoframe.engine import job_from_config
    from exoframe.engine.data import Batches, eval_batches

    torch.set_num_threads(1)
    job = job_from_config(RunConfig(strategy="diloco", strategy_params={"H": H}, nodes=NODES,
                                    steps=STEPS))
    models = [copy.deepcopy(job.model) for _ in range(NODES)]
    inner = [torch.optim.AdamW(m.parameters(), lr=job.optimizer.lr) for m in models]
    global_model = copy.deepcopy(job.model)
    outer = torch.optim.SGD(global_model.parameters(), lr=0.7, momentum=0.9, nesterov=True)
    data = [Batches(job.dataset(r, NODES, "train"), job.batch_size, job.seed, r)
            for r in range(NODES)]
    for step in range(1, STEPS + 1):
        for model, optimizer, batches in zip(models, inner, data):
            model(next(batches)).backward()
            optimizer.step()
            optimizer.zero_grad()
        if step % H == 0:
            with torch.no_grad():
                for i, p in enumerate(global_model.parameters()):
                    replicas = [list(m.parameters())[i] for m in models]
                    p.grad = p - torch.stack(replicas).mean(0)
            outer.step()
            with torch.no_grad():
                for model in models:
                    for p, g in zip(model.parameters(), global_model.parameters()):
                        p.copy_(g)
    with torch.no_grad():
        global_model.eval()
        for r in range(NODES):
            for batch in eval_batches(job.dataset(r, NODES, "val"), job.batch_size,
                                      job.eval_batches):
                global_model(batch)


def ratio_pairs(ours: list[str], plain: list[str], pairs: int, cpu: bool) -> tuple:
    """(median ratio, our medians (wall, cpu), plain medians) over alternated pairs."""
    rows = []
    for _ in range(pairs):
        rows.append((timed(ours), timed(plain)))
    pick = 1 if cpu else 0
    ratio = statistics.median(o[pick] / p[pick] for o, p in rows)
    ours_median = tuple(statistics.median(o[i] for o, _ in rows) for i in (0, 1))
    plain_median = tuple(statistics.median(p[i] for _, p in rows) for i in (0, 1))
    return ratio, ours_median, plain_median


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--skip", default="", help="figures to leave out, e.g. 3,4")
    parser.add_argument("--plain-diloco", action="store_true", help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.plain_diloco:
        return plain_diloco()
    skip = {int(x) for x in options.skip.split(",") if x}
    exoframe = [sys.executable, "-m", "exoframe", "run", "--out",
                tempfile.mkdtemp(prefix="exoframe-cost-")]
    print(f"{os.cpu_count()} CPUs; medians of {options.pairs} alternated pairs")
    if 1 not in skip:
        plain = [sys.executable, str(Path(__file__).resolve()), "--plain-diloco"]
        cpu, ours, theirs = ratio_pairs(exoframe + DILOCO, plain, options.pairs, cpu=True)
        wall, _, _ = ratio_pairs(exoframe + DILOCO, plain, options.pairs, cpu=False)
        print(f"1. DiLoCo, 4 nodes, tiny GPT, {STEPS} steps: CPU {cpu:.3f}x the plain script "
              f"({ours[1]:.2f} s against {theirs[1]:.2f} s), wall {wall:.3f}x "
              f"({ours[0]:.2f} s against {theirs[0]:.2f} s)")
    if 2 not in skip:
        one_step = exoframe + ["--workload", "mlp", "--nodes", "4", "--steps", "1"]
        wall, ours, theirs = ratio_pairs(one_step, [sys.executable, "-c", "import torch"],
                                         options.pairs, cpu=False)
        print(f"2. a 1-step, 4-node run: wall {wall:.2f}x `python -c \"import torch\"` "
              f"({ours[0]:.2f} s against {theirs[0]:.2f} s)")
    sys.path.insert(0, str(HERE))
    from scale import exoframe_run, plain_loop  # beside this file
    for figure, nodes, per_process in ((3, 64, 64), (4, 1024, None)):
        if figure in skip:
            continue
        ratios = []
        for _ in range(options.pairs):
            ours = exoframe_run(nodes, 20, "fedavg", per_process)
            if "failed" in ours:
                raise SystemExit(f"{nodes} nodes: {ours['failed']}")
            ratios.append((ours["per_step"] / plain_loop(nodes, 20), ours["per_step"]))
        ratio = statistics.median(r for r, _ in ratios)
        packing = "in one worker" if per_process else "default packing"
        print(f"{figure}. {nodes} fedavg nodes, {packing}: {ratio:.3f}x the plain loop per "
              f"step ({statistics.median(s for _, s in ratios) * 1e3:.1f} ms per step)")


if __name__ == "__main__":
    main()
