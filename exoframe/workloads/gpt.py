"""A small character-level GPT trained on text from a seeded Markov source (no download).

The model follows nanoGPT: token + position embeddings, pre-norm transformer blocks with
causal self-attention, a tied output head. forward(batch) returns the mean next-token
cross-entropy of a batch of (block_size + 1)-symbol windows.
"""
from __future__ import annotations

import functools
import math
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import TensorDataset

from ..errors import ExoframeError
from ..host_memory import check_fits
from .base import Workload, shard_factory
from .markov import MarkovSource
from .tokens import token_windows


class Block(nn.Module):
    def __init__(self, n_embd: int, n_head: int):
        super().__init__()
        self.n_head = n_head
        self.ln1 = nn.LayerNorm(n_embd)
        self.qkv = nn.Linear(n_embd, 3 * n_embd)
        self.proj = nn.Linear(n_embd, n_embd)
        self.ln2 = nn.LayerNorm(n_embd)
        self.mlp = nn.Sequential(nn.Linear(n_embd, 4 * n_embd), nn.GELU(), nn.Linear(4 * n_embd, n_embd))

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(B, T, C))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, vocab_size: int, block_size: int, n_layer: int = 2, n_head: int = 4,
                 n_embd: int = 64):
        super().__init__()
        self.token_emb = nn.Embedding(vocab_size, n_embd)
        self.pos_emb = nn.Embedding(block_size, n_embd)
        self.blocks = nn.ModuleList(Block(n_embd, n_head) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(n_embd)
        self.head = nn.Linear(n_embd, vocab_size, bias=False)
        self.head.weight = self.token_emb.weight
        self.apply(self._init)

    @staticmethod
    def _init(module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def logits(self, idx):
        T = idx.shape[1]
        x = self.token_emb(idx) + self.pos_emb(torch.arange(T, device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))

    def forward(self, batch):
        (windows,) = batch
        x, y = windows[:, :-1], windows[:, 1:]
        logits = self.logits(x)
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1))


@functools.lru_cache(maxsize=4)
def markov_corpus(vocab_size, order, alpha, block_size, train_tokens, val_tokens, data_seed):
    """(train windows, val windows, best achievable loss), generated once per process."""
    source = MarkovSource(vocab_size, order, alpha, seed=data_seed)
    windows_per_chain = 8
    chain_len = windows_per_chain * (block_size + 1)

    def windows(tokens, seed):
        chains = max(1, tokens // chain_len)
        data = torch.from_numpy(source.sample(chains, chain_len, seed))
        return data.view(chains * windows_per_chain, block_size + 1)

    return (windows(train_tokens, data_seed + 1), windows(val_tokens, data_seed + 2),
            source.best_window_loss(block_size))


def markov_domains(domains, vocab_size, order, alpha, block_size, train_tokens, val_tokens,
                   data_seed):
    """`domains` Markov sources, domain d's drawn from seed data_seed + 1000 d, each giving
    an equal part of the text: (train, val, train windows' domain labels, best loss), the
    best loss only for one domain (with several it depends on how soon a model can tell
    which source a window comes from)."""
    if domains == 1:
        train, val, best = markov_corpus(vocab_size, order, alpha, block_size, train_tokens,
                                         val_tokens, data_seed)
        return train, val, None, best
    parts = [markov_corpus(vocab_size, order, alpha, block_size, train_tokens // domains,
                           val_tokens // domains, data_seed + 1000 * d) for d in range(domains)]
    labels = torch.cat([torch.full((len(train),), d) for d, (train, _, _) in enumerate(parts)])
    return (torch.cat([train for train, _, _ in parts]), torch.cat([val for _, val, _ in parts]),
            labels, None)


def gpt(vocab_size: Optional[int] = None, order: int = 1, alpha: float = 0.1,
        block_size: int = 64, n_layer: int = 2, n_head: int = 4, n_embd: int = 64,
        train_tokens: int = 1_000_000, val_tokens: int = 65_000, data_seed: int = 0,
        domains: int = 1, data: Optional[str] = None, val_data: Optional[str] = None,
        dtype: str = "uint16", tokenizer: str = "char",
        column: Optional[str] = None) -> Workload:
    """Char-level GPT on a seeded Markov source (best loss known), or on -w data=your tokens.

    data: a nanoGPT .bin, a text file or a save_to_disk dataset folder (tokens.py)."""
    given = vocab_size
    dataset, vocab_size, best = language_data(
        vocab_size, order, alpha, block_size, train_tokens, val_tokens, data_seed, domains,
        data, val_data, dtype, tokenizer, column)
    return Workload(
        build_model=lambda: GPT(vocab_size, block_size, n_layer, n_head, n_embd),
        dataset=dataset, batch_size=16, lr=3e-3, best_loss=best, name="gpt",
        tokens_per_sample=block_size, sized_by=vocabulary_source(given, data, vocab_size))


def vocabulary_source(given, data, vocab_size) -> Optional[str]:
    """What decided a language model's vocabulary, for a refusal (Workload.sized_by)."""
    if given is None and data is not None:
        return (f"data: the largest token id {vocab_size - 1} makes a vocabulary of "
                f"{vocab_size}")
    return None if given is None else f"vocab_size: a vocabulary of {vocab_size}"


def check_markov_memory(domains, vocab_size, order, block_size, train_tokens, val_tokens):
    """The Markov sources' tables (float64 transitions, their sums, the next states) and
    their text (int64, at least one chain of 8 windows per split), before any is made."""
    try:
        table = 24 * domains * float(vocab_size) ** (order + 1)
    except OverflowError:
        table = math.inf
    chain = 8 * (block_size + 1)
    tokens = max(train_tokens, chain) + max(val_tokens, chain)
    check_fits(f"vocab_size, order, train_tokens, val_tokens, block_size: the Markov source's "
               f"{vocab_size}^{order + 1} transitions and {tokens:,} tokens take",
               table + 8 * tokens, "give smaller values")


def language_data(vocab_size, order, alpha, block_size, train_tokens, val_tokens, data_seed,
                  domains, data, val_data, dtype, tokenizer, column):
    """(dataset factory, vocabulary size, best loss or None) of a language workload: the
    Markov source (with `domains` sources, their domain as each window's label, for a
    --partition domain skew), or the token files `data` and `val_data` (tokens.py)."""
    if data is None:
        if val_data is not None:
            raise ExoframeError("val_data: give data=PATH too (validation alone trains nothing).")
        if not isinstance(domains, int) or domains < 1:
            raise ExoframeError(f"domains: a whole number of Markov sources >= 1, got {domains}.")
        vocab_size = 32 if vocab_size is None else vocab_size
        check_markov_memory(domains, vocab_size, order, block_size, train_tokens, val_tokens)
        train, val, labels, best = markov_domains(domains, vocab_size, order, alpha, block_size,
                                                  train_tokens, val_tokens, data_seed)
        return shard_factory(TensorDataset(train), TensorDataset(val), labels), vocab_size, best
    train, val, vocab_size = token_windows(str(data), None if val_data is None else str(val_data),
                                           block_size, dtype, tokenizer, column, vocab_size)
    return shard_factory(train, val), vocab_size, None
