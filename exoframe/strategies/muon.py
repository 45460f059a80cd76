"""`--optimizer muon`: Muon on the hidden matrices, AdamW on every other parameter.

Muon orthogonalizes each hidden weight matrix's (Nesterov) momentum by a Newton–Schulz
iteration; it is meant for the 2-D weights inside the network. Embeddings, the output head,
norms and biases take AdamW, as torch's documentation of torch.optim.Muon and MuLoCo
(arXiv 2505.23725) describe. With `--strategy diloco` this is MuLoCo's inner optimizer.

The split is a rule, rule(name, parameter, model) -> True for Muon. The default,
`hidden_matrices`: a 2-D parameter that is neither an nn.Embedding's weight nor the last
nn.Linear's weight (the output head; a head tied to the embedding is the embedding's).
A plugin registers another rule as its own optimizer:

    from exoframe.strategies.muon import muon_with_rule

    @exoframe.hookimpl
    def exoframe_register_optimizers(register):
        register("muon-attention", muon_with_rule(lambda name, p, model: "attn" in name))

Muon follows MuLoCo's reference (its momentum form, Newton-Schulz schedule and learning-rate
adjustment), in fp32 by default. Keyword arguments (`-o KEY=VALUE`), MuLoCo's defaults: lr
and weight_decay (decoupled, both groups) from --lr/--weight-decay; muon_momentum (0.95),
nesterov (false), adjust_lr (spectral_norm; rms_norm, original or null), ns_dtype (float32,
or bfloat16 as MuLoCo runs it on GPUs), betas ([0.9, 0.95]) and eps (1e-8) for AdamW. Both
groups take the schedule's lr.
Sources: Jordan et al., "Muon: An optimizer for hidden layers in neural networks" (2024);
Thérien et al., "MuLoCo: Muon is a practical inner optimizer for DiLoCo" (arXiv 2505.23725).
"""
from __future__ import annotations

import inspect
import math
from typing import Callable

import torch

Rule = Callable[[str, torch.nn.Parameter, "torch.nn.Module | None"], bool]


def hidden_matrices(name: str, param: torch.nn.Parameter, model: torch.nn.Module | None) -> bool:
    """Muon for 2-D weights that are not an embedding or the output head."""
    if param.dim() != 2 or model is None:
        return False
    embeddings = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    head = id(linears[-1].weight) if linears else None
    return id(param) not in embeddings and id(param) != head


# MuLoCo's Newton-Schulz schedule: one (a, b, c) per iteration of X ← aX + (bA + cA²)X, A = XXᵀ.
NS_COEFFICIENTS = ((4.0848, -6.8946, 2.9270), (3.9505, -6.3029, 2.6377),
                   (3.7418, -5.5913, 2.3037), (2.8769, -3.1427, 1.2046),
                   (2.8366, -3.0525, 1.2012))
ADJUST_LR = ("spectral_norm", "rms_norm", "original", None)
NS_DTYPES = ("float32", "bfloat16")


def orthogonalize(update: torch.Tensor, eps: float = 1e-8,
                  dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The Newton-Schulz approximation of U Vᵀ for update = U S Vᵀ (wide side last)."""
    x = update.to(dtype)
    tall = x.size(0) > x.size(1)
    if tall:
        x = x.T
    x = x / (x.norm() + eps)
    for a, b, c in NS_COEFFICIENTS:
        gram = x @ x.T
        x = a * x + (b * gram + c * (gram @ gram)) @ x
    return (x.T if tall else x).to(update.dtype)


def adjusted_lr(lr: float, shape, rule: str | None) -> float:
    """Muon's per-matrix learning rate (fan_out, fan_in = shape): spectral_norm
    lr·sqrt(fan_out/fan_in) (MuLoCo's default), rms_norm lr·0.2·sqrt(max) (AdamW's update
    RMS), original lr·sqrt(max(1, fan_out/fan_in)) (torch.optim.Muon's), None lr."""
    fan_out, fan_in = shape[:2]
    return lr * {"spectral_norm": math.sqrt(fan_out / fan_in),
                 "rms_norm": 0.2 * math.sqrt(max(fan_out, fan_in)),
                 "original": math.sqrt(max(1.0, fan_out / fan_in)), None: 1.0}[rule]


def check_options(momentum, nesterov, adjust_lr, ns_dtype, eps, momentum_name="momentum"):
    """Muon's keyword arguments, a ValueError naming the first bad one: checked when the
    optimizer is made, which the launcher does before any rank starts (OptimizerSpec)."""
    if isinstance(momentum, bool) or not isinstance(momentum, (int, float)) \
            or not 0 <= momentum < 1:
        raise ValueError(f"{momentum_name} must be a number in [0, 1), got {momentum!r}")
    if not isinstance(nesterov, bool):
        raise ValueError(f"nesterov must be true or false, got {nesterov!r}")
    if adjust_lr not in ADJUST_LR:
        raise ValueError(f"adjust_lr must be one of {', '.join(map(str, ADJUST_LR))}, "
                         f"got {adjust_lr!r}")
    if ns_dtype not in NS_DTYPES:
        raise ValueError(f"ns_dtype must be {' or '.join(NS_DTYPES)}, got {ns_dtype!r}")
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not 0 <= eps < math.inf:
        raise ValueError(f"eps must be a finite number >= 0, got {eps!r}")


class Muon(torch.optim.Optimizer):
    """Muon as MuLoCo's reference implements it, on 2-D parameters:
    M ← μM + G;  U = G + μM (nesterov) or M;  W ← W(1 − lr·wd) − adjusted_lr · NS(U)."""

    def __init__(self, params, lr: float = 0.02, weight_decay: float = 0.0,
                 momentum: float = 0.95, nesterov: bool = False,
                 adjust_lr: str | None = "spectral_norm", eps: float = 1e-8,
                 ns_dtype: str = "float32"):
        check_options(momentum=momentum, nesterov=nesterov, adjust_lr=adjust_lr,
                      ns_dtype=ns_dtype, eps=eps)
        params = list(params)
        for p in params:
            if p.dim() != 2:
                raise ValueError(f"Muon takes 2-D parameters, got one of shape {tuple(p.shape)}")
        super().__init__(params, dict(lr=lr, weight_decay=weight_decay, momentum=momentum,
                                      nesterov=nesterov, adjust_lr=adjust_lr, eps=eps,
                                      ns_dtype=ns_dtype))

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            mu, dtype = group["momentum"], getattr(torch, group["ns_dtype"])
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.zeros_like(p)
                buffer = state["momentum_buffer"].mul_(mu).add_(p.grad)
                update = p.grad + mu * buffer if group["nesterov"] else buffer
                p.mul_(1 - group["lr"] * group["weight_decay"])
                p.sub_(adjusted_lr(group["lr"], p.shape, group["adjust_lr"])
                       * orthogonalize(update, group["eps"], dtype))


class MuonWithAdamW(torch.optim.Optimizer):
    """One optimizer of two parameter groups: Muon's and torch.optim.AdamW's.
    The engine's learning-rate schedule sets both groups' lr."""

    def __init__(self, params, lr: float = 0.02, weight_decay: float = 0.0,
                 model: torch.nn.Module | None = None, rule: Rule = hidden_matrices,
                 muon_momentum: float = 0.95, nesterov: bool = False,
                 adjust_lr: str | None = "spectral_norm", ns_dtype: str = "float32",
                 betas=(0.9, 0.95), eps: float = 1e-8):
        check_options(muon_momentum, nesterov, adjust_lr, ns_dtype, eps, "muon_momentum")
        params = list(params)
        names = {id(p): n for n, p in model.named_parameters()} if model is not None else {}
        matrices = [p for p in params if rule(names.get(id(p), ""), p, model)]
        chosen = {id(p) for p in matrices}
        rest = [p for p in params if id(p) not in chosen]
        self.parts = []
        if matrices:
            self.parts.append(Muon(matrices, lr=lr, weight_decay=weight_decay,
                                   momentum=muon_momentum, nesterov=nesterov,
                                   adjust_lr=adjust_lr, eps=eps, ns_dtype=ns_dtype))
        if rest:
            self.parts.append(torch.optim.AdamW(rest, lr=lr, weight_decay=weight_decay,
                                                betas=tuple(betas), eps=eps))
        super().__init__([part.param_groups[0] for part in self.parts], {})
        self._link()

    def _link(self):
        """Each part steps on its own group and keeps its state in this optimizer's."""
        for part, group in zip(self.parts, self.param_groups):
            part.param_groups = [group]
            part.state = self.state

    @torch.no_grad()
    def step(self, closure=None):
        for part in self.parts:
            part.step()

    def load_state_dict(self, state_dict):
        super().load_state_dict(state_dict)
        self._link()


def muon_with_rule(rule: Rule):
    """An optimizer factory (for exoframe_register_optimizers): Muon for the parameters
    `rule` picks, AdamW for the rest."""
    def factory(params, lr: float = 0.02, weight_decay: float = 0.0, model=None, **kwargs):
        return MuonWithAdamW(params, lr=lr, weight_decay=weight_decay, model=model, rule=rule,
                             **kwargs)
    factory.__signature__ = _signature_with_options()
    return factory


def _signature_with_options():
    """MuonWithAdamW's keyword arguments but `rule`: what OptimizerSpec checks -o against."""
    signature = inspect.signature(MuonWithAdamW.__init__)
    return signature.replace(parameters=[p for name, p in signature.parameters.items()
                                         if name not in ("self", "rule")])
