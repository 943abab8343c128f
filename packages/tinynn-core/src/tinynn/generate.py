"""Text generation: a KV cache, and a decoder whose every step runs on the backend, from the prompt to the
last token, with nothing read back unless the caller wants the tokens now.

The state of the growing sequences lives in backend arrays, so a GPU backend records a step once and replays
it (`Backend.capture`): `tokens` (B, H) is a ring of token ids (token i at slot i % H) and `length` (1,)
counts them. A step embeds its window, runs the model, draws the next tokens on the backend
(`sample_tokens_`: temperature, top-k and a seeded hash, so the same seed gives the same text), and bumps the
length.
- prefill: the prompt's window (its last block_size tokens) in one batched pass, which fills the cache with
  every position's keys and values and draws the first new token;
- decode: while the sequence fits the window, each new token runs the blocks on its one position and attends
  over the cached keys and values;
- window: past block_size the window slides, every token changes position, and positions are learned
  embeddings, so no cached key stays valid: each token runs the whole window again. That is exactly what
  `use_cache=False` (`tinynn generate --no-cache`) does for every token, so both give the same text.

A model keeps its last Decoder: a later call with the same batch, sampling and parameter arrays restarts it
on the new prompt, so the steps it recorded replay from the first token (a program sampling in a loop, e.g.
during training, pays the eager warm-up and the recording once).

    >>> tokens = model.generate(prompt[None, :], 200, temperature=0.8, top_k=20, seed=1)  # (1, T + 200)
    >>> for ids in model.stream(prompt[None, :], 200): print(ids[0])                       # as they come
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
import numbers
import time
import warnings

import numpy as np

from tinynn.errors import TinynnError, TinynnNotice
from tinynn.tensor import Tensor, no_grad

READ_EVERY = 256  # tokens drawn between read-backs when nobody streams them (the ring holds them meanwhile)
STREAM_INTERVAL = 1 / 30  # seconds between read-backs while streaming: bursts 30 times a second read as a stream
MAX_SEED = 2**32 - 1  # the hash takes 32 bits


def check(max_new_tokens, temperature, top_k, seed, names: dict | None = None) -> None:
    """Refuse values generation cannot honour, naming the parameter (`names` maps some to the CLI's flags)."""
    names = {"max_new_tokens": "max_new_tokens", "temperature": "temperature", "top_k": "top_k", "seed": "seed",
             **(names or {})}
    if not isinstance(max_new_tokens, (int, np.integer)) or max_new_tokens < 0:
        raise TinynnError(f"{names['max_new_tokens']} must be an integer >= 0, got {max_new_tokens!r}")
    if not isinstance(temperature, numbers.Real) or not math.isfinite(temperature) or temperature < 0:
        raise TinynnError(f"{names['temperature']} must be a finite number >= 0 (0: greedy), got {temperature!r}")
    if top_k is not None and (not isinstance(top_k, (int, np.integer)) or top_k < 1):
        raise TinynnError(f"{names['top_k']} must be an integer >= 1, got {top_k!r}")
    if not isinstance(seed, (int, np.integer)) or not 0 <= seed <= MAX_SEED:
        raise TinynnError(f"{names['seed']} must be an integer from 0 to {MAX_SEED}, got {seed!r}")


def for_tokenizer(model, vocab: int, source: str):
    """The model, or where it predicts more tokens than its tokenizer's `vocab` (a GPT-2 folder whose
    config.json pads 50257 tokens to 50304, as nanoGPT's do), a copy that predicts those alone: an id past the
    tokenizer has no text to print. The copy's tables lose the rows past them, as vocab_multiple's padding is
    never sampled, so the tokenizer's tokens keep their relative odds."""
    config = model.config
    if config.vocab_size <= vocab:
        return model
    narrowed = dataclasses.replace(config, vocab_size=vocab)
    rows = narrowed.padded_vocab_size  # (V', C): the tokenizer's rows, padded as the model's were
    state = {name: array[:rows] if name in ("wte.weight", "lm_head.weight", "lm_head.bias") else array
             for name, array in model.state_dict().items()}
    copy = type(model)(narrowed).to(model.wte.weight.backend)
    copy.load_state_dict(state)
    warnings.warn(f"{source}: the model predicts {config.vocab_size:,} tokens, its tokenizer has {vocab:,}; "
                  f"ids {vocab} to {config.vocab_size - 1} have no text and are never sampled", TinynnNotice)
    return copy


class LayerCache:
    """One layer's keys and values for the window's positions, (B, block_size, C) each, and the shared
    length that says how many of the rows hold the sequence."""

    def __init__(self, backend, shape, length):
        self.backend = backend
        self.k, self.v = backend.full(shape, 0.0), backend.full(shape, 0.0)
        self.length = length

    def write(self, qkv: Tensor) -> None:
        """Keep the keys and values of qkv (B, T, 3C) as the window's last T positions."""
        self.backend.kv_cache_write_(self.k, self.v, qkv.data, self.length)

    def attend(self, qkv: Tensor, n_head: int) -> Tensor:
        """The last position's attention over the cached positions -> (B, 1, C)."""
        head_size = qkv.shape[-1] // 3 // n_head
        y = self.backend.attention_decode(qkv.data, self.k, self.v, self.length, n_head, 1.0 / math.sqrt(head_size))
        return Tensor(y, self.backend)


class Decoder:
    """B sequences growing one token per `step()`; the host copy `n` of their length decides the kind of step.
    `restart` begins new sequences of the same batch on the same arrays, so the steps recorded for the last ones
    replay from the first token (`_decoder` does that for repeated calls)."""

    def __init__(self, model, prompt: np.ndarray, temperature=1.0, top_k=None, seed=0, use_cache=True):
        self.model = model
        self.modules = list(model.modules())
        self.backend = be = model.wte.weight.backend
        self.block_size = block = model.config.block_size
        batch = prompt.shape[0]
        self.settings = _settings(model, batch, temperature, top_k, seed, use_cache)
        self.parameters = [p.data for p in model.parameters()]  # the arrays the recorded steps read
        self.tokens = be.from_numpy(np.zeros((batch, block + READ_EVERY), np.int32))
        self.length = be.from_numpy(np.zeros(1, np.int32))
        self.ids = be.from_numpy(np.zeros(batch, np.int32))
        _, temperature, top_k, seed, *_ = self.settings
        self.sampling = {"temperature": temperature, "top_k": top_k, "seed": seed}
        c = model.config
        self.cache = [LayerCache(be, (batch, block, c.n_embd), self.length) for _ in range(c.n_layer)] \
            if use_cache else None
        # the modules run (in inference mode) only when a step does: a replay runs no Python module code, so
        # a replayed token skips the mode switching too
        self._decode = be.capture(lambda: self._inferring(self._decode_step))
        self._window = be.capture(lambda: self._inferring(lambda: self._window_step(block)))
        self.busy = False  # a stream is reading from it: not to be restarted under it
        self.restart(prompt)

    def restart(self, prompt: np.ndarray) -> None:
        """New sequences from prompt (B, T): the ring and the length rewritten; the next step fills the cache
        (rows past the new length are never read)."""
        batch, self.n = prompt.shape
        ring = np.zeros((batch, self.block_size + READ_EVERY), np.int32)
        index = np.arange(max(0, self.n - ring.shape[1]), self.n)
        ring[:, index % ring.shape[1]] = prompt[:, index]
        self.backend.write_(self.tokens, ring)
        self.backend.write_(self.length, np.array([self.n], np.int32))
        self.prefilled = False

    def records(self, model, settings: tuple) -> bool:
        """Whether its recorded steps did this work: the same model, settings and parameter arrays."""
        arrays = [p.data for p in model.parameters()]
        return self.model is model and self.settings == settings and len(arrays) == len(self.parameters) \
            and all(a is b for a, b in zip(arrays, self.parameters))

    def step(self) -> None:
        """Draw every sequence's next token, on the backend: nothing is read back."""
        if self.n > self.block_size:
            self._window()
        elif self.cache is None:  # a window still growing: a new shape every step
            with self.backend.transient():
                self._inferring(lambda: self._window_step(self.n))
        elif self.prefilled:
            self._decode()
        else:
            with self.backend.transient():  # the prompt's length: a shape of its own
                self._inferring(lambda: self._draw(self.model.prefill(self._embed(self.n), self.cache)))
            self.prefilled = True
        self.n += 1

    def _inferring(self, fn) -> None:
        with _inference(self.modules):
            fn()

    def last_tokens(self, count: int) -> np.ndarray:
        """The last `count` tokens of each sequence, (B, count), count <= READ_EVERY: one read-back."""
        ring = self.backend.to_numpy(self.tokens)
        return ring[:, np.arange(self.n - count, self.n) % ring.shape[1]].astype(np.int64)

    def _embed(self, count: int) -> Tensor:
        m = self.model
        return Tensor(self.backend.embed_window(m.wte.weight.data, m.wpe.weight.data, self.tokens, self.length,
                                                count), self.backend)

    def _draw(self, logits: Tensor) -> None:
        """Sample each sequence's next token into self.ids and the ring, and count it."""
        self.backend.sample_tokens_(logits.data, self.tokens, self.length, self.ids, **self.sampling)
        self.backend.advance_(self.length)

    def _decode_step(self) -> None:
        self._draw(self.model.decode(self._embed(1), self.cache))  # the ids stay in self.ids: nothing returned

    def _window_step(self, count: int) -> None:
        self._draw(self.model.window(self._embed(count)))


def _settings(model, batch, temperature, top_k, seed, use_cache) -> tuple:
    """What a Decoder's recorded steps bake in besides the arrays they read (sampling goes in as kernel
    parameters)."""
    return batch, float(temperature), top_k or model.config.vocab_size, int(seed), bool(use_cache), \
        model.wte.weight.backend


def _prompt(model, prompt) -> np.ndarray:
    prompt = np.asarray(prompt)
    if prompt.ndim != 2 or prompt.shape[1] == 0:
        raise TinynnError(f"the prompt must be token ids shaped (batch, length >= 1), got shape {prompt.shape}")
    if prompt.min() < 0 or prompt.max() >= model.config.vocab_size:
        raise TinynnError(f"the prompt holds token ids outside 0..{model.config.vocab_size - 1}")
    return prompt


def _decoder(model, idx, temperature, top_k, seed, use_cache) -> Decoder:
    """A Decoder on idx: the model's last one, restarted, when no stream is reading from it and it recorded
    the same work (then its steps replay from the first token: no eager warm-up calls, no new recording,
    which a program sampling in a loop would otherwise pay on every call); else a new one, kept as the last."""
    prompt = _prompt(model, idx)
    last = getattr(model, "_last_decoder", None)
    settings = _settings(model, prompt.shape[0], temperature, top_k, seed, use_cache)
    if last is not None and not last.busy and last.records(model, settings):
        last.restart(prompt)
        return last
    model._last_decoder = Decoder(model, prompt, temperature, top_k, seed, use_cache)
    return model._last_decoder


@contextlib.contextmanager
def _inference(modules):
    """Dropout off and no graph for one step; the modules' modes are restored after it, so a paused stream
    leaves the model as it found it."""
    training = [m for m in modules if m.training]
    for m in training:
        m.training = False
    try:
        with no_grad():
            yield
    finally:
        for m in training:
            m.training = True


def stream(model, idx, max_new_tokens: int, temperature=1.0, top_k=None, seed=0, use_cache=True):
    """An iterator over the new tokens of the B sequences in idx (B, T): an int array (B,) per token, in
    generation order. The tokens are read back at most STREAM_INTERVAL apart, and the ones drawn meanwhile
    come out together: on a GPU a read-back per token would stall the device on every token. Bad arguments
    fail here, not at the first token."""
    check(max_new_tokens, temperature, top_k, seed)
    decoder = _decoder(model, idx, temperature, top_k, seed, use_cache)
    decoder.busy = True  # until the iterator ends or is closed; one never started keeps it (a new one is made)

    def tokens():
        try:
            unread, last_read = 0, time.perf_counter()
            for made in range(1, max_new_tokens + 1):
                decoder.step()
                unread += 1
                if made == max_new_tokens or unread == READ_EVERY or \
                        time.perf_counter() - last_read >= STREAM_INTERVAL:
                    yield from decoder.last_tokens(unread).T
                    unread, last_read = 0, time.perf_counter()
        finally:
            decoder.busy = False
    return tokens()


def generate(model, idx, max_new_tokens: int, temperature=1.0, top_k=None, seed=0, use_cache=True) -> np.ndarray:
    """idx (B, T) extended by max_new_tokens drawn tokens -> (B, T + max_new_tokens); the tokens are read
    back once per READ_EVERY."""
    check(max_new_tokens, temperature, top_k, seed)
    decoder = _decoder(model, idx, temperature, top_k, seed, use_cache)
    pieces = [np.asarray(idx, dtype=np.int64)]
    while decoder.n < pieces[0].shape[1] + max_new_tokens:
        count = min(READ_EVERY, pieces[0].shape[1] + max_new_tokens - decoder.n)
        for _ in range(count):
            decoder.step()
        pieces.append(decoder.last_tokens(count))
    return np.concatenate(pieces, axis=1)
