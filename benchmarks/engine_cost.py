"""The engine's own cost, each figure a ratio against its plain counterpart, in one run:

1. DiLoCo, 4 nodes, the default tiny GPT, 30 steps (H=10, validation at the end), one
   thread per process: the CPU time of the whole `exoframe run` (launcher, ranks,
   evaluator) against a plain PyTorch script doing the same compute in one process (4
   models with AdamW stepped in turn, the outer Nesterov step every H steps, the same final
   validation), and the same for wall-clock time;
2. a 1-step, 4-node `exoframe run --workload mlp`, wall: against `python -c "import torch"`,
   and against a plain script that imports torch, makes the same data, steps 4 such MLPs
   once with AdamW and validates their average (a torch optimizer imports torch._dynamo
   when it is made and at its first step: no script that trains escapes it); and the
   imports alone, `python -c "import torch, torch._dynamo"` without the interpreter's
   teardown (exoframe skips it), against `python -c "import torch"`, with the cyclic garbage
   collector on and paused (exoframe pauses it while it imports them, then freezes what
   they made: cli/start_up.py; the freeze itself takes no time worth measuring);
3. 64 mlp nodes in one worker (fedavg) against 64 models stepped in turn and averaged every
   H steps as fedavg does (benchmarks/scale.py's plain loop), per step: the marginal cost
   of a step, (elapsed of a 60-step run - elapsed of a 20-step run) / 40, against the plain
   loop's steps alone; and the whole run's (elapsed - start-up) / 19 of a 20-step run,
   which also holds the end of the run (the last step's 64 model states, their average,
   the final validation), against a 20-step plain loop that also validates the models'
   average at its end;
4. 1024 fedavg mlp nodes, default packing, against the plain loop, per step (whole run, the
   end included in both).

    python benchmarks/engine_cost.py [--pairs 3] [--skip 3,4]

Whole processes are timed, exoframe's and the plain one alternated, pairs repeated; each
figure is the median ratio. Run it on an otherwise idle machine. exoframe's bytecode is
compiled first (as pip compiles an installed package's, and torch's): where
PYTHONDONTWRITEBYTECODE is set, an editable install would otherwise compile every module
it imports in every run (`--no-compile`, with exoframe's __pycache__ folders removed first,
measures that).
"""
import argparse
import compileall
import importlib.util
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
    from exoframe.engine.node.data import Batches
    from exoframe.engine.launch.evaluator import validate
    from exoframe.engine.launch.validation_set import validation_set

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
    validate(global_model, validation_set(job.dataset, NODES, job.val_examples).dataset,
             job.batch_size)


def plain_one_step():
    """The plain counterpart of figure 2 (its own process: --plain-one-step): torch only.
    The mlp workload's data and model are written out here, not imported from exoframe
    (workloads/mlp.py), so that the plain script pays no exoframe import."""
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    teacher = [torch.randn(32, 64, generator=g), torch.randn(64, 10, generator=g)]
    x = torch.randn(22_000, 32, generator=g)
    y = (torch.tanh(x @ teacher[0]) @ teacher[1]).argmax(1)

    def mlp():
        return torch.nn.Sequential(torch.nn.Linear(32, 128), torch.nn.ReLU(),
                                   torch.nn.Linear(128, 128), torch.nn.ReLU(),
                                   torch.nn.Linear(128, 10))
    models = [mlp() for _ in range(NODES)]
    for r, model in enumerate(models):
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        rows = torch.randperm(5_000, generator=g)[:64] + 5_000 * r
        F.cross_entropy(model(x[rows]), y[rows]).backward()
        optimizer.step()
    average = mlp()
    with torch.no_grad():
        for p, *replicas in zip(average.parameters(), *(m.parameters() for m in models)):
            p.copy_(torch.stack(replicas).mean(0))
        F.cross_entropy(average(x[20_000:]), y[20_000:])


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
    parser.add_argument("--no-compile", action="store_true",
                        help="leave exoframe's bytecode as it is")
    parser.add_argument("--plain-diloco", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--plain-one-step", action="store_true", help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.plain_diloco:
        return plain_diloco()
    if options.plain_one_step:
        return plain_one_step()
    skip = {int(x) for x in options.skip.split(",") if x}
    if not options.no_compile:
        compileall.compile_dir(importlib.util.find_spec("exoframe").submodule_search_locations[0],
                               quiet=1)
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
        script = [sys.executable, str(Path(__file__).resolve()), "--plain-one-step"]
        against_script, _, plain = ratio_pairs(one_step, script, options.pairs, cpu=False)
        import_torch = [sys.executable, "-c", "import torch"]
        # exoframe skips the interpreter's teardown (cli.entry) and imports with the
        # collector paused (cli/start_up.py): the imports alone, each way
        no_teardown, _, _ = ratio_pairs(
            [sys.executable, "-c", "import os, torch, torch._dynamo; os._exit(0)"],
            import_torch, options.pairs, cpu=False)
        paused, _, _ = ratio_pairs(
            [sys.executable, "-c", "import gc, os; gc.disable(); import torch, torch._dynamo; "
             "os._exit(0)"], import_torch, options.pairs, cpu=False)
        print(f"2. a 1-step, 4-node run: wall {wall:.2f}x `python -c \"import torch\"` "
              f"({ours[0]:.2f} s against {theirs[0]:.2f} s); {against_script:.2f}x the plain "
              f"1-step script ({plain[0]:.2f} s); `import torch, torch._dynamo` alone, without "
              f"the teardown, {no_teardown:.2f}x `import torch`, {paused:.2f}x with the "
              "collector paused")
    sys.path.insert(0, str(HERE))
    from scale import exoframe_run, plain_loop  # beside this file
    if 3 not in skip:
        marginal, whole = [], []
        for _ in range(options.pairs):
            short, long = (exoframe_run(64, steps, "fedavg", 64) for steps in (20, 60))
            if "failed" in short or "failed" in long:
                raise SystemExit(f"64 nodes: {short.get('failed') or long.get('failed')}")
            marginal.append(((long["elapsed"] - short["elapsed"]) / 40)
                            / plain_loop(64, 40, end=False))
            whole.append(short["per_step"] / plain_loop(64, 20))
        print(f"3. 64 fedavg nodes in one worker: a step's marginal cost "
              f"{statistics.median(marginal):.3f}x the plain loop's; a 20-step run's per step "
              f"(with the run's end) {statistics.median(whole):.3f}x")
    if 4 not in skip:
        ratios = []
        for _ in range(options.pairs):
            ours = exoframe_run(1024, 20, "fedavg", None)
            if "failed" in ours:
                raise SystemExit(f"1024 nodes: {ours['failed']}")
            ratios.append((ours["per_step"] / plain_loop(1024, 20), ours["per_step"]))
        print(f"4. 1024 fedavg nodes, default packing: "
              f"{statistics.median(r for r, _ in ratios):.3f}x the plain loop per step "
              f"({statistics.median(s for _, s in ratios) * 1e3:.1f} ms per step)")


if __name__ == "__main__":
    main()
