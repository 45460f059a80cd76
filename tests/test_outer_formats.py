"""Outer-gradient formats (strategies/quantizers.py) and Muon as the inner optimizer (MuLoCo),
against references written here from the formats' definitions and the papers' equations,
with real rank processes."""
import copy
import json
import math

import numpy as np
import pytest
import torch
from torch.nn.utils import parameters_to_vector, vector_to_parameters

import exoframe
from conftest import SMALL_GPT, SMALL_GPT_FLAGS
from exoframe.errors import ExoframeError
from exoframe.strategies.muon import hidden_matrices, muon_with_rule
from exoframe.strategies.quantizers import FORMATS, quantize
from exoframe.workloads.gpt import gpt
from exoframe.workloads.mlp import mlp
from test_equivalence import SHARD, all_data, fit, fresh_model, max_diff, per_rank
from test_strategy_catalogue import N_PARAMS, bytes_per_step, ring_all_reduce

# The test model's rows: the last dimension of each matrix (16×6 weight, 1×16 weight) and
# each value of a bias (16, 1) on its own.
ROWS = [6] * 16 + [1] * 16 + [16, 1]


def reference_format(values: np.ndarray, fmt: str) -> tuple[np.ndarray, int]:
    """Each format from its definition, in numpy float64 (a second implementation)."""
    m = len(values)
    if fmt == "none":
        return values, 4 * m
    if fmt == "bf16":
        return torch.tensor(values, dtype=torch.float32).bfloat16().double().numpy(), 2 * m
    if fmt in ("int8", "int4"):
        levels = 127 if fmt == "int8" else 7
        scale = np.abs(values).max() / levels
        return np.clip(np.round(values / scale), -levels, levels) * scale, \
            (m if fmt == "int8" else (m + 1) // 2) + 4
    if fmt == "fp8-row":  # torchft: fp32 scale 448 / max |row|, e4m3(v · scale) / scale
        out, at = [], 0
        for length in ROWS:
            row = torch.tensor(values[at:at + length], dtype=torch.float32)
            scale = torch.tensor(448.0) / row.abs().max()
            out.append(((row * scale).to(torch.float8_e4m3fn).float() / scale).double().numpy())
            at += length
        return np.concatenate(out), m + 4 * len(ROWS)
    if fmt == "fp4-e3m0":
        scale = np.abs(values).max()
        grid = np.array([0.0] + [2.0 ** e for e in range(-6, 1)])  # nearest in log2
        out = []
        for v in values:
            r = abs(v) / scale
            mag = 0.0 if r < 2 ** -6.5 else 2.0 ** np.clip(np.round(np.log2(r)), -6, 0)
            assert mag in grid
            out.append(np.sign(v) * mag * scale)
        return np.array(out), (m + 1) // 2 + 4
    if fmt == "2bit-6sigma":  # templar's TopKCompressor with 4 bins over a range of 6σ
        mu = values.mean()
        centred = values - mu
        step = 6 * np.sqrt((centred ** 2).sum() / (m - 1)) / 4
        code = np.clip(np.round(centred / step + 2), 0, 3)
        return np.array([mu + centred[code == c].mean() for c in code]), -(-m // 4) + 20
    if fmt in ("int8-codebook", "2bit"):
        bins = 256 if fmt == "int8-codebook" else 4
        if fmt == "2bit":
            low, high = -np.abs(values).max(), np.abs(values).max()
        else:
            low, high = values.mean() - 6 * values.std(), values.mean() + 6 * values.std()
        index = np.clip(np.floor((values - low) / ((high - low) / bins)), 0, bins - 1)
        decoded = np.array([values[index == i].mean() for i in index])
        return decoded, (m + 1024 if bins == 256 else -(-m // 4) + 16)
    raise AssertionError(fmt)


@pytest.mark.parametrize("fmt", FORMATS)
def test_each_format_decodes_as_its_definition_says_and_counts_its_encoded_size(fmt):
    values = torch.randn(N_PARAMS, generator=torch.Generator().manual_seed(3)) * 0.01
    decoded, size = quantize(values, fmt, ROWS)
    expected, expected_size = reference_format(values.double().numpy(), fmt)
    assert size == expected_size
    assert np.abs(decoded.double().numpy() - expected).max() <= 1e-6 * np.abs(expected).max()
    if fmt in ("int8-codebook", "2bit", "2bit-6sigma"):  # a bin decodes to its values' mean
        assert decoded.sum().item() == pytest.approx(values.sum().item(), abs=1e-6)


# -- bytes per sync against closed forms ------------------------------------------------------

CLOSED_FORMS = {"none": 4 * N_PARAMS, "bf16": 2 * N_PARAMS, "int8": N_PARAMS + 4,
                "int4": math.ceil(N_PARAMS / 2) + 4, "fp8-row": N_PARAMS + 4 * len(ROWS),
                "fp4-e3m0": math.ceil(N_PARAMS / 2) + 4, "int8-codebook": N_PARAMS + 1024,
                "2bit": math.ceil(N_PARAMS / 4) + 16, "2bit-6sigma": math.ceil(N_PARAMS / 4) + 20}


@pytest.mark.parametrize("fmt", ["int8", "fp8-row", "fp4-e3m0", "int8-codebook", "2bit",
                                 "2bit-6sigma"])
def test_diloco_sends_its_outer_gradient_at_the_formats_size(fmt):
    result = fit("diloco", 4, steps=6, optimizer="adamw", lr=0.01, H=3, quantizer=fmt)
    per_sync = ring_all_reduce(4, CLOSED_FORMS[fmt])
    assert bytes_per_step(result) == [0, 0, per_sync] * 2
    assert max_diff(result.model, fresh_model()) > 1e-3


def test_streaming_and_sparta_diloco_take_the_same_option():
    streaming = fit("streaming-diloco", 4, steps=6, optimizer="adamw", lr=0.01, H=3,
                    fragments=1, tau=0, alpha=0.0, quantizer="int8-codebook")
    assert bytes_per_step(streaming) == [0, 0, ring_all_reduce(4, N_PARAMS + 1024)] * 2
    sparta = fit("sparta-diloco", 4, steps=6, optimizer="adamw", lr=0.01, H=3, p=0.0,
                 quantizer="fp4-e3m0")
    assert bytes_per_step(sparta) == [0, 0, ring_all_reduce(4, CLOSED_FORMS["fp4-e3m0"])] * 2


def test_a_bad_format_is_named():
    with pytest.raises(ExoframeError, match="'quantizer' must be one of none, bf16, int8"):
        fit("diloco", 2, quantizer="int3")
    with pytest.raises(ExoframeError, match="give 'quantizer' or 'bits', not both"):
        fit("streaming-diloco", 2, bits=8, quantizer="int8")


# -- a DiLoCo reference, written from the equations -------------------------------------------

def reference_diloco(nodes, rounds, H, inner, compress=None, outer_lr=0.7, outer_momentum=0.9,
                     reduce=None):
    """DiLoCo: each replica runs H steps of `inner` on its shard from θ; Δ_r = θ − θ_r is
    sent as compress(r, Δ_r); the ranks receive reduce(the messages) (default: their mean);
    m ← μm + mean; θ ← θ − lr(mean + μm) (Nesterov)."""
    x, y = all_data(nodes)
    replicas = [fresh_model() for _ in range(nodes)]
    optimizers = [inner(m) for m in replicas]
    theta = parameters_to_vector(replicas[0].parameters()).detach().clone()
    momentum = torch.zeros_like(theta)
    for _ in range(rounds):
        sent = []
        for r, (model, opt) in enumerate(zip(replicas, optimizers)):
            shard = slice(r * SHARD, (r + 1) * SHARD)
            for _ in range(H):
                model((x[shard], y[shard])).backward()
                opt.step()
                opt.zero_grad()
            delta = theta - parameters_to_vector(model.parameters()).detach()
            sent.append(compress(r, delta) if compress else delta)
        mean = reduce(sent) if reduce else sum(sent) / nodes
        momentum = outer_momentum * momentum + mean
        theta = theta - outer_lr * (mean + outer_momentum * momentum)
        for model in replicas:
            vector_to_parameters(theta.clone(), model.parameters())  # no shared storage
    return replicas[0]


@pytest.mark.parametrize("nodes", [2, 4])
def test_diloco_with_int4_and_error_feedback_equals_the_reference(nodes):
    residual = {}

    def compress(r, delta):  # e ← (Δ + e) − Q(Δ + e), Q: int4 with one scale
        corrected = delta + residual.get(r, 0)
        scale = corrected.abs().max() / 7
        sent = torch.round(corrected / scale).clamp(-7, 7) * scale
        residual[r] = corrected - sent
        return sent

    adamw = lambda m: torch.optim.AdamW(m.parameters(), lr=0.01, weight_decay=0.0)
    reference = reference_diloco(nodes, 3, 3, adamw, compress)
    result = fit("diloco", nodes, steps=9, optimizer="adamw", lr=0.01, H=3, quantizer="int4",
                 error_feedback=True)
    assert max_diff(result.model, reference) <= 1e-6
    plain = fit("diloco", nodes, steps=9, optimizer="adamw", lr=0.01, H=3, quantizer="int4")
    assert max_diff(plain.model, reference) > 1e-5  # the feedback changed the numbers


# -- fp8-row against torchft's quantized all-reduce -----------------------------------------------

def fp8_and_back(rows):
    """torchft's per-row fp8 (fused_quantize_into_fp8, fused_dequantize_from_fp8): fp32 scale
    448 / max |row|, 1 for a zero row; e4m3(x · scale) / scale."""
    scale = 448.0 / rows.abs().amax(dim=1, keepdim=True)
    scale = torch.where(torch.isinf(scale), torch.ones_like(scale), scale)
    return (rows * scale).to(torch.float8_e4m3fn).float() / scale


def torchft_mean(sent, nodes, second=True):
    """Manager.allreduce(should_quantize=True) of each parameter: allreduce_quantized with
    SUM, then a division by the participants. The kernels see a matrix, or a 1-D tensor as a
    column; each rank quantizes its rows; the rank owning a slice of ceil(rows/n) rows sums
    everyone's dequantized rows, its own first, quantizes the sum again (`second`) and
    all-gathers it."""
    out, at = [], 0
    for p in fresh_model().parameters():
        rows = [fp8_and_back(d[at:at + p.numel()].view(p.shape[0], -1)) for d in sent]
        per_owner = -(-rows[0].shape[0] // nodes)
        total = torch.zeros_like(rows[0])
        for i in range(rows[0].shape[0]):
            owner = i // per_owner
            for k in range(nodes):
                total[i] += rows[(owner + k) % nodes][i]
        out.append(((fp8_and_back(total) if second else total) / nodes).flatten())
        at += p.numel()
    return torch.cat(out)


@pytest.mark.parametrize("nodes", [2, 4])
def test_diloco_with_fp8_rows_equals_torchfts_quantized_all_reduce(nodes):
    adamw = lambda m: torch.optim.AdamW(m.parameters(), lr=0.01, weight_decay=0.0)
    reference = reference_diloco(nodes, 3, 3, adamw, reduce=lambda d: torchft_mean(d, nodes))
    result = fit("diloco", nodes, steps=9, optimizer="adamw", lr=0.01, H=3, quantizer="fp8-row")
    assert max_diff(result.model, reference) <= 1e-6
    once = reference_diloco(nodes, 3, 3, adamw, reduce=lambda d: torchft_mean(d, nodes, False))
    assert max_diff(result.model, once) > 1e-4  # the second quantization counts


# -- MuLoCo: DiLoCo with Muon inner steps ------------------------------------------------------

def newton_schulz(g):
    """MuLoCo's reference orthogonalization (muon.py zeropower_via_newtonschulz5), fp32."""
    coefficients = [(4.0848, -6.8946, 2.9270), (3.9505, -6.3029, 2.6377),
                    (3.7418, -5.5913, 2.3037), (2.8769, -3.1427, 1.2046),
                    (2.8366, -3.0525, 1.2012)]
    x = g.T if g.shape[0] > g.shape[1] else g
    x = x / (torch.linalg.matrix_norm(x) + 1e-8)
    for a, b, c in coefficients:
        gram = x @ x.T
        x = a * x + (b * gram + c * gram @ gram) @ x
    return x.T if g.shape[0] > g.shape[1] else x


class ReferenceMuLoCoInner:
    """MuLoCo's inner step: the hidden matrix (the 16×6 first layer; the 1×16 output layer is
    the head) takes Muon, M ← μM + G, W ← W − lr·sqrt(fan_out/fan_in)·NS(M); the rest AdamW
    with betas (0.9, 0.95)."""

    def __init__(self, model, lr, adjust=lambda fan_out, fan_in: math.sqrt(fan_out / fan_in)):
        self.hidden = model.net[0].weight
        self.lr, self.buffer, self.adjust = lr, torch.zeros_like(self.hidden), adjust
        rest = [p for p in model.parameters() if p is not self.hidden]
        self.adamw = torch.optim.AdamW(rest, lr=lr, betas=(0.9, 0.95), weight_decay=0.0)

    @torch.no_grad()
    def step(self):
        self.buffer = 0.95 * self.buffer + self.hidden.grad
        fan_out, fan_in = self.hidden.shape
        self.hidden -= self.lr * self.adjust(fan_out, fan_in) * newton_schulz(self.buffer)
        self.adamw.step()

    def zero_grad(self):
        self.hidden.grad = None
        self.adamw.zero_grad()


@pytest.mark.parametrize("nodes", [2, 4])
def test_diloco_with_muon_is_muloco(nodes):
    lr = 0.02
    first_outer_step = reference_diloco(nodes, 1, 3, lambda m: ReferenceMuLoCoInner(m, lr))
    result = fit("diloco", nodes, steps=3, optimizer="muon", lr=lr, H=3)
    assert max_diff(result.model, first_outer_step) <= 1e-6
    three_rounds = reference_diloco(nodes, 3, 3, lambda m: ReferenceMuLoCoInner(m, lr))
    result = fit("diloco", nodes, steps=9, optimizer="muon", lr=lr, H=3)
    assert max_diff(result.model, three_rounds) <= 1e-6
    assert max_diff(result.model, fit("diloco", nodes, steps=9, optimizer="adamw", lr=lr,
                                      H=3).model) > 1e-3


def test_muon_options_reach_it_and_a_bad_one_is_named():
    trainer = exoframe.Trainer(fresh_model(), per_rank, batch_size=SHARD)
    run = dict(strategy="diloco", num_nodes=2, steps=3, optimizer="muon", lr=0.02,
               strategy_params={"H": 3}, eval_every=1000)
    original = trainer.fit(**run, optimizer_params={"adjust_lr": "original"})
    reference = reference_diloco(2, 1, 3, lambda m: ReferenceMuLoCoInner(
        m, 0.02, lambda fan_out, fan_in: math.sqrt(max(1, fan_out / fan_in))))
    assert max_diff(original.model, reference) <= 1e-6
    with pytest.raises(ExoframeError, match="optimizer 'muon'.*adjust"):
        trainer.fit(**run, optimizer_params={"adjust": "original"})


def test_the_default_rule_gives_muon_the_hidden_matrices_of_every_workload():
    gpt_model = gpt(**SMALL_GPT).build_model()
    chosen = {n for n, p in gpt_model.named_parameters() if hidden_matrices(n, p, gpt_model)}
    assert chosen == {"blocks.0.qkv.weight", "blocks.0.proj.weight", "blocks.0.mlp.0.weight",
                      "blocks.0.mlp.2.weight"}  # not the embeddings (the head is tied to one)
    mlp_model = mlp().build_model()
    chosen = {n for n, p in mlp_model.named_parameters() if hidden_matrices(n, p, mlp_model)}
    assert chosen == {"net.0.weight", "net.2.weight"}  # net.4 is the output head


def test_a_plugin_rule_makes_another_split():
    model = fresh_model()
    nothing = muon_with_rule(lambda name, p, m: False)(model.parameters(), lr=0.01, model=model)
    twin = fresh_model()
    adamw = torch.optim.AdamW(twin.parameters(), lr=0.01, betas=(0.9, 0.95), weight_decay=0.0)
    x, y = all_data(1)
    for opt, m in ((nothing, model), (adamw, twin)):
        for _ in range(3):
            m((x, y)).backward()
            opt.step()
            opt.zero_grad()
    assert max_diff(model, twin) == 0


@pytest.mark.parametrize("workload,flags", [("gpt", SMALL_GPT_FLAGS), ("mlp", [])])
def test_exoframe_run_diloco_with_muon_on_every_builtin_workload(cli, workload, flags):
    proc = cli("run", "--workload", workload, *flags, "--strategy", "diloco", "--optimizer",
               "muon", "-p", "H=2", "--steps", "4", "--nodes", "2", "--compute", "fixed:1ms")
    assert proc.returncode == 0, proc.stderr_text
    summary = json.loads(next((cli.cwd / "runs").glob("*/summary.json")).read_text())
    assert summary["status"] == "completed" and math.isfinite(summary["final_val_loss"])


# -- SparseLoCo -----------------------------------------------------------------------------------

def reference_sparseloco_outer(nodes, chunk, topk, beta=0.95, alpha=1.0):
    """SparseLoCo's outer step from its equations: e ← βe + Δ, Δ̂ = Q(TopK(e)) per chunk with
    Q the 2-bit codebook (reference_format), e ← e − Δ̂, θ ← θ − α·mean(Δ̂)."""
    residual = {r: 0 for r in range(nodes)}
    sent = {}

    def compress(r, delta):
        e = beta * residual[r] + delta
        picked = []
        for start in range(0, len(e), chunk):
            part = e[start:start + chunk].abs()
            picked.extend((start + torch.argsort(part, descending=True)[:topk]).tolist())
        index = torch.tensor(picked)
        decoded, _ = reference_format(e[index].double().numpy(), "2bit")
        sparse = torch.zeros_like(e)
        sparse[index] = torch.tensor(decoded, dtype=e.dtype)
        residual[r] = e - sparse
        sent[r] = sparse
        return sparse

    return compress


@pytest.mark.parametrize("nodes", [2, 4])
def test_sparseloco_flat_equals_its_equations_and_sends_the_closed_form(nodes):
    compress = reference_sparseloco_outer(nodes, chunk=32, topk=4)
    adamw = lambda m: torch.optim.AdamW(m.parameters(), lr=0.01, weight_decay=0.0)
    reference = reference_diloco(nodes, 3, 3, adamw, compress, outer_lr=1.0, outer_momentum=0.0)
    result = fit("sparseloco", nodes, steps=9, optimizer="adamw", lr=0.01, H=3, layout="flat",
                 chunk=32, topk=4, quantizer="2bit")
    assert max_diff(result.model, reference) <= 1e-6
    assert max_diff(result.model, fresh_model()) > 1e-3
    # 129 values in chunks of 32, 32, 32, 32, 1: K = 17 values, 2-bit (ceil(17/4) + a codebook
    # of 4 fp32) and 5-bit indices for 16 of them (none in a chunk of 1); the ring all-gather
    # sends R − 1 messages.
    message = (math.ceil(17 / 4) + 16) + math.ceil(16 * 5 / 8)
    assert bytes_per_step(result) == [0, 0, (nodes - 1) * message] * 3


def authors_sparseloco(nodes, chunk, topk, beta=0.95):
    """SparseLoCo as its authors' code runs it (tplr-ai/templar c2397ac, src/tplr/compress.py:
    ChunkingTransformer, TopKCompressor with 4 bins over 6σ; src/tplr/neurons.py:
    prepare_gradient_dict, outer_step), a tensor at a time, with loops: (compress, reduce)
    for reference_diloco."""
    shapes = [p.shape for p in fresh_model().parameters()]
    residual, sent = {}, {}

    def side(n):  # _get_smaller_split: the largest divisor of n not above chunk
        return [d for d in range(1, n + 1) if n % d == 0 and d <= chunk][-1]

    def code(v):  # _quantize_values, then _dequantize_values
        shift = v.mean()
        centred = v - shift
        std = centred.norm() / math.sqrt(v.numel() - 1) if v.numel() > 1 else torch.tensor(0.0)
        scale = 6 * std / 4
        if scale == 0 or not torch.isfinite(scale):
            scale = torch.tensor(1.0)
        q = (centred / scale + 2).round().clamp(0, 3)
        lookup = {b: centred[q == b].mean() for b in q.unique().tolist()}
        return torch.stack([lookup[b] for b in q.tolist()]) + shift

    def compress(r, delta):
        e = beta * residual.get(r, 0) + delta
        dense, mask, at = torch.zeros_like(e), torch.zeros_like(e, dtype=torch.bool), 0
        for shape in shapes:
            numel = math.prod(shape)
            if len(shape) == 1:  # a 1-D tensor goes whole
                chosen = list(range(at, at + numel))
            else:
                rows, cols = shape
                h, w = side(rows), side(cols)
                chosen = []
                for i in range(rows // h):
                    for j in range(cols // w):
                        cells = [at + (i * h + a) * cols + j * w + b
                                 for a in range(h) for b in range(w)]
                        order = torch.argsort(e[cells].abs(), descending=True)
                        chosen += [cells[k] for k in order[:topk].tolist()]
            dense[chosen] = code(e[chosen])
            mask[chosen] = True
            at += numel
        residual[r], sent[r] = e - dense, (dense, mask)
        return dense

    def reduce(_):  # batch_decompress(clip_norm=True): clip to the median norm, mean per index
        update, at = torch.zeros_like(sent[0][0]), 0
        for shape in shapes:
            part = slice(at, at + math.prod(shape))
            norms = [sent[r][0][part].norm() for r in range(nodes)]
            median = sorted(norms)[(nodes - 1) // 2]  # torch.median: the lower middle one
            total, senders = 0, 0
            for r in range(nodes):
                total = total + sent[r][0][part] * torch.clamp(median / (norms[r] + 1e-8), max=1)
                senders = senders + sent[r][1][part].float()
            update[part] = torch.where(senders > 0, total / senders.clamp_min(1), 0.0)
            at += math.prod(shape)
        return update

    return compress, reduce


@pytest.mark.parametrize("nodes,chunk", [(2, 4), (4, 4), (4, 64)])
def test_sparseloco_equals_its_authors_code_and_sends_the_closed_form(nodes, chunk):
    compress, reduce = authors_sparseloco(nodes, chunk=chunk, topk=4)
    adamw = lambda m: torch.optim.AdamW(m.parameters(), lr=0.01, weight_decay=0.0)
    reference = reference_diloco(nodes, 3, 3, adamw, compress, outer_lr=1.0, outer_momentum=0.0,
                                 reduce=reduce)
    result = fit("sparseloco", nodes, steps=9, optimizer="adamw", lr=0.01, H=3, chunk=chunk,
                 topk=4)
    assert max_diff(result.model, reference) <= 1e-6
    assert max_diff(result.model, fresh_model()) > 1e-3
    if chunk == 4:
        # 16×6 weight: 8 tiles of 4×3, 4 values each with 4-bit indices; 1×16 weight: 4
        # tiles of 1×4, 4 values each with 2-bit indices; the biases (16, 1) whole. Each
        # tensor's values coded on their own: ceil(k/4) + 5 fp32.
        values = sum(math.ceil(k / 4) + 20 for k in (32, 16, 16, 1))
        indices = math.ceil((32 * 4 + 16 * 2) / 8)
        assert bytes_per_step(result) == [0, 0, (nodes - 1) * (values + indices)] * 3


def test_muon_with_adamw_state_round_trips_through_a_checkpoint():
    x, y = all_data(1)
    models = [fresh_model(), fresh_model()]
    factory = muon_with_rule(hidden_matrices)
    first = factory(models[0].parameters(), lr=0.02, model=models[0])
    for _ in range(2):
        models[0]((x, y)).backward()
        first.step()
        first.zero_grad()
    models[1].load_state_dict(models[0].state_dict())
    second = factory(models[1].parameters(), lr=0.02, model=models[1])
    second.load_state_dict(copy.deepcopy(first.state_dict()))  # as a checkpoint file does
    for model, opt in zip(models, (first, second)):
        model((x, y)).backward()
        opt.step()
    assert max_diff(models[0], models[1]) == 0
    assert max_diff(models[0], fresh_model()) > 1e-3
