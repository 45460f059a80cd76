"""Formats an outer gradient (pseudo-gradient) may travel in, and their encoded sizes.

`quantize(values, fmt)` returns the values as they arrive after encoding and decoding, and
the encoded size in bytes; a strategy all-reduces the decoded values and tells the network
the encoded size (`wire_bytes`). For m fp32 values:

  none           4m                 full precision
  bf16           2m                 bfloat16
  int8           m + 4              symmetric integers in [-127, 127], one fp32 scale
  int4           ceil(m/2) + 4      symmetric integers in [-7, 7], one fp32 scale
  fp8-row        m + 4·rows         float8 E4M3 with one fp32 scale per row, as torchft's
                                    quantized all-reduce: a row is the last dimension of a
                                    parameter, and each value of a 1-D one is a row of its own
                                    (biases come through exact); the reduced mean is quantized
                                    a second time before it is sent back (`sent_back`), so the
                                    m + 4·rows bytes travel both ways (torchft's padding of
                                    each row to 4 bytes is not counted)
  fp4-e3m0       ceil(m/2) + 4      sign and a 3-bit exponent, no mantissa: magnitudes 0 and
                                    2^-6 .. 2^0 times one fp32 scale, the largest |value|
                                    (Streaming DiLoCo)
  int8-codebook  m + 1024           256 equal bins over μ ± 6σ; each bin decodes to the mean
                                    of its values, a codebook of 256 fp32 (INTELLECT-1)
  2bit           ceil(m/4) + 16     4 equal bins over [-a, a], a = max |value|; each decodes
                                    to the mean of its values, a codebook of 4 fp32 (exoframe's
                                    first SparseLoCo)
  2bit-6sigma    ceil(m/4) + 20     SparseLoCo's code as its authors run it (templar's
                                    TopKCompressor, 4 bins, range 6): values centred on their
                                    mean μ, code round((v − μ)/s + 2) clamped to 0..3 with
                                    s = 6σ/4 (σ unbiased), each code decoding to μ + the mean
                                    of its centred values; a codebook of 4 fp32 and μ

`OuterQuantizer` adds error feedback: what a message did not carry, e ← (Δ + e) − Q(Δ + e),
is kept and added to the next outer gradient (MuLoCo, SparseLoCo).
Sources: Douillard et al., "Streaming DiLoCo" (2025); Jaghouar et al., "INTELLECT-1
Technical Report" (arXiv 2412.01152); torchft's per-row FP8 all-reduce (pytorch/torchft,
torchft/quantization.py and collectives.py, 73dafea); Sarfi et al., "SparseLoCo" (arXiv
2508.15706) and its authors' code (tplr-ai/templar, src/tplr/compress.py, c2397ac);
Karimireddy et al., "Error Feedback Fixes SignSGD" (2019).
"""
from __future__ import annotations

import math

import torch

from .base import check_choice

FORMATS = ("none", "bf16", "int8", "int4", "fp8-row", "fp4-e3m0", "int8-codebook", "2bit",
           "2bit-6sigma")
FP8_MAX = 448.0  # the largest finite float8 E4M3 value
FP4_EXPONENTS = (-6, 0)  # E3M0: 7 powers of two, plus zero


def check_format(owner: str, fmt: str, key: str = "quantizer"):
    check_choice(owner, key, fmt, FORMATS)


def row_lengths(shapes) -> list[int]:
    """Rows of the flat vector of tensors of these shapes: each tensor's last dimension;
    each value of a 0-D or 1-D tensor is a row (torchft makes a 1-D tensor a column)."""
    rows = []
    for shape in shapes:
        numel = math.prod(shape)
        last = shape[-1] if len(shape) >= 2 else 1
        rows.extend([last] * (numel // last) if last else [])
    return rows


def rows_within(rows: list[int], start: int, end: int) -> list[int]:
    """The rows of the slice [start, end) of a flat vector cut into `rows`."""
    out, at = [], 0
    for length in rows:
        a, b = max(at, start), min(at + length, end)
        if a < b:
            out.append(b - a)
        at += length
    return out


def encoded_bytes(fmt: str, numel: int, rows: int = 1) -> int:
    """The closed form of a message of `numel` values in `fmt` (`rows`: for fp8-row)."""
    return {"none": 4 * numel, "bf16": 2 * numel, "int8": numel + 4,
            "int4": math.ceil(numel / 2) + 4, "fp8-row": numel + 4 * rows,
            "fp4-e3m0": math.ceil(numel / 2) + 4, "int8-codebook": numel + 256 * 4,
            "2bit": math.ceil(numel / 4) + 4 * 4, "2bit-6sigma": math.ceil(numel / 4) + 4 * 5}[fmt]


def quantize(values: torch.Tensor, fmt: str, rows: list[int] | None = None
             ) -> tuple[torch.Tensor, int]:
    """`values` (flat fp32) as they arrive after encoding in `fmt`, and the encoded size.
    `rows`: the row lengths for fp8-row (default: one row)."""
    rows = rows if rows is not None else [values.numel()]
    size = encoded_bytes(fmt, values.numel(), len(rows))
    if fmt == "none" or values.numel() == 0:
        return values, size
    decode = {"bf16": lambda v: v.to(torch.bfloat16).float(),
              "int8": lambda v: _symmetric_integers(v, 127),
              "int4": lambda v: _symmetric_integers(v, 7),
              "fp8-row": lambda v: _fp8_rows(v, rows),
              "fp4-e3m0": _fp4_e3m0,
              "int8-codebook": lambda v: _codebook(v, 256, *_mean_6_sigma(v)),
              "2bit": lambda v: _codebook(v, 4, -v.abs().max(), v.abs().max()),
              "2bit-6sigma": _centred_code}[fmt]
    return decode(values), size


def _symmetric_integers(values, levels):
    scale = values.abs().max() / levels
    if scale == 0:
        return values.clone()
    return torch.round(values / scale).clamp_(-levels, levels) * scale


def _fp8_rows(values, rows):
    # torchft's arithmetic: scale = 448 / max |row| (1 for an all-zero row), sent as
    # e4m3(value · scale), decoded as that / scale.
    row_of = torch.repeat_interleave(torch.arange(len(rows), device=values.device),
                                     torch.tensor(rows, device=values.device))
    row_max = values.new_zeros(len(rows)).scatter_reduce_(0, row_of, values.abs(), "amax")
    scale = FP8_MAX / row_max
    scale = torch.where(torch.isinf(scale), torch.ones_like(scale), scale)[row_of]
    return (values * scale).to(torch.float8_e4m3fn).float() / scale


def _fp4_e3m0(values):
    scale = values.abs().max()
    if scale == 0:
        return values.clone()
    low, high = FP4_EXPONENTS
    relative = values.abs() / scale
    exponent = torch.round(torch.log2(relative.clamp_min(2.0 ** (low - 1)))).clamp_(low, high)
    magnitude = torch.where(relative < 2.0 ** (low - 0.5), 0.0, 2.0 ** exponent)
    return torch.sign(values) * magnitude * scale


def _mean_6_sigma(values):
    mean, std = values.mean(), values.std(unbiased=False)
    return mean - 6 * std, mean + 6 * std


def _centred_code(values, bins=4, sigmas=6):
    mean = values.mean()
    centred = values - mean
    std = centred.norm() / math.sqrt(centred.numel() - 1) if centred.numel() > 1 \
        else centred.new_tensor(math.nan)
    scale = sigmas * std / bins
    if not (torch.isfinite(scale) and scale != 0):  # one value, or all equal: as the authors
        scale = torch.ones_like(scale)
    code = torch.round(centred / scale + bins // 2).clamp_(0, bins - 1).long()
    return _bin_means(centred, code, bins) + mean


def _bin_means(values, index, bins):
    """Each value replaced by the mean of the values that share its bin `index`."""
    sums = torch.zeros(bins, dtype=values.dtype, device=values.device).index_add_(0, index, values)
    counts = torch.bincount(index, minlength=bins).to(values.dtype)
    return (sums / counts.clamp_min(1))[index]


def _codebook(values, bins, low, high):
    """Each value into one of `bins` equal bins over [low, high] (clamped), decoded to the
    mean of the values in its bin."""
    if not high > low:
        return values.clone()
    width = (high - low) / bins
    index = torch.floor((values - low) / width).clamp_(0, bins - 1).long()
    return _bin_means(values, index, bins)


class OuterQuantizer:
    """A strategy's outer-gradient format, with optional error feedback."""

    def __init__(self, fmt: str, error_feedback: bool, rows: list[int]):
        self.fmt = fmt
        self.rows = rows
        self.residual = None
        if error_feedback:
            self.residual = torch.zeros(sum(rows))

    def compress(self, delta: torch.Tensor, rows: list[int] | None = None,
                 residual_slice: slice = slice(None)) -> tuple[torch.Tensor, int]:
        """What this rank sends for `delta` (decoded), and its encoded size. With error
        feedback the residual (of the slice `residual_slice` of the whole vector) is added
        first and what was not sent is kept."""
        if self.residual is None:
            return quantize(delta, self.fmt, rows if rows is not None else self.rows)
        self.residual = self.residual.to(delta.device)
        corrected = delta + self.residual[residual_slice]
        sent, size = quantize(corrected, self.fmt, rows if rows is not None else self.rows)
        self.residual[residual_slice] = corrected - sent
        return sent, size

    def sent_back(self, mean: torch.Tensor, rows: list[int] | None = None) -> torch.Tensor:
        """The all-reduced mean of the messages as the ranks receive it (its first
        sum(rows) values; any after them, full-precision buffers, stay as they are). fp8-row
        quantizes it again per row, as torchft's reduce step does with the sum before
        sending it back: the same numbers bit for bit when the rank count is a power of two
        (the scales then differ by that factor exactly), within fp32 rounding otherwise."""
        if self.fmt != "fp8-row" or mean.numel() == 0:
            return mean
        rows = rows if rows is not None else self.rows
        n = sum(rows)
        return torch.cat([_fp8_rows(mean[:n], rows), mean[n:]])

    def state(self) -> dict:
        return {} if self.residual is None else {"residual": self.residual.clone()}

    def load(self, state: dict):
        if self.residual is not None and "residual" in state:
            self.residual = state["residual"].clone()
