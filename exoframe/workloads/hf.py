"""A Hugging Face transformers causal language model, built from a config (a model type and
sizes, or a config.json file) with random weights: nothing is downloaded. It trains on the
gpt workload's data (the Markov source, or data=PATH: a token file, text, a saved dataset).

Needs the `hf` extra (pip install 'exoframe[hf]'), imported only when this workload is used.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

import torch.nn as nn
import torch.nn.functional as F

from ..errors import ExoframeError, did_you_mean
from ..inputs import load_json
from .base import Workload
from .gpt import language_data, vocabulary_source

def transformers_module():
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing reaches the network at run time
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    try:
        import transformers
    except ImportError:
        raise ExoframeError("workload 'hf-lm' needs the hf extra: pip install "
                            "'exoframe[hf]'.") from None
    return transformers


class CausalLM(nn.Module):
    """forward(batch) -> mean next-token cross-entropy of (block_size + 1)-token windows."""

    def __init__(self, config):
        super().__init__()
        self.model = transformers_module().AutoModelForCausalLM.from_config(config)

    def forward(self, batch):
        (windows,) = batch
        x, y = windows[:, :-1], windows[:, 1:]
        logits = self.model(input_ids=x, use_cache=False).logits
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1))


def model_config(model_type: str, config: Optional[str], sizes: dict):
    """A transformers config: config.json (a file or a folder holding one) with `sizes` over
    it, or `model_type`'s defaults with `sizes`. A size the model type lacks is one line."""
    auto = transformers_module().AutoConfig
    values = {}
    if config is not None:
        path = Path(config)
        path = path / "config.json" if path.is_dir() else path
        if not path.is_file():
            raise ExoframeError(f"config: no such file '{path}'; give a transformers "
                                "config.json (or the folder holding one).")
        values = load_json(path, "config", "give a transformers config.json.")
        try:
            model_type = values.pop("model_type")
        except (KeyError, AttributeError, TypeError):
            raise ExoframeError(f"config: '{path}' is not a transformers config.json with a "
                                "model_type.") from None
    try:
        defaults = auto.for_model(model_type)
    except ValueError:
        raise ExoframeError(f"model_type: transformers has no model type '{model_type}' "
                            "(e.g. gpt2, llama, qwen2, mistral).") from None
    for key in sizes:
        if not hasattr(defaults, key):
            raise ExoframeError(f"workload 'hf-lm': {model_type} configs have no '{key}'."
                                f"{did_you_mean(key, vars(defaults))}")
    return auto.for_model(model_type, **{**values, **sizes})


def hf_lm(model_type: str = "gpt2", config: Optional[str] = None,
          hidden_size: Optional[int] = None, num_hidden_layers: Optional[int] = None,
          num_attention_heads: Optional[int] = None, vocab_size: Optional[int] = None,
          block_size: int = 64, data: Optional[str] = None, val_data: Optional[str] = None,
          dtype: str = "uint16", tokenizer: str = "char", column: Optional[str] = None,
          order: int = 1, alpha: float = 0.1, train_tokens: int = 1_000_000,
          val_tokens: int = 65_000, data_seed: int = 0, domains: int = 1,
          **model_params) -> Workload:
    """A transformers causal LM from a config, randomly initialized; the gpt workload's data."""
    given = vocab_size
    dataset, vocab_size, best = language_data(
        vocab_size, order, alpha, block_size, train_tokens, val_tokens, data_seed, domains,
        data, val_data, dtype, tokenizer, column)
    given = {"hidden_size": hidden_size, "num_hidden_layers": num_hidden_layers,
             "num_attention_heads": num_attention_heads}
    if config is None:  # a small model: 64 wide, 2 layers, 4 heads, unless given
        sizes = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                 **{k: v for k, v in given.items() if v is not None}}
        sizes.update(intermediate_size=4 * sizes["hidden_size"],
                     max_position_embeddings=block_size)
    else:  # the file's sizes, but for the ones given and the vocabulary, which the data decide
        sizes = {k: v for k, v in given.items() if v is not None}
    sizes["vocab_size"] = vocab_size
    defaults = model_config(model_type, config, {})
    sizes = {k: v for k, v in sizes.items() if hasattr(defaults, k)}  # (gpt2: no intermediate_size)
    built = model_config(model_type, config, {**sizes, **model_params})
    positions = getattr(built, "max_position_embeddings", None)
    if positions is not None and positions < block_size:
        raise ExoframeError(f"block_size: the model holds {positions} positions, fewer than "
                            f"the windows' {block_size}; give -w block_size={positions} or "
                            "a config with more positions.")
    return Workload(build_model=lambda: CausalLM(built), dataset=dataset, batch_size=16,
                    lr=3e-3, best_loss=best, name="hf-lm", tokens_per_sample=block_size,
                    sized_by=vocabulary_source(given, data, vocab_size))
