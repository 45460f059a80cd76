"""Nodes sharing a GPU train as one worker on it (engine/node/packing.py): the same records as a
process per node, admitted by the GPU's memory, and a failure stops the run cleanly.
Skipped without a CUDA GPU (counted through NVML: CUDA is never initialized in pytest's
process, whose forked ranks could not use it then)."""
import dataclasses
import json
import math
import os
import subprocess
import sys

import pytest
import torch
from conftest import SMALL_GPT, helper_processes
from test_packing import FailsOnRankTwo, _alive, _parent

from exoframe.config import RunConfig
from exoframe.engine import execute, job_from_config
from exoframe.engine.ipc.processes import RankFailed
from exoframe.engine.plan import devices
from exoframe.engine.plan.node_memory import node_memory
from exoframe.engine.plan.placement import GPU_RESERVED_BYTES, Machine
from exoframe.errors import ExoframeError, RunStopped

pytestmark = pytest.mark.skipif(devices.gpu_count() == 0, reason="needs a CUDA GPU")

STRATEGIES = [("ddp", {}), ("diloco", {"H": 2}), ("streaming-diloco", {"H": 4, "fragments": 2}),
              ("sparta", {})]


def run(strategy, params, **fields):
    config = RunConfig(workload="gpt", workload_params=SMALL_GPT, strategy=strategy,
                       strategy_params=params, nodes=4, steps=6, eval_every=3,
                       compute="fixed:10ms", device="cuda:0", **fields).validate()
    return execute(job_from_config(config))


def close_records(ours, reference):
    """The same simulated clock; losses, validation losses and final weights to GPU float
    tolerance."""
    for a, b in zip(ours.metrics, reference.metrics, strict=True):
        assert a["sim_time"] == pytest.approx(b["sim_time"], rel=1e-9)
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-4, abs=1e-5)
        if "val_loss" in b:
            assert a["val_loss"] == pytest.approx(b["val_loss"], rel=1e-4, abs=1e-5)
    for p, q in zip(ours.model.parameters(), reference.model.parameters()):
        assert (p - q).abs().max() < 1e-4


@pytest.mark.parametrize("strategy,params", STRATEGIES)
def test_nodes_packed_on_one_gpu_equal_a_process_per_node(strategy, params):
    packed = run(strategy, params)
    assert packed.summary["per_rank"] and len(packed.metrics) == 6
    close_records(packed, run(strategy, params, nodes_per_process=1))  # a process each: gloo


@pytest.mark.parametrize("strategy,params", STRATEGIES[1:3])
def test_offloaded_nodes_on_the_gpu_give_the_same_records(strategy, params):
    """Each node's state in pinned host memory between its turns (--offload): the same bits."""
    resident, offloaded = run(strategy, params), run(strategy, params, offload=True)
    assert offloaded.metrics == resident.metrics
    for p, q in zip(offloaded.model.parameters(), resident.model.parameters()):
        assert torch.equal(p, q)


@pytest.mark.parametrize("strategy,params", [("ddp", {}), ("diloco", {"H": 2})])
def test_stacked_nodes_on_the_gpu_give_the_unstacked_records(strategy, params):
    """One worker's 4 nodes as one stacked model (--stack-replicas, engine/node/stacked.py):
    the unstacked run's records to float tolerance, the same simulated clock."""
    plain, stacked = run(strategy, params), run(strategy, params, stack_replicas=True)
    close_records(stacked, plain)
    assert [a["sim_time"] for a in stacked.metrics] == [b["sim_time"] for b in plain.metrics]


# The first batch's loss through the run's initial model, with fp32 and with TF32 matmuls,
# in a process of its own (CUDA is never initialized in pytest's).
FIRST_LOSS = """
import json, sys
import torch
from exoframe.config import RunConfig
from exoframe.engine import job_from_config
from exoframe.engine.node.data import Batches
from exoframe.engine.node.loop import to_device
job = job_from_config(RunConfig(**json.loads(sys.argv[1])).validate())
device = torch.device("cuda:0")
batch = to_device(Batches(job.dataset(0, 1, "train"), job.batch_size, job.seed, 0, job.shuffle,
                          job.drop_last).first(), device)
model = job.model.to(device)
losses = []
for tf32 in (False, True):
    torch.backends.cuda.matmul.allow_tf32 = tf32
    losses.append(model(batch).item())
print(json.dumps(losses))
"""


def test_tf32_trains_with_tf32_matmuls():
    wide = dict(n_layer=2, n_embd=256, n_head=4, block_size=64)  # tensor-core shapes
    fields = dict(workload="gpt", workload_params=wide, nodes=1, steps=2, eval_every=2,
                  compute="fixed:10ms", device="cuda:0", shuffle=False)
    done = subprocess.run([sys.executable, "-c", FIRST_LOSS, json.dumps(fields)],
                          capture_output=True, text=True, check=True)
    fp32, tf32 = json.loads(done.stdout)
    assert fp32 != pytest.approx(tf32, rel=1e-7, abs=0)  # TF32 rounds these matmuls
    for precision, reference in (("fp32", fp32), ("tf32", tf32)):
        config = RunConfig(**fields, precision=precision).validate()
        assert execute(job_from_config(config)).metrics[0]["loss"] == \
            pytest.approx(reference, rel=1e-6)


def test_more_nodes_than_the_gpu_holds_are_refused_in_one_line():
    config = RunConfig(workload="gpt", workload_params=dict(n_layer=4, n_embd=1024,
                                                            block_size=32),
                       nodes=1, device="cuda:0").validate()
    need = node_memory(job_from_config(config).model, "adamw")
    memory = Machine.current().gpu_memory[0]
    fits = (memory - GPU_RESERVED_BYTES - need.worker) // need.node
    too_many = dataclasses.replace(config, nodes=math.floor(fits) + 1)
    with pytest.raises(ExoframeError) as refused:
        job_from_config(too_many)
    line = str(refused.value)
    assert "\n" not in line and f"{fits} fit there" in line


def test_a_node_raising_on_the_gpu_stops_the_run_cleanly():
    config = RunConfig(workload="mlp", nodes=6, steps=5, compute="fixed:1ms",
                       device="cuda:0").validate()
    job = dataclasses.replace(job_from_config(config), strategy_cls=FailsOnRankTwo,
                              strategy_params=FailsOnRankTwo.Params())
    assert job.placement.packed
    with pytest.raises(RunStopped, match="rank 2: RuntimeError: rank two broke") as failed:
        execute(job)
    assert isinstance(failed.value.__cause__, RankFailed)
    assert not [p for p in os.listdir("/proc") if p.isdigit()
                and _parent(int(p)) == os.getpid() and _alive(int(p))
                and int(p) not in helper_processes()]


def test_measured_compute_times_each_nodes_turns_on_the_gpu():
    config = RunConfig(workload="gpt", workload_params=SMALL_GPT, nodes=4, steps=4,
                       device="cuda:0", compute="measured").validate()
    result = execute(job_from_config(config))
    # Each node's simulated clock holds its own measured compute beside its exchanges and
    # waits: an accounting identity of simulated seconds, no wall-clock limit (the figures
    # per node: benchmarks/gpu_step_time.py --measured).
    assert result.summary["compute_model"] == "measured"
    ranks = result.summary["per_rank"]
    assert len(ranks) == 4
    for r in ranks:
        assert r["simulated_seconds"] == pytest.approx(
            r["compute_seconds"] + r["comm_seconds"] + r["idle_seconds"])


PARK_ON_THE_GPU = """
import torch
from exoframe.engine.node.offload import OffloadedState
device = torch.device("cuda:0")
model = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.Linear(1024, 1024)).to(device)
optimizer = torch.optim.AdamW(model.parameters())
model(torch.randn(8, 1024, device=device)).sum().backward()
optimizer.step()
tensors = [*model.parameters(), *(p.grad for p in model.parameters()),
           *(v for state in optimizer.state.values() for v in state.values()
             if torch.is_tensor(v) and v.device == device)]
kept = [t.detach().clone() for t in tensors]
state_bytes = sum(t.untyped_storage().nbytes() for t in tensors)
torch.cuda.synchronize()
before = torch.cuda.memory_allocated(device)
parked = OffloadedState(device)
parked.park(tensors, held=set())
torch.cuda.synchronize()
after = torch.cuda.memory_allocated(device)
parked.unpark()
torch.cuda.synchronize()
back = torch.cuda.memory_allocated(device)
same = all(torch.equal(t, k) for t, k in zip(tensors, kept))
print(state_bytes, before - after, back - after, same)
"""


def test_a_parked_nodes_state_leaves_the_gpus_memory_and_comes_back():
    """OffloadedState on a real GPU (in a child process: CUDA stays uninitialized in
    pytest's): parking a model's weights, gradients and AdamW state frees their bytes on the
    device (torch.cuda.memory_allocated drops by them), unparking takes them back, and the
    values are the same bits."""
    import subprocess
    import sys
    done = subprocess.run([sys.executable, "-c", PARK_ON_THE_GPU], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    state_bytes, freed, regrown, same = done.stdout.split()
    assert int(freed) == int(state_bytes) and int(regrown) == int(state_bytes)
    assert same == "True"
