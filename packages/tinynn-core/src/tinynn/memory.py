"""Will a training run fit? An estimate of its memory from the config alone, checked before the model is built.

A model too large for the machine otherwise ends in the kernel's out-of-memory killer, with no message, or a
`MemoryError` traceback. The estimate counts float32 parameters, gradients and AdamW's two moments, the
activations that the backward pass keeps, and the logits over the vocabulary with the temporaries of the
cross entropy. A hardware GPU keeps the model, its activations and its logits in memory of its own; a software
adapter (lavapipe) keeps them in the host's, so they count against the host there, as on the CPU.
"""
from __future__ import annotations

import os

from tinynn import model
from tinynn.errors import TinynnError

FLOAT = 4  # bytes: training runs in float32
# Per token and per block, the backward pass keeps (with the temporaries at its peak) about 40 floats per
# embedding channel and 6 per attention score; the logits cost 8 (B, T, vocab) arrays (the logits, softmax,
# gradient and cross entropy's temporaries); parameters 5 copies (weights, gradients, two moments, the
# update's temporary). Measured on the NumPy backend (peak RSS of two steps, vocabularies of 96 to 50,000,
# widths 32 to 512, contexts 32 to 256): these err high, by 0% to 41%. A checkpoint adds 6 copies on the host
# whatever the backend (the weights and moments held until a loss judges them, and their serialised bytes);
# on a GPU the host also draws the initial weights (a float64 array and its float32 copy: 3).
PER_CHANNEL, PER_SCORE, LOGIT_COPIES, PARAMETER_COPIES = 40, 6, 8, 5
CHECKPOINT_COPIES, INIT_COPIES = 6, 3


def parameter_count(cfg, vocab_size: int) -> int:
    """The GPT's parameters for a TrainConfig, counted from the model's definition without building it (a tied
    head's weight is the token table's: counted once; padded rows count)."""
    return model.parameter_count(cfg.model_config(vocab_size))


def checkpoint_bytes(cfg, vocab_size: int) -> int:
    """A checkpoint holds the weights and AdamW's two moments."""
    return 3 * FLOAT * parameter_count(cfg, vocab_size) + 2**20  # + metadata: config, history, characters


def training_bytes(cfg, vocab_size: int, n_tokens: int, on_device: bool = False,
                   device_in_host_memory: bool = False) -> dict:
    """The estimate's parts, in host memory. With `on_device` (a GPU backend), the initial weights are drawn
    on the host and checkpoints copied back; parameters, gradients, moments, activations and logits live in the
    GPU's memory, which is the host's too where `device_in_host_memory` (a software adapter)."""
    tokens = cfg.batch_size * cfg.block_size
    params = FLOAT * parameter_count(cfg, vocab_size)
    in_host = not on_device or device_in_host_memory
    copies = CHECKPOINT_COPIES + (INIT_COPIES if on_device else 0) + (PARAMETER_COPIES if in_host else 0)
    parts = {"parameters, gradients and AdamW state": copies * params, "token ids": 8 * n_tokens}
    if in_host:
        parts["activations"] = FLOAT * tokens * cfg.n_layer * (PER_CHANNEL * cfg.n_embd
                                                               + PER_SCORE * cfg.n_head * cfg.block_size)
        parts["logits"] = FLOAT * LOGIT_COPIES * tokens * cfg.model_config(vocab_size).padded_vocab_size
    return parts


def available_bytes() -> int | None:
    """Memory the system can give this process now (Linux's MemAvailable), or None where unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def check(cfg, vocab_size: int, n_tokens: int, on_device: bool = False, available: int | None = None,
          backend=None) -> None:
    """Raise a TinynnError with the estimate when the run will not fit in the host memory available. `backend`,
    the run's, says where its arrays live (`on_device` alone cannot tell a software adapter). A hardware GPU
    reports running out of its own memory as an error of its own; a software adapter's allocations come from
    the host, where running out ends in the out-of-memory killer, so they are counted here."""
    available = available_bytes() if available is None else available
    software = backend is not None and backend.is_gpu and backend.is_software
    if backend is not None:
        on_device = backend.is_gpu
    parts = training_bytes(cfg, vocab_size, n_tokens, on_device, device_in_host_memory=software)
    total = sum(parts.values())
    if available is not None and total > available:
        largest = max(parts, key=parts.get)
        raise TinynnError(f"this run needs about {gib(total)} of memory ({largest}: {gib(parts[largest])}; "
                          f"vocabulary {vocab_size}, n_embd {cfg.n_embd}, batch {cfg.batch_size} x "
                          f"{cfg.block_size}), only {gib(available)} of host memory is available"
                          + (f" ({backend.device_name} is a software adapter: its GPU memory is host memory)"
                             if software else "")
                          + ": make the model, the batch or the vocabulary smaller")


def gib(n: int) -> str:
    return f"{n / 2**30:,.2f} GiB"
