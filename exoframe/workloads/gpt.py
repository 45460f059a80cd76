"""A small character-level GPT trained on text from a seeded Markov source (no download).

The model follows nanoGPT: token + position embeddings, pre-norm transformer blocks with
causal self-attention, a tied output head. forward(batch) returns the mean next-token
cross-entropy of a batch of (block_size + 1)-symbol windows.
"""
from __future__ import annotations

import functools

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import TensorDataset

from .base import Workload, shard
from .markov import MarkovSource


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


def gpt(vocab_size: int = 32, order: int = 1, alpha: float = 0.1, block_size: int = 64,
        n_layer: int = 2, n_head: int = 4, n_embd: int = 64, train_tokens: int = 1_000_000,
        val_tokens: int = 65_000, data_seed: int = 0) -> Workload:
    """Char-level GPT on a seeded Markov source (order 1 by default); best loss is known."""
    train, val, best = markov_corpus(vocab_size, order, alpha, block_size, train_tokens,
                                     val_tokens, data_seed)

    def dataset(rank, num_nodes, split):
        return shard(TensorDataset(train if split == "train" else val), rank, num_nodes, split)

    return Workload(
        build_model=lambda: GPT(vocab_size, block_size, n_layer, n_head, n_embd),
        dataset=dataset, batch_size=16, lr=3e-3, best_loss=best, name="gpt",
        tokens_per_sample=block_size)
