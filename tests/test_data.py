"""Bring your data: partitions of the training set, token and text files, the image
workload, a workload from a file anywhere, and bad data as one line."""
import json
import shutil

import numpy as np
import pytest
import torch
from conftest import REPO

from exoframe.config import RunConfig
from exoframe.engine.node.data import Batches
from exoframe.engine.plan.resolve import build_job, job_from_config, load_workload
from exoframe.errors import ExoframeError
from exoframe.partition import parse_partition, partition_indices
from exoframe.plugins import get_plugin_manager
from exoframe.workloads.base import shard_factory
from exoframe.workloads.gpt import gpt
from exoframe.workloads.image import image
from torch.utils.data import TensorDataset

IMAGE = dict(train_examples=2000, val_examples=200)
IMAGE_FLAGS = [a for k, v in IMAGE.items() for a in ("-w", f"{k}={v}")]


def run_summary(cli, *args):
    proc = cli("run", "--steps", "2", "--out", "runs", *args)
    assert proc.returncode == 0, proc.stderr_text
    (run,) = (cli.cwd / "runs").iterdir()
    return json.loads((run / "summary.json").read_text())


def shard_values(job, rank):
    """A rank's whole training shard, read the way the rank reads it (in order)."""
    shard = job.dataset(rank, job.nodes, "train")
    batches = Batches(shard, len(shard), seed=0, rank=rank, shuffle=False)
    return next(batches)


def test_iid_gives_the_equal_contiguous_shards_it_always_gave():
    job = job_from_config(RunConfig(workload="mlp", nodes=3, steps=2,
                                    workload_params={"train_examples": 1000}))
    whole = load_workload("mlp", {"train_examples": 1000}, get_plugin_manager()).dataset.train
    x, y = whole.tensors
    for rank in range(3):
        lo, hi = rank * 333, (rank + 1) * 333  # n // nodes each, in order
        shard_x, shard_y = shard_values(job, rank)
        assert torch.equal(shard_x, x[lo:hi]) and torch.equal(shard_y, y[lo:hi])
    assert job.partition["sizes"] == [333, 333, 333]
    assert job.partition["label_histograms"] == [
        torch.bincount(y[r * 333:(r + 1) * 333], minlength=10).tolist() for r in range(3)]


def expected_dirichlet_histograms(labels, nodes, alpha, seed):
    """The draw, made here: class c's examples split over the nodes in proportions
    p ~ Dirichlet(alpha), node i getting floor(n_c (p_1+..+p_i)) - floor(n_c (p_1+..+p_{i-1}))
    (the last node the rest); drawn again while some node would get nothing."""
    rng = np.random.default_rng(seed)
    class_sizes = np.bincount(labels)
    while True:
        shares = rng.dirichlet([alpha] * nodes, size=len(class_sizes))
        histograms = np.zeros((nodes, len(class_sizes)), dtype=int)
        for c, n in enumerate(class_sizes):
            bounds = [0] + [int(n * s) for s in np.cumsum(shares[c])[:-1]] + [n]
            histograms[:, c] = np.diff(bounds)
        if histograms.sum(1).min() > 0:
            return histograms


def test_dirichlet_on_image_with_8_nodes_gives_the_draws_label_histograms(cli):
    seed = 3
    summary = run_summary(cli, "--workload", "image", *IMAGE_FLAGS, "--nodes", "8",
                          "--nodes-per-process", "4",
                          "--partition", "dirichlet:0.1", "--seed", str(seed))
    labels = image(**IMAGE).dataset.train.tensors[1].numpy()
    expected = expected_dirichlet_histograms(labels, 8, 0.1, seed)
    assert summary["partition"]["label_histograms"] == expected.tolist()
    assert summary["partition"]["sizes"] == expected.sum(1).tolist()
    # The skew a Dirichlet(0.1) gives: most of each class on one or two nodes.
    top_two = np.sort(expected, axis=0)[-2:].sum(0) / expected.sum(0)
    assert top_two.mean() > 0.8, top_two
    # ... and what each rank reads is that histogram.
    job = job_from_config(RunConfig(workload="image", workload_params=IMAGE, nodes=8, steps=2,
                                    partition="dirichlet:0.1", seed=seed))
    for rank in range(8):
        _, y = shard_values(job, rank)
        assert torch.bincount(y, minlength=10).tolist() == expected[rank].tolist()


def test_label_shards_and_power_law_quantities():
    labels = np.repeat(np.arange(10), 100)
    parts = partition_indices(parse_partition("shards:2"), 1000, 5, labels, seed=1)
    assert sorted(np.concatenate(parts).tolist()) == list(range(1000))  # 10 shards of 100
    for part in parts:  # a shard of 100 sorted labels is one class here
        assert len(part) == 200 and len(np.unique(labels[part])) <= 2
    sizes = [len(p) for p in partition_indices(parse_partition("quantity:1"), 1000, 4, None, 1)]
    ideal = 1 + 996 / (1 + 1 / 2 + 1 / 3 + 1 / 4) / np.arange(1, 5)  # 1 + share of n - nodes
    assert sum(sizes) == 1000
    assert np.abs(np.sort(sizes)[::-1] - ideal).max() <= 1, sizes


def test_gpt_domains_give_each_node_its_own_markov_source():
    params = dict(domains=4, n_layer=1, n_embd=32, block_size=16, train_tokens=8000,
                  val_tokens=800)
    job = job_from_config(RunConfig(workload="gpt", workload_params=params, nodes=4, steps=2,
                                    partition="shards:1"))
    histograms = job.partition["label_histograms"]
    assert sorted(int(np.argmax(h)) for h in histograms) == [0, 1, 2, 3]
    assert all(sorted(h)[:3] == [0, 0, 0] for h in histograms)  # one domain each
    # Domains are different sources: symbol statistics differ between two nodes.
    counts = [torch.bincount(shard_values(job, r)[0].ravel(), minlength=32).float()
              for r in range(2)]
    assert (counts[0] / counts[0].sum() - counts[1] / counts[1].sum()).abs().sum() > 0.2


def write_tokens(path, tokens, dtype=np.uint16):
    np.asarray(tokens, dtype=dtype).tofile(path)
    return path


def test_each_rank_reads_the_files_tokens_at_its_shards_positions(tmp_path):
    tokens = np.random.default_rng(0).integers(0, 300, 30_001)
    data = write_tokens(tmp_path / "train.bin", tokens)
    workload = gpt(data=str(data), block_size=16)
    T, windows = 16, (30_001 - 1) // 16
    held_out = windows // 10
    per_rank = (windows - held_out) // 3
    for rank in range(3):
        batches = Batches(workload.dataset(rank, 3, "train"), 7, seed=1, rank=rank,
                          drop_last=False)  # shuffled: one epoch holds every window once
        rows = torch.cat([next(batches)[0] for _ in range(-(-per_rank // 7))]).tolist()
        first = rank * per_rank * T  # the shard's windows start every T tokens from here
        expected = [tokens[first + j * T:first + j * T + T + 1].tolist() for j in range(per_rank)]
        assert sorted(rows) == sorted(expected) and rows != expected
    val = workload.dataset(0, 1, "val")
    assert len(val) == held_out
    assert val[0][0].tolist() == tokens[(windows - held_out) * T:][:T + 1].tolist()
    model = workload.build_model()
    assert model.token_emb.num_embeddings == tokens.max() + 1  # the vocabulary from the data


def test_text_files_char_and_byte_level(tmp_path):
    text = "héllo wörld, " * 200
    (tmp_path / "a.txt").write_text(text, encoding="utf-8")
    chars = sorted(set(text))
    for tokenizer, vocab, decode in (("char", len(chars), lambda t: "".join(chars[i] for i in t)),
                                     ("byte", 256, lambda t: bytes(t).decode("utf-8", "ignore"))):
        workload = gpt(data=str(tmp_path / "a.txt"), tokenizer=tokenizer, block_size=8)
        first = workload.dataset(0, 1, "train")[0][0].tolist()
        assert text.startswith(decode(first)[:6]), (tokenizer, decode(first))
        assert workload.build_model().token_emb.num_embeddings == vocab


def test_a_token_file_trains_packed_nodes(cli):
    write_tokens(cli.cwd / "train.bin", np.random.default_rng(0).integers(0, 64, 40_000))
    write_tokens(cli.cwd / "val.bin", np.random.default_rng(1).integers(0, 64, 4_000))
    summary = run_summary(cli, "--workload", "gpt", "-w", "data=train.bin", "-w",
                          "val_data=val.bin", "-w", "block_size=16", "-w", "n_layer=1",
                          "--nodes", "4", "--nodes-per-process", "2", "--eval-every", "1")
    assert summary["partition"]["sizes"] == [(40_000 - 1) // 16 // 4] * 4
    assert np.isfinite(summary["final_val_loss"]) and summary["tokens_seen"] == 4 * 2 * 16 * 16


def test_a_workload_file_or_module_from_a_folder_outside_the_repository(cli):
    assert REPO not in cli.cwd.parents
    (cli.cwd / "wl").mkdir()
    shutil.copy(REPO / "examples" / "my_workload.py", cli.cwd / "wl" / "mywl.py")
    shutil.copy(REPO / "examples" / "my_workload.py", cli.cwd / "nearby.py")
    env = {"PYTHONPATH": str(REPO)}  # not the current folder: exoframe must look there
    for spec in ("wl/mywl.py:make", "nearby:make"):
        proc = cli("run", "--workload", spec, "--steps", "2", "--out", "runs", env=env)
        assert proc.returncode == 0, proc.stderr_text
    assert len(list((cli.cwd / "runs").iterdir())) == 2


@pytest.mark.parametrize("args, expected", [
    (["-w", "data=missing.bin"], "data: no such file or folder 'missing.bin'"),
    (["-w", "data=odd.bin"], "'odd.bin' has 1001 bytes, not a whole number of uint16 tokens"),
    (["--partition", "dirichlet:0.1"], "partition: dirichlet:0.1 splits by label, and this "
                                       "training set has none"),
    (["--partition", "dirichlet:-1"], "partition: dirichlet:ALPHA needs a number ALPHA > 0"),
])
def test_bad_data_is_one_line_before_anything_starts(cli, args, expected):
    (cli.cwd / "odd.bin").write_bytes(bytes(1001))
    proc = cli("run", "--workload", "gpt", "--steps", "2", "--out", "runs", *args)
    lines = proc.stderr_text.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and expected in lines[0], proc.stderr_text
    assert not (cli.cwd / "runs").exists() and cli.leftovers() == []


def test_partitions_that_cannot_be_made_name_the_fix():
    labels = np.arange(6) % 2
    with pytest.raises(ExoframeError, match="fewer than the 8 nodes"):
        partition_indices(parse_partition("quantity:1"), 6, 8, labels, 0)
    with pytest.raises(ExoframeError, match="shards:2 cuts 4 nodes x 2 = 8 shards from 6"):
        partition_indices(parse_partition("shards:2"), 6, 4, labels, 0)
    per_rank = load_workload("mlp", {}, get_plugin_manager())
    per_rank.dataset = lambda rank, nodes, split: TensorDataset(torch.zeros(4, 1))
    with pytest.raises(ExoframeError, match="gives each rank its data itself"):
        build_job(RunConfig(workload="mlp", partition="shards:1"), per_rank,
                  per_rank.build_model())
    with pytest.raises(ExoframeError, match="must be one integer per example"):
        shard_factory(TensorDataset(torch.zeros(4)), labels=np.zeros(3, int)).labels()
