"""How long a rank's computation takes in simulated time: compute models and stragglers.

Compute models (`--compute`):
  measured            the rank's own CPU time for each stretch of work between exchanges
  fixed:<duration>    this much per training step (e.g. fixed:250ms or fixed:2s)
  flops:<device>[:<efficiency>]
                      the step's FLOPs (forward + backward, counted once with torch's FLOP
                      counter) / (device peak × efficiency, 0.4 unless given); <device> is a
                      name from DEVICES or a peak rate in FLOP/s (flops:2e14)
Any of them may end with `,overlap=<bandwidth>` (e.g. fixed:100ms,overlap=20mbit): while a
rank computes, its exchanges in flight move at most that much per second each way, as on a
host whose CPU cores the ranks' compute keeps busy (the threads that move and reduce an
exchange's bytes wait for a core). Without it they move at the network's pace, as where a
NIC or a GPU's copy engines move them beside the compute.
Stragglers (`--stragglers`), comma-separated terms multiplying a rank's compute time:
  R:F                 rank R is always F× slower (e.g. 3:4)
  lognormal:S         every step, every rank: × exp(S·z), z ~ N(0, 1) (median 1)
  exponential:M       every step, every rank: × (1 + x), x ~ Exp(mean M) (never faster)
  bernoulli:P:K       every step, every rank: × K with probability P, else × 1
Random factors are drawn from a generator seeded by (seed, rank): same seed, same draws.
"""
from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass, field, replace

from ...errors import ExoframeError, did_you_mean, shorten
from ..network.units import format_bandwidth, parse_bandwidth, parse_duration

# Peak dense FLOP/s in the precision one trains in on each device.
DEVICES = {
    "cpu": (1.0e12, "8-core desktop CPU, fp32 AVX2"),
    "m2-max": (13.6e12, "Apple M2 Max GPU, fp32"),
    "m2-ultra": (27.2e12, "Apple M2 Ultra GPU, fp32"),
    "rtx3090": (71e12, "NVIDIA RTX 3090, fp16 tensor cores, fp32 accumulate"),
    "rtx4090": (165e12, "NVIDIA RTX 4090, bf16 tensor cores, fp32 accumulate"),
    "v100": (125e12, "NVIDIA V100, fp16 tensor cores"),
    "a100": (312e12, "NVIDIA A100, bf16 tensor cores"),
    "h100": (989e12, "NVIDIA H100 SXM, bf16 tensor cores"),
    "h200": (989e12, "NVIDIA H200 SXM, bf16 tensor cores"),
    "b200": (2250e12, "NVIDIA B200, bf16 tensor cores"),
    "tpu-v5e": (197e12, "Google TPU v5e, bf16"),
}
DEFAULT_EFFICIENCY = 0.4
# overlap= for 4 ranks on 2 CPU cores, fitted with benchmarks/emulated_network.py
# (docs/guides/network-fidelity.md: "How close is the simulated clock to a real network?").
MACHINE_OVERLAP = "5mbit"
# Bounds that keep every simulated time finite: a step of at most a day, at most a million
# times slower, and a lognormal whose exp(S·z) cannot overflow.
MAX_STEP_SECONDS = 86400.0
MAX_FACTOR = 1e6
MAX_SIGMA = 10.0


@dataclass(frozen=True)
class ComputeModel:
    kind: str  # measured | fixed | flops
    step_seconds: float | None = None  # fixed: given; flops: set once the FLOPs are counted
    peak: float | None = None  # flops: device FLOP/s
    efficiency: float = DEFAULT_EFFICIENCY
    device: str = ""
    overlap_rate: float | None = None  # bytes/s an exchange moves while its rank computes

    @property
    def needs_flops(self) -> bool:
        return self.kind == "flops" and self.step_seconds is None

    def with_flops(self, flops_per_step: float) -> "ComputeModel":
        return replace(self, step_seconds=flops_per_step / (self.peak * self.efficiency))

    def with_device(self, device: str) -> "ComputeModel":
        """`flops:auto` once the ranks' device is known: a DEVICES name."""
        return replace(self, peak=DEVICES[device][0], device=device)

    def describe(self) -> str:
        if self.overlap_rate is None:
            return self._describe_model()
        return f"{self._describe_model()}, overlap={format_bandwidth(self.overlap_rate)}"

    def _describe_model(self) -> str:
        if self.kind == "measured":
            return "measured"
        if self.kind == "fixed":
            return f"fixed:{self.step_seconds:g}s/step"
        step = f", {self.step_seconds:.4g}s/step" if self.step_seconds is not None else ""
        if self.peak is None:
            return f"flops:{self.device} (× {self.efficiency:g})"
        return f"flops:{self.device} ({self.peak:.3g} FLOP/s × {self.efficiency:g}{step})"


def device_from_name(name: str | None) -> str:
    """The DEVICES entry for a GPU's product name ('NVIDIA H100 80GB HBM3' -> 'h100'); 'cpu'
    when there is no GPU or none of the table's names is in it."""
    squeezed = (name or "").lower().replace(" ", "").replace("-", "")
    for device in sorted(DEVICES, key=len, reverse=True):
        if device not in ("cpu", "tpu-v5e") and device.replace("-", "") in squeezed:
            return device
    return "cpu"


def parse_compute(spec: str) -> ComputeModel:
    spec, _, option = str(spec).strip().partition(",")
    model = _parse_model(spec.strip())
    if not option:
        return model
    key, equals, value = option.strip().partition("=")
    if key.strip() != "overlap" or not equals:
        raise ExoframeError(f"compute: unknown option '{shorten(option)}'; the one option is "
                            "overlap=<bandwidth>, e.g. fixed:100ms,overlap=20mbit.")
    rate = parse_bandwidth(value.strip(), "overlap", "compute")
    return replace(model, overlap_rate=None if math.isinf(rate) else rate)


def _parse_model(spec: str) -> ComputeModel:
    kind, _, rest = spec.partition(":")
    if kind == "measured" and not rest:
        return ComputeModel("measured")
    if kind == "fixed":
        if _is_bare_number(rest):  # 100 what? 100 s is rarely what was meant
            if not math.isfinite(float(rest)):
                raise ExoframeError(f"compute: fixed needs a finite time per step, got "
                                    f"'{shorten(rest)}'; write e.g. fixed:100ms.")
            raise ExoframeError(f"compute: 'fixed:{shorten(rest)}' has no unit; write e.g. "
                                f"fixed:{shorten(rest)}ms or fixed:{shorten(rest)}s.")
        seconds = parse_duration(rest, "compute", "--compute")
        if not 0 < seconds <= MAX_STEP_SECONDS:
            raise ExoframeError(f"compute: fixed needs a positive time per step of at most "
                                f"{MAX_STEP_SECONDS:g}s (a day), got '{shorten(rest)}'.")
        return ComputeModel("fixed", step_seconds=seconds)
    if kind == "flops":
        device, _, efficiency = rest.partition(":")
        # auto: the ranks' GPU model, known once the engine has resolved the device
        peak = None if device == "auto" else _device_peak(device)
        eff = _number(efficiency, "compute: flops efficiency") if efficiency else DEFAULT_EFFICIENCY
        if not 0 < eff <= 1:
            raise ExoframeError(f"compute: efficiency must be in (0, 1], "
                                f"got {shorten(efficiency)}.")
        return ComputeModel("flops", peak=peak, efficiency=eff, device=device)
    raise ExoframeError(
        f"compute: unknown compute model '{shorten(spec)}'."
        f"{did_you_mean(kind, ['measured', 'fixed', 'flops'])}"
        " Use measured, fixed:<time per step> (e.g. fixed:250ms) or flops:<device> "
        f"(devices: {', '.join(DEVICES)}).")


def _is_bare_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _number(text: str, what: str) -> float:
    """A finite number; NaN or inf in a timing input would leave the ranks waiting forever."""
    try:
        value = float(text)
    except ValueError:
        raise ExoframeError(f"{what}: expected a number, got '{shorten(text)}'.") from None
    if not math.isfinite(value):
        raise ExoframeError(f"{what}: expected a finite number, got '{shorten(text)}'.")
    return value


def _device_peak(device: str) -> float:
    if device in DEVICES:
        return DEVICES[device][0]
    try:
        peak = float(device)
    except ValueError:
        raise ExoframeError(
            f"compute: unknown device '{shorten(device)}'.{did_you_mean(device, DEVICES)} "
            f"Known: {', '.join(DEVICES)}; or give a peak rate in FLOP/s, e.g. flops:2e14."
        ) from None
    if not (math.isfinite(peak) and peak > 0):
        raise ExoframeError(f"compute: a device's peak FLOP/s must be a positive finite "
                            f"number, got {shorten(device)}.")
    return peak


DISTRIBUTIONS = {"lognormal": 1, "exponential": 1, "bernoulli": 2}  # name -> number of params


@dataclass(frozen=True)
class Stragglers:
    factors: dict = field(default_factory=dict)  # rank -> static slowdown factor
    distribution: str = ""  # "" (none), lognormal, exponential or bernoulli
    params: tuple = ()

    def describe(self) -> str:
        terms = [f"{rank}:{factor:g}" for rank, factor in sorted(self.factors.items())]
        if self.distribution:
            terms.append(":".join([self.distribution, *(f"{p:g}" for p in self.params)]))
        return ",".join(terms) or "none"

    def check_ranks(self, nodes: int):
        for rank in self.factors:
            if not 0 <= rank < nodes:
                raise ExoframeError(
                    f"stragglers: rank {rank} does not exist in a run of {nodes} nodes.")

    def for_rank(self, rank: int, seed: int) -> "Slowdown":
        return Slowdown(self.factors.get(rank, 1.0), self.distribution, self.params,
                        random.Random(seed * 1_000_003 + rank * 7919 + 17))


def parse_stragglers(spec: str) -> Stragglers:
    factors, distribution, params = {}, "", ()
    for term in filter(None, (t.strip() for t in str(spec or "").split(","))):
        head, *rest = term.split(":")
        if head.isdigit():
            if len(rest) != 1:
                raise ExoframeError(f"stragglers: '{shorten(term)}' should be RANK:FACTOR, "
                                    "e.g. 3:4.")
            factor = _number(rest[0], f"stragglers: factor of rank {shorten(head)}")
            if not 0 < factor <= MAX_FACTOR:
                raise ExoframeError(f"stragglers: rank {shorten(head)}'s factor must be positive "
                                    f"and at most {MAX_FACTOR:g}, got {factor:g}.")
            factors[int(head)] = factor
            continue
        if head not in DISTRIBUTIONS:
            head = shorten(head)
            raise ExoframeError(
                f"stragglers: unknown distribution '{head}'.{did_you_mean(head, DISTRIBUTIONS)} "
                "Use lognormal:SIGMA, exponential:MEAN, bernoulli:P:FACTOR or RANK:FACTOR.")
        if distribution:
            raise ExoframeError("stragglers: give at most one random slowdown distribution.")
        if len(rest) != DISTRIBUTIONS[head]:
            raise ExoframeError(f"stragglers: {head} takes {DISTRIBUTIONS[head]} parameter(s), "
                                f"got '{shorten(term)}'.")
        values = tuple(_number(v, f"stragglers: {head}") for v in rest)
        if any(v < 0 for v in values) or (head == "bernoulli" and values[0] > 1):
            raise ExoframeError(f"stragglers: bad parameters in '{term}' (negative, or p > 1).")
        limit = {"lognormal": MAX_SIGMA, "exponential": MAX_FACTOR}.get(head)
        if head == "bernoulli" and not values[1] <= MAX_FACTOR:
            limit = MAX_FACTOR
        if limit is not None and max(values) > limit:
            raise ExoframeError(f"stragglers: '{term}' is past the largest slowdown "
                                f"simulated ({head}'s parameters at most {limit:g}).")
        distribution, params = head, values
    return Stragglers(factors, distribution, params)


class Slowdown:
    """One rank's compute-time multiplier, drawn afresh each step."""

    def __init__(self, static: float, distribution: str, params: tuple, rng: random.Random):
        self.static, self.distribution, self.params, self.rng = static, distribution, params, rng

    def factor(self) -> float:
        d, p, rng = self.distribution, self.params, self.rng
        if d == "lognormal":
            return self.static * math.exp(p[0] * rng.gauss(0.0, 1.0))
        if d == "exponential":
            return self.static * (1.0 + (rng.expovariate(1.0 / p[0]) if p[0] > 0 else 0.0))
        if d == "bernoulli":
            return self.static * (p[1] if rng.random() < p[0] else 1.0)
        return self.static


class ComputeClock:
    """Charges compute time to a rank's clock: per step (fixed, flops) or as measured time
    between exchanges (measured): by default the CPU time of the rank's main thread; the
    engine passes a GPU timer for a rank on a GPU."""

    def __init__(self, model: ComputeModel, slowdown: Slowdown, timer=time.thread_time):
        self.model, self.slowdown, self.timer = model, slowdown, timer
        self.factor = 1.0
        self._mark = timer()

    def start_step(self) -> float:
        """Seconds of compute to charge at the start of a step."""
        self.factor = self.slowdown.factor()
        if self.model.kind == "measured":
            return 0.0
        return self.model.step_seconds * self.factor

    def elapsed(self) -> float:
        """Seconds of compute since the last call (measured only), then restart the count."""
        if self.model.kind != "measured":
            return 0.0
        now = self.timer()
        seconds, self._mark = (now - self._mark) * self.factor, now
        return seconds

    def state_dict(self) -> dict:
        return {"factor": self.factor, "rng": self.slowdown.rng.getstate()}

    def load_state_dict(self, state: dict):
        self.factor = state["factor"]
        self.slowdown.rng.setstate(state["rng"])

    def restart(self):
        """Forget the CPU time spent since the last mark (bookkeeping, talking to the
        simulator): it is not the model's compute."""
        self._mark = self.timer()
