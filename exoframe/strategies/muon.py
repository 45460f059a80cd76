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

Keyword arguments (`-o KEY=VALUE`): lr and weight_decay (decoupled, both groups) from
--lr/--weight-decay; muon_momentum (0.95), nesterov (true), ns_steps (5), adjust_lr_fn
(torch's: null for max(1, rows/cols)^0.5, or match_rms_adamw), betas ([0.9, 0.999]) and eps
(1e-8) for AdamW, adamw_lr_ratio (1.0: AdamW's lr as a fraction of the schedule's).
Sources: Jordan et al., "Muon: An optimizer for hidden layers in neural networks" (2024);
Thérien et al., "MuLoCo: Muon is a practical inner optimizer for DiLoCo" (arXiv 2505.23725).
"""
from __future__ import annotations

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


class MuonWithAdamW(torch.optim.Optimizer):
    """One optimizer of two parameter groups: torch.optim.Muon's and torch.optim.AdamW's.
    The engine's learning-rate schedule sets both groups' lr."""

    def __init__(self, params, lr: float = 0.02, weight_decay: float = 0.0,
                 model: torch.nn.Module | None = None, rule: Rule = hidden_matrices,
                 muon_momentum: float = 0.95, nesterov: bool = True, ns_steps: int = 5,
                 adjust_lr_fn: str | None = None, betas=(0.9, 0.999), eps: float = 1e-8):
        params = list(params)
        names = {id(p): n for n, p in model.named_parameters()} if model is not None else {}
        matrices = [p for p in params if rule(names.get(id(p), ""), p, model)]
        chosen = {id(p) for p in matrices}
        rest = [p for p in params if id(p) not in chosen]
        self.parts = []
        if matrices:
            self.parts.append(torch.optim.Muon(
                matrices, lr=lr, weight_decay=weight_decay, momentum=muon_momentum,
                nesterov=nesterov, ns_steps=ns_steps, adjust_lr_fn=adjust_lr_fn))
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
    import inspect

    signature = inspect.signature(MuonWithAdamW.__init__)
    return signature.replace(parameters=[p for name, p in signature.parameters.items()
                                         if name not in ("self", "rule")])
