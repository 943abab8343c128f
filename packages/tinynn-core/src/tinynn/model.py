"""GPT: token and position embeddings, a stack of pre-norm transformer blocks, a final LayerNorm and a
linear head over the vocabulary (nanoGPT's shape, without weight tying, like the PyTorch reference bench)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tinynn import functional as F
from tinynn.nn import Block, Dropout, Embedding, LayerNorm, Linear, Module
from tinynn.tensor import Tensor, no_grad


@dataclass
class GPTConfig:
    vocab_size: int = 65
    block_size: int = 128
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 256
    dropout: float = 0.0
    bias: bool = True


class GPT(Module):
    def __init__(self, config: GPTConfig):
        self.config = config
        c = config
        self.wte = Embedding(c.vocab_size, c.n_embd)
        self.wpe = Embedding(c.block_size, c.n_embd)
        self.drop = Dropout(c.dropout)
        self.blocks = [Block(c.n_embd, c.n_head, c.n_layer, c.dropout, c.bias) for _ in range(c.n_layer)]
        self.ln_f = LayerNorm(c.n_embd, c.bias)
        self.lm_head = Linear(c.n_embd, c.vocab_size, c.bias)
        self._positions = {}  # (backend, T) -> the position ids 0..T-1, uploaded once, not every step

    def positions(self, backend, length: int) -> Tensor:
        key = (backend, length)
        if key not in self._positions:
            self._positions[key] = Tensor(backend.from_numpy(np.arange(length)), backend)
        return self._positions[key]

    def forward(self, idx, targets=None):
        """idx (B, T) token ids -> logits (B, T, vocab); with targets (B, T), also the mean cross entropy."""
        if not isinstance(idx, Tensor):
            idx = Tensor(self.wte.weight.backend.from_numpy(np.asarray(idx, dtype=np.int64)), self.wte.weight.backend)
        B, T = idx.shape
        if T > self.config.block_size:
            raise ValueError(f"sequence of length {T} is longer than block_size {self.config.block_size}")
        x = self.drop(self.wte(idx) + self.wpe(self.positions(idx.backend, T)))  # (B, T, C) + (T, C)
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))  # (B, T, vocab)
        loss = None if targets is None else F.cross_entropy(logits, targets)
        return logits, loss

    def generate(self, idx: np.ndarray, max_new_tokens: int, temperature=1.0, top_k=None, rng=None) -> np.ndarray:
        """Extend idx (B, T) by sampling max_new_tokens tokens, each conditioned on the last block_size."""
        rng = rng or np.random.default_rng()
        idx = np.asarray(idx, dtype=np.int64)
        was_training = self.training
        self.eval()
        with no_grad():
            for _ in range(max_new_tokens):
                logits, _ = self(idx[:, -self.config.block_size:])
                last = logits[:, -1, :].numpy().astype(np.float64)  # (B, vocab)
                if temperature <= 0:  # greedy
                    nxt = last.argmax(axis=-1)
                else:
                    last = last / temperature
                    if top_k is not None and top_k < last.shape[-1]:
                        cutoff = np.sort(last, axis=-1)[:, -top_k][:, None]
                        last = np.where(last < cutoff, -np.inf, last)
                    p = np.exp(last - last.max(axis=-1, keepdims=True))
                    p /= p.sum(axis=-1, keepdims=True)
                    nxt = np.array([rng.choice(len(row), p=row) for row in p])
                idx = np.concatenate([idx, nxt[:, None]], axis=1)
        self.train(was_training)
        return idx
