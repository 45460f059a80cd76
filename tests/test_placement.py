"""Where nodes run, decided from the machine's facts passed in as a value: a process per
node, or nodes packed a worker per core (CPU) or per GPU, admitted by the GPU's memory."""
import pytest
import torch

from exoframe.config import RunConfig
from exoframe.engine.plan.cluster_env import ClusterEnv
from exoframe.engine.plan.node_memory import NodeMemory, node_memory
from exoframe.engine.plan.placement import GPU_RESERVED_BYTES, Machine, place
from exoframe.engine.plan.resolve import job_from_config
from exoframe.errors import ExoframeError

GIB = 2**30
CPU = Machine(cores=2)
ONE_GPU = Machine(cores=16, gpu_memory=(80 * GIB,))
TWO_GPUS = Machine(cores=16, gpu_memory=(80 * GIB, 80 * GIB))


def test_on_the_cpu_a_process_per_node_then_a_worker_per_core():
    few = place(8, None, "cpu", False, machine=CPU)
    assert not few.packed and len(few.groups) == 8 and few.backend == "gloo"
    many = place(64, None, "cpu", False, machine=CPU)
    assert many.nodes_per_process == 32 and many.groups == (tuple(range(32)),
                                                            tuple(range(32, 64)))
    assert {many.device_of(r) for r in range(64)} == {torch.device("cpu")}


def test_nodes_sharing_one_gpu_are_one_worker_on_it():
    placement = place(64, None, "cuda:0", False, machine=ONE_GPU)
    assert placement.nodes_per_process == 64 and len(placement.groups) == 1
    assert {placement.device_of(r) for r in range(64)} == {torch.device("cuda", 0)}
    # One node per GPU: a process of its own (nothing to pack).
    assert not place(1, None, "cuda", False, machine=ONE_GPU).packed
    # The node count is no longer capped by the CPU's cores.
    assert place(1024, None, "cuda", False, machine=Machine(cores=2, gpu_memory=(80 * GIB,)),
                 memory=NodeMemory(2**20, 2**20)).nodes_per_process == 1024


def test_two_gpus_a_worker_each_or_a_process_per_node_with_nccl(monkeypatch):
    placement = place(8, None, "cuda", False, machine=TWO_GPUS)
    assert placement.groups == ((0, 1, 2, 3), (4, 5, 6, 7))
    assert [placement.device_of(r).index for r in (0, 3, 4, 7)] == [0, 0, 1, 1]
    # Nodes spread evenly: 9 nodes on 8 GPUs use them all (one has two).
    eight = Machine(cores=16, gpu_memory=(80 * GIB,) * 8)
    nine = place(9, None, "cuda", False, machine=eight)
    assert [len(g) for g in nine.groups] == [2, 1, 1, 1, 1, 1, 1, 1]
    assert sorted({nine.device_of(r).index for r in range(9)}) == list(range(8))
    # Asked for: workers of 3, round-robin over the GPUs.
    asked3 = place(8, 3, "cuda", False, machine=TWO_GPUS)
    assert [asked3.device_of(r).index for r in range(8)] == [0, 0, 0, 1, 1, 1, 0, 0]
    monkeypatch.setattr(torch.distributed, "is_nccl_available", lambda: True)
    own = place(2, None, "cuda", False, machine=TWO_GPUS)
    assert not own.packed and own.backend == "nccl"
    assert [own.device_of(r).index for r in (0, 1)] == [0, 1]
    # Asked for: a process per node, two on each GPU, through gloo.
    asked = place(4, 1, "cuda", False, machine=TWO_GPUS)
    assert asked.backend == "gloo" and [asked.device_of(r).index for r in range(4)] == [0, 1, 0, 1]


def test_a_gpu_with_too_little_memory_is_refused_saying_how_many_fit():
    small = Machine(cores=16, gpu_memory=(80 * GIB, GPU_RESERVED_BYTES + 12 * GIB))
    memory = NodeMemory(node=GIB, worker=2 * GIB)  # the worker's folds: room for 2 nodes
    assert place(10, None, "cuda:1", False, machine=small, memory=memory).packed
    with pytest.raises(ExoframeError) as refused:
        place(11, None, "cuda:1", False, machine=small, memory=memory)
    line = str(refused.value)
    assert "\n" not in line and "11 nodes on GPU 1" in line
    assert "10 fit there, 10 on the GPUs used" in line  # (GPU 0 is not used)
    # An estimate from the model: weights, grads, AdamW's two moments, two strategy copies;
    # a worker's folds of them in float64, the last held model and a float32 copy.
    model = torch.nn.Linear(1000, 1000)
    assert node_memory(model, "adamw") == NodeMemory(6 * 4 * (1000 * 1000 + 1000),
                                                     6 * 4 * (1000 * 1000 + 1000),
                                                     3 * 4 * (1000 * 1000 + 1000))


def test_offloaded_nodes_are_admitted_by_what_stays_on_the_gpu():
    """Under --offload a GPU holds what each node keeps there between turns beside the
    running node's whole state and room for another's; the refusal without it names
    --offload."""
    small = Machine(cores=16, gpu_memory=(GPU_RESERVED_BYTES + 12 * GIB,))
    memory = NodeMemory(node=GIB, worker=2 * GIB, kept=GIB // 8)
    with pytest.raises(ExoframeError, match="10 fit there.*or --offload"):
        place(11, None, "cuda", False, machine=small, memory=memory)
    # 12 GiB less the worker's 2 and the 2 of the running node and room for another: 8 GiB
    # of 1/8 GiB each.
    offloaded = place(64, None, "cuda", False, machine=small, memory=memory, offload=True)
    assert offloaded.offload and offloaded.nodes_per_process == 64
    with pytest.raises(ExoframeError) as refused:
        place(65, None, "cuda", False, machine=small, memory=memory, offload=True)
    line = str(refused.value)
    assert "\n" not in line and "65 nodes on GPU 0 with --offload" in line
    assert "64 fit there" in line
    # Only nodes taking turns on a GPU leave it.
    with pytest.raises(ExoframeError, match="offload: only nodes that take turns on a GPU"):
        place(4, 1, "cuda", False, machine=small, memory=memory, offload=True)
    with pytest.raises(ExoframeError, match="offload: nodes' state moves between a CUDA GPU"):
        place(64, None, "cpu", False, machine=CPU, offload=True)


def test_under_torchrun_a_process_per_rank_and_no_packing():
    env = {"RANK": "0", "WORLD_SIZE": "4", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500",
           "LOCAL_WORLD_SIZE": "4"}
    torchrun = Machine(cores=2, torchrun=ClusterEnv.from_environ(env))
    placement = place(4, None, "cpu", False, machine=torchrun)
    assert not placement.packed and len(placement.groups) == 4
    assert not place(64, None, "cpu", False, machine=torchrun).packed
    with pytest.raises(ExoframeError, match="nodes_per_process: under torchrun"):
        place(4, 2, "cpu", False, machine=torchrun)


@pytest.mark.parametrize("fields,message", [
    ({"device": "cuda"}, "device: 'cuda' asked for, but torch sees no CUDA GPU here"),
    ({"device": "mps", "nodes_per_process": 2}, "device: 'mps' asked for"),
])
def test_a_gpu_asked_for_where_there_is_none_is_one_line(fields, message):
    if torch.cuda.device_count():
        pytest.skip("this machine has a GPU")
    with pytest.raises(ExoframeError, match=message) as refused:
        job_from_config(RunConfig(workload="mlp", **fields).validate())
    assert "\n" not in str(refused.value)
