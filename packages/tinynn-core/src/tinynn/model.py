"""GPT: token and position embeddings, a stack of pre-norm transformer blocks, a final LayerNorm and a
linear head over the vocabulary (nanoGPT's shape, without weight tying, like the PyTorch reference bench)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tinynn import functional as F
from tinynn import generate as generation
from tinynn.nn import Block, Dropout, Embedding, LayerNorm, Linear, Module
from tinynn.tensor import Tensor


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

    def forward(self, idx, targets=None):
        """idx (B, T) token ids -> logits (B, T, vocab); with targets (B, T), also the mean cross entropy."""
        if not isinstance(idx, Tensor):
            idx = Tensor(self.wte.weight.backend.from_numpy(np.asarray(idx, dtype=np.int64)), self.wte.weight.backend)
        B, T = idx.shape
        if T > self.config.block_size:
            raise ValueError(f"sequence of length {T} is longer than block_size {self.config.block_size}")
        x = self.drop(F.embedding_with_positions(self.wte.weight, self.wpe.weight, idx))  # (B, T, C)
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))  # (B, T, vocab)
        loss = None if targets is None else F.cross_entropy(logits, targets)
        return logits, loss

    # --- generation (tinynn/generate.py drives these; x is an embedded window, embed_window's output) ---
    def prefill(self, x: Tensor, cache) -> Tensor:
        """The window x (B, T, C) in one pass, every position's keys and values kept in cache (a list of
        LayerCache, one per block) -> the last position's logits (B, vocab)."""
        for block, layer in zip(self.blocks, cache):
            x = block.prefill(x, layer)
        return self._last_logits(x)

    def decode(self, x: Tensor, cache) -> Tensor:
        """One new position x (B, 1, C), attending over the cached ones -> its logits (B, vocab)."""
        for block, layer in zip(self.blocks, cache):
            x = block.decode(x, layer)
        return self._last_logits(x)

    def window(self, x: Tensor) -> Tensor:
        """The window x (B, T, C) recomputed without a cache -> the last position's logits (B, vocab)."""
        for block in self.blocks:
            x = block(x)
        return self._last_logits(x)

    def _last_logits(self, x: Tensor) -> Tensor:
        B, T, _ = x.shape
        if T > 1:
            x = x[:, T - 1:]  # only the last position's next token is drawn
        return self.lm_head(self.ln_f(x)).reshape(B, self.config.vocab_size)  # (B, 1, vocab) -> (B, vocab)

    def generate(self, idx, max_new_tokens: int, temperature=1.0, top_k=None, seed=0, use_cache=True) -> np.ndarray:
        """idx (B, T) token ids extended by max_new_tokens sampled tokens -> (B, T + max_new_tokens).
        temperature 0 is greedy; top_k keeps the k likeliest tokens; the same seed gives the same text.
        use_cache=False recomputes the whole window for every token (the same tokens, slower)."""
        return generation.generate(self, idx, max_new_tokens, temperature, top_k, seed, use_cache)

    def stream(self, idx, max_new_tokens: int, temperature=1.0, top_k=None, seed=0, use_cache=True):
        """generate's tokens as they are drawn: an iterator of int arrays (B,), one per new token (read back in
        bursts at most 1/30 s apart, see generate.stream)."""
        return generation.stream(self, idx, max_new_tokens, temperature, top_k, seed, use_cache)
