"""GPT: token and position embeddings, a stack of pre-norm transformer blocks, a final LayerNorm and a
linear head over the vocabulary (nanoGPT's shape), fused with the loss in training (llm.c's classifier:
F.classifier). The head is a matrix of its own by default, as in the PyTorch reference bench; with
`tie_embeddings` it is the token table itself, as in GPT-2.

Here are its configuration (`GPTConfig`), its blocks (attention, MLP, `Block`) and the model (`GPT`); the
generic layers they are made of are nn.py's.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from tinynn import functional as F
from tinynn import generate as generation
from tinynn import nn
from tinynn.errors import TinynnError
from tinynn.nn import Dropout, Embedding, LayerNorm, Linear, Module
from tinynn.tensor import Tensor


@dataclass(kw_only=True)
class Architecture:
    """A GPT's shape but its vocabulary (how its tables pad one is here): the model fields of a training config
    (config.TrainConfig inherits them), whose vocabulary comes from its data. The defaults are the lesson's
    model (apps/chargpt/lesson.json, `tinynn bench`'s default)."""
    block_size: int = 128  # the context: positions a token attends over
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 256
    dropout: float = 0.0
    bias: bool = True
    head_bias: bool = True  # with bias: the head's too (GPT-2's head has none: a GPT-2 folder loads with false)
    # GPT-2's layout: the head is the token table (one parameter read twice, its two gradients summed; a checkpoint
    # holds it once, as wte.weight)
    tie_embeddings: bool = False
    # The token table's and the head's rows: the vocabulary rounded up to a multiple of this (64 takes GPT-2's 50257
    # tokens to 50304, a size matmul tiles divide). The padded rows are no token: their logits are masked out of
    # the loss's softmax and out of generation, so the vocabulary a model predicts is always its vocab_size.
    vocab_multiple: int = 1

    def problems(self):
        """(field, why) for each value a GPT cannot be built with, in the order they are checked; the types are
        the caller's to check."""
        for key in ("block_size", "n_layer", "n_head", "n_embd"):
            if getattr(self, key) < 1:
                yield key, f"must be at least 1, got {getattr(self, key)}"
        if self.n_head >= 1 and self.n_embd % self.n_head:
            yield "n_embd", f"({self.n_embd}) must be divisible by n_head ({self.n_head})"
        if not 0.0 <= self.dropout < 1.0:
            yield "dropout", f"must be in [0, 1), got {self.dropout}"
        if self.vocab_multiple < 1:
            yield "vocab_multiple", f"must be at least 1, got {self.vocab_multiple}"


@dataclass(kw_only=True)
class GPTConfig(Architecture):
    vocab_size: int = 65  # the lesson's: Shakespeare's characters; the tokens, whatever the tables' padding

    @property
    def padded_vocab_size(self) -> int:
        """The rows of the token table and the head: vocab_size rounded up to a multiple of vocab_multiple."""
        return -(-self.vocab_size // self.vocab_multiple) * self.vocab_multiple


class CausalSelfAttention(Module):
    def __init__(self, n_embd, n_head, n_layer, dropout=0.0, bias=True):
        self.n_head = n_head
        self.qkv = Linear(n_embd, 3 * n_embd, bias)
        self.proj = Linear(n_embd, n_embd, bias, std=0.02 / math.sqrt(2 * n_layer))  # GPT-2's residual scaling
        self.attn_dropout = Dropout(dropout)
        self.resid_dropout = Dropout(dropout)

    def forward(self, x, residual=None):
        qkv = self.qkv(x)  # (B, T, 3C)
        if self.training and self.attn_dropout.p > 0:
            y = self._attention_with_dropout(qkv)
        else:
            y = F.attention(qkv, self.n_head)  # (B, T, C)
        return _project(self.proj, y, self.resid_dropout, residual)

    def _attention_with_dropout(self, qkv):
        """The unfused path: the dropout mask applies to the T x T probabilities, which the fused op never
        materialises (on the GPU the step then runs eagerly: dropout draws a new mask every step)."""
        B, T, C3 = qkv.shape
        hs = C3 // 3 // self.n_head
        qkv = qkv.reshape(B, T, 3, self.n_head, hs).permute(2, 0, 3, 1, 4)  # (3, B, nh, T, hs)
        q, k, v = qkv[0], qkv[1], qkv[2]  # each (B, nh, T, hs)
        att = F.matmul(q, k, transpose_b=True)  # (B, nh, T, T)
        att = self.attn_dropout(F.softmax(att, causal=True, scale=1.0 / math.sqrt(hs)))
        return (att @ v).permute(0, 2, 1, 3).reshape(B, T, C3 // 3)  # (B, nh, T, hs) -> (B, T, C)

    def decode(self, x, cache, residual=None):
        """x (B, 1, C), one new position: its keys and values join the cache (a generate.LayerCache), its
        query attends over every cached position; `residual` is added in the projection, as in forward."""
        qkv = self.qkv(x)  # (B, 1, 3C)
        cache.write(qkv)
        return self.proj(cache.attend(qkv, self.n_head), residual=residual)


class MLP(Module):
    def __init__(self, n_embd, n_layer, dropout=0.0, bias=True):
        self.fc = Linear(n_embd, 4 * n_embd, bias)
        self.proj = Linear(4 * n_embd, n_embd, bias, std=0.02 / math.sqrt(2 * n_layer))
        self.dropout = Dropout(dropout)

    def forward(self, x, residual=None):
        """proj(gelu(fc(x))) + residual as one fused op (F.mlp), unless a dropout comes before the add."""
        if self.dropout.training and self.dropout.p > 0:
            y = self.dropout(F.mlp(x, self.fc.weight, self.fc.bias, self.proj.weight, self.proj.bias))
            return y if residual is None else residual + y
        return F.mlp(x, self.fc.weight, self.fc.bias, self.proj.weight, self.proj.bias, residual)


class Block(Module):
    """A pre-norm transformer block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, n_embd, n_head, n_layer, dropout=0.0, bias=True):
        self.ln1 = LayerNorm(n_embd, bias)
        self.attn = CausalSelfAttention(n_embd, n_head, n_layer, dropout, bias)
        self.ln2 = LayerNorm(n_embd, bias)
        self.mlp = MLP(n_embd, n_layer, dropout, bias)

    def forward(self, x):
        x = self.attn(self.ln1(x), residual=x)  # x + attn(ln1(x)), the add fused into attn's projection
        return self.mlp(self.ln2(x), residual=x)

    def prefill(self, x, cache):
        """forward, with every position's keys and values kept in the cache for the tokens that follow
        (the projection runs a second time here: once per prompt, so forward stays the one training path)."""
        cache.write(self.attn.qkv(self.ln1(x)))
        return self(x)

    def decode(self, x, cache):
        """forward for one new position x (B, 1, C), attending over the cached ones."""
        x = self.attn.decode(self.ln1(x), cache, residual=x)
        return self.mlp(self.ln2(x), residual=x)


def _project(proj: Linear, x, dropout: Dropout, residual):
    """dropout(proj(x)) + residual, the add fused into proj's matmul unless a dropout comes between."""
    if residual is None:
        return dropout(proj(x))
    if dropout.training and dropout.p > 0:
        return residual + dropout(proj(x))
    return proj(x, residual=residual)


class GPT(Module):
    def __init__(self, config: GPTConfig):
        for key, why in config.problems():
            raise TinynnError(f"{key} {why}")
        self.config = config
        c = config
        self.wte = Embedding(c.padded_vocab_size, c.n_embd)
        self.wpe = Embedding(c.block_size, c.n_embd)
        self.drop = Dropout(c.dropout)
        self.blocks = [Block(c.n_embd, c.n_head, c.n_layer, c.dropout, c.bias) for _ in range(c.n_layer)]
        self.ln_f = LayerNorm(c.n_embd, c.bias)
        self.lm_head = Linear(c.n_embd, c.padded_vocab_size, c.bias and c.head_bias,
                              weight=self.wte.weight if c.tie_embeddings else None)

    def forward(self, idx, targets=None):
        """idx (B, T) token ids -> (logits (B, T, vocab), None); with targets (B, T), (None, the mean cross entropy):
        then the head and the loss are one fused op (F.classifier) that never makes the B x T x vocab logits whole
        nor keeps them for the backward."""
        if not isinstance(idx, Tensor):
            idx = Tensor(self.wte.weight.backend.from_numpy(np.asarray(idx, dtype=np.int64)), self.wte.weight.backend)
        B, T = idx.shape
        if T > self.config.block_size:
            raise ValueError(f"sequence of length {T} is longer than block_size {self.config.block_size}")
        x = self.drop(F.embedding_with_positions(self.wte.weight, self.wpe.weight, idx))  # (B, T, C)
        for block in self.blocks:
            x = block(x)
        x = self.ln_f(x)
        if targets is not None:
            head = self.lm_head
            return None, F.classifier(x, head.weight, head.bias, targets, self.config.vocab_size)
        return self._vocabulary(self.lm_head(x)), None  # (B, T, vocab)

    def load_state_dict(self, state: dict) -> None:
        """nn.Module's, with a head tied in one and not in the other refused by name (a tied model's state has no
        lm_head.weight: its head is wte.weight)."""
        if self.config.tie_embeddings and "lm_head.weight" in state:
            raise TinynnError("state dict has a head of its own (lm_head.weight), this model's head is its token "
                              "table (tie_embeddings true): build it with tie_embeddings false")
        if not self.config.tie_embeddings and "lm_head.weight" not in state and "wte.weight" in state:
            raise TinynnError("state dict has no lm_head.weight (its head is tied to wte), this model has a head of "
                              "its own (tie_embeddings false): build it with tie_embeddings true")
        super().load_state_dict(state)

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
        logits = self.lm_head(self.ln_f(x)).reshape(B, self.config.padded_vocab_size)  # (B, 1, Vp) -> (B, Vp)
        return self._vocabulary(logits)  # (B, vocab)

    def _vocabulary(self, logits: Tensor) -> Tensor:
        """The logits of the real tokens: the head's padded columns (vocab_multiple) dropped."""
        vocab = self.config.vocab_size
        return logits if logits.shape[-1] == vocab else logits[..., :vocab]

    def generate(self, idx, max_new_tokens: int, temperature=1.0, top_k=None, seed=0, use_cache=True) -> np.ndarray:
        """idx (B, T) token ids extended by max_new_tokens sampled tokens -> (B, T + max_new_tokens).
        temperature 0 is greedy; top_k keeps the k likeliest tokens; the same seed gives the same text.
        use_cache=False recomputes the whole window for every token (the same tokens, slower)."""
        return generation.generate(self, idx, max_new_tokens, temperature, top_k, seed, use_cache)

    def stream(self, idx, max_new_tokens: int, temperature=1.0, top_k=None, seed=0, use_cache=True):
        """generate's tokens as they are drawn: an iterator of int arrays (B,), one per new token (read back in
        bursts at most 1/30 s apart, see generate.stream)."""
        return generation.stream(self, idx, max_new_tokens, temperature, top_k, seed, use_cache)


def parameter_count(config: GPTConfig) -> int:
    """The number of parameters of GPT(config), counted from the model's definition without making them."""
    with nn.shapes_only():
        return sum(p.size for p in GPT(config).parameters())
