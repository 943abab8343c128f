"""Generation's ops on the GPU (decode.wgsl): a decode step's embedding, KV-cache write, attention and sampling,
all reading the sequence length from a GPU array, so a step records once and replays. Methods of the backend
(backend.py's table); the NumPy references are in tinynn/numpy_backend.py under the same names."""
from __future__ import annotations

from tinynn_gpu.runtime.arrays import OnCpu
from tinynn_gpu.runtime.kernels import WG, groups


def embed_window(self, wte, wpe, tokens, length, count):
    batch, ring = tokens.shape
    block, c = wpe.shape
    out = self._empty((batch, count, c))
    self.rt.dispatch("decode", "embed_window_main", groups(out.size),
                     {"wte": wte, "wpe": wpe, "out": out, "tokens": tokens, "length": length},
                     {"size": out.size, "count": count, "cols": c, "ring": ring, "block": block})
    return out


def kv_cache_write_(self, k_cache, v_cache, qkv, length):
    batch, block, c = k_cache.shape
    n = batch * qkv.shape[1] * c
    self.rt.dispatch("decode", "kv_cache_write_main", groups(n),
                     {"qkv": qkv, "k_cache_out": k_cache, "v_cache_out": v_cache, "length": length},
                     {"size": n, "count": qkv.shape[1], "cols": c, "block": block})


def attention_decode(self, qkv, k_cache, v_cache, length, n_head, scale):
    batch, block, c = k_cache.shape
    if c // n_head > WG:  # the kernel gives each head element a thread
        raise OnCpu(f"attention_decode of head size {c // n_head} (at most {WG})")
    out = self._empty((batch, 1, c))
    self.rt.dispatch("decode", "attention_decode_main", batch * n_head,
                     {"qkv": qkv, "k_cache": k_cache, "v_cache": v_cache, "out": out, "length": length},
                     {"size": batch * n_head, "n_head": n_head, "head_size": c // n_head, "cols": c,
                      "block": block, "scale": float(scale)})
    return out


def sample_tokens_(self, logits, tokens, length, ids, *, temperature, top_k, seed):
    batch, vocab = logits.shape
    self.rt.dispatch("decode", "sample_tokens_main", batch,
                     {"logits": logits, "tokens": tokens, "length": length, "ids": ids},
                     {"size": batch, "vocab": vocab, "ring": tokens.shape[1], "top_k": min(int(top_k), vocab),
                      "seed": int(seed), "temperature": float(temperature)})


def advance_(self, length):
    self.rt.dispatch("decode", "advance_main", 1, {"length": length}, {"step": 1})
