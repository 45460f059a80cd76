"""exoframe-demo: the chunked DCT, the bytes per step against the closed form, training."""
import math

import pytest
import torch
from torch.utils.data import TensorDataset

import exoframe
from exoframe.plugins import PluginManager
from exoframe_demo import DCTChunks, payload_bytes


def test_demo_is_registered_by_its_package():
    entry = PluginManager().strategies.get("demo")
    assert entry.source == "exoframe-demo"


@pytest.mark.parametrize("shape", [(37,), (10, 70), (8, 3, 3, 3), ()])
def test_all_components_decode_back_to_the_momentum(shape):
    codec = DCTChunks(shape, chunk=8, k=64)  # k = every component of an 8×8 chunk
    x = torch.randn(shape)
    indices, values = codec.top_k(codec.encode(x))
    assert torch.allclose(codec.decode(codec.dense(indices, values)), x, atol=1e-5)


def test_sent_components_leave_the_momentum_and_energy_is_kept():
    codec = DCTChunks((16, 24), chunk=8, k=5)  # whole chunks: the DCT is orthonormal
    m = torch.randn(16, 24)
    indices, values = codec.top_k(codec.encode(m))
    sent = codec.decode(codec.dense(indices, values))
    residual = m - sent
    assert torch.allclose(codec.encode(residual).gather(1, indices), torch.zeros(6, 5), atol=1e-5)
    assert math.isclose(m.square().sum(), sent.square().sum() + residual.square().sum(),
                        rel_tol=1e-5)
    kept = codec.encode(residual).abs().max(dim=1).values
    assert (kept <= values.abs().min(dim=1).values + 1e-6).all()  # the largest were sent


def test_gathered_picks_average_over_the_ranks_that_sent_them():
    codec = DCTChunks((4,), chunk=4, k=2)
    indices = torch.tensor([[[0, 1]], [[1, 3]]])  # (ranks, chunks, k)
    values = torch.tensor([[[2.0, 4.0]], [[6.0, -1.0]]])
    assert codec.mean(indices, values).tolist() == [[2.0, 5.0, 0.0, -1.0]]


class TinyConvNet(torch.nn.Module):
    """Conv (4-D weight, 1-D bias) + linear (2-D weight, 1-D bias) on 1×8×8 images."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(1, 4, 3)
        self.linear = torch.nn.Linear(4 * 6 * 6, 3)

    def forward(self, batch):
        x, y = batch
        hidden = torch.relu(self.conv(x)).flatten(1)
        return torch.nn.functional.cross_entropy(self.linear(hidden), y)


def images(n=2048):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 1, 8, 8, generator=g)
    teacher = torch.randn(64, 3, generator=g)
    return TensorDataset(x, (x.flatten(1) @ teacher).argmax(1))


def fit(nodes, steps, **params):
    torch.manual_seed(0)
    trainer = exoframe.Trainer(TinyConvNet(), images(), batch_size=32)
    return trainer.fit(strategy="demo", num_nodes=nodes, steps=steps, lr=1e-2,
                       strategy_params=params, eval_every=steps)


def test_bytes_per_step_equal_the_closed_form():
    chunk, k, nodes = 8, 5, 3
    # P = Σ ceil(rows/b1)·ceil(cols/b2)·min(k, b1·b2)·(4 + 2), b = min(chunk, dim):
    expected = (1 * 2 * 5      # conv weight (4,1,3,3) → (4, 9): chunks 4×8, 1·2 of them
                + 1 * 1 * 4    # conv bias (4,) → (1, 4): one chunk of 4 < k
                + 1 * 18 * 5   # linear weight (3, 144): chunks 3×8, 1·18 of them
                + 1 * 1 * 3    # linear bias (3,) → (1, 3)
                ) * 6
    assert expected == payload_bytes([p.shape for p in TinyConvNet().parameters()], chunk, k)
    result = fit(nodes, steps=4, chunk=chunk, k=k)
    assert result.summary["bytes_sent_per_node_per_step"] == (nodes - 1) * expected
    assert result.summary["bytes_sent_per_rank"] == [4 * (nodes - 1) * expected] * nodes


def test_demo_trains_a_conv_and_linear_model():
    result = fit(nodes=2, steps=80, chunk=8, k=8)
    losses = [row["loss"] for row in result.metrics]
    first, last = sum(losses[:10]) / 10, sum(losses[-10:]) / 10
    assert last < 0.7 * first, (first, last)
