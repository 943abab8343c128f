"""PyTorch's training step for the same GPT that `tinynn bench` times, so a comparison is made in one run on
one machine: nanoGPT's shape, AdamW, gradient clipping at 1.0, one host sync a step (`loss.item()`).
torch is a tool here, never a tinynn dependency.

The model comes from the configs beside this file (lesson, mid, big, gpt2), read as tinynn reads them: its sizes,
its biases (`bias`, `head_bias`) and its head (`tie_embeddings`: the token table itself, as GPT-2's). The
vocabulary is the config's `vocab_size` padded to a multiple of `vocab_multiple`, as tinynn's tables are (gpt2:
GPT-2's 50257 in 50304 rows), else 65. The padded columns take part in PyTorch's softmax (nanoGPT's way;
tinynn masks them): the same work.

Modes, from what most users run to the strongest PyTorch has (on CUDA; on a CPU only `eager`):
  eager         eager kernels, AdamW's default (foreach) implementation
  eager_fused   eager kernels, fused AdamW
  graph         the whole step (forward, backward, clip, capturable fused AdamW) captured as one CUDA graph and
                replayed: the analogue of tinynn's captured step
and each graph again with `sdpa` (the fused attention kernel) and `tf32` (TF32 tensor cores for matmuls).
Every CUDA figure comes with its peak memory (`torch.cuda.max_memory_allocated`).

    python apps/bench/torch_reference.py                       # lesson, mid, big
    python apps/bench/torch_reference.py --configs gpt2 --json out.json
    python apps/bench/torch_reference.py --configs gpt2 --modes graph_sdpa,graph_sdpa_tf32
    CUDA_VISIBLE_DEVICES= python apps/bench/torch_reference.py --configs lesson   # the CPU, torch's threads
"""
import argparse
import json
import time
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = Path(__file__).parent


class Block(nn.Module):
    def __init__(self, d, n_head, bias=True):
        super().__init__()
        self.n_head = n_head
        self.ln1, self.ln2 = nn.LayerNorm(d, bias=bias), nn.LayerNorm(d, bias=bias)
        self.qkv, self.proj = nn.Linear(d, 3 * d, bias), nn.Linear(d, d, bias)
        self.fc, self.out = nn.Linear(d, 4 * d, bias), nn.Linear(4 * d, d, bias)

    def forward(self, x, sdpa):
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))  # (B, nh, T, hs)
        if sdpa:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = q @ k.transpose(-2, -1) * (C // self.n_head) ** -0.5  # (B, nh, T, T)
            causal = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
            y = att.masked_fill(~causal, float("-inf")).softmax(-1) @ v
        x = x + self.proj(y.transpose(1, 2).reshape(B, T, C))
        return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))  # tinynn's GELU is the tanh form


class GPT(nn.Module):
    def __init__(self, vocab, block, d, n_head, n_layer, sdpa, bias=True, head_bias=True, tie=False):
        super().__init__()
        self.sdpa = sdpa
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(block, d)
        self.blocks = nn.ModuleList(Block(d, n_head, bias) for _ in range(n_layer))
        self.ln_f, self.head = nn.LayerNorm(d, bias=bias), nn.Linear(d, vocab, bias and head_bias)
        if tie:  # GPT-2's head: one parameter, used twice (model.parameters() lists it once)
            self.head.weight = self.wte.weight

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x, self.sdpa)
        logits = self.head(self.ln_f(x))  # (B, T, V)
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def shape(name: str) -> dict:
    raw = json.loads((HERE / f"{name}.json").read_text())
    multiple = raw.get("vocab_multiple", 1)
    tokens = raw.get("vocab_size", 65)
    return {"tokens": tokens, "vocab": -(-tokens // multiple) * multiple, "block": raw["block_size"],
            "batch": raw["batch_size"], "d": raw["n_embd"], "n_head": raw["n_head"], "n_layer": raw["n_layer"],
            "bias": raw.get("bias", True), "head_bias": raw.get("head_bias", True),
            "tie": raw.get("tie_embeddings", False)}


def training_step(s: dict, device: str, mode: str = "eager", sdpa=False):
    """One training step of a config's model (AdamW, clip 1.0, as tinynn's bench), as a function returning the
    loss; `mode` "graph" makes its optimizer capturable, and any mode but "eager" fused on CUDA."""
    torch.manual_seed(0)
    model = GPT(s["vocab"], s["block"], s["d"], s["n_head"], s["n_layer"], sdpa, s["bias"], s["head_bias"],
                s["tie"]).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.99), weight_decay=0.1,
                            fused=mode != "eager" and device == "cuda", capturable=mode == "graph")
    idx = torch.randint(0, s["tokens"], (s["batch"], s["block"]), device=device)  # ids of tokens, not of padding

    def step():
        loss = model(idx, idx)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=False)  # a graph replays into the same gradient buffers
        return loss
    return step


def step_ms(s: dict, mode: str, device: str, sdpa=False, tf32=False, steps=50) -> float:
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = tf32
    step = training_step(s, device, mode, sdpa)
    run = step
    if mode == "graph":  # warm up on a side stream (as CUDA graph capture requires), then capture once
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                step()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            loss = step()

        def run():
            graph.replay()
            return loss
    start = time.perf_counter()
    while time.perf_counter() - start < 1.0:  # clocks up, kernels chosen
        run().item()
    start = time.perf_counter()
    for _ in range(steps):
        run().item()
    return (time.perf_counter() - start) / steps * 1e3


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--configs", default="lesson,mid,big", help="comma-separated config names in apps/bench")
    p.add_argument("--steps", type=int, default=50, help="timed steps per mode (5 on a CPU)")
    p.add_argument("--json", help="also write the results to this file")
    p.add_argument("--modes", help="only these, comma-separated, named as printed without the config: e.g. "
                                   "graph_sdpa,graph_sdpa_tf32 (default: all)")
    args = p.parse_args()
    cuda = torch.cuda.is_available()
    results = {"torch": torch.__version__,
               "device": torch.cuda.get_device_name() if cuda else f"cpu, {torch.get_num_threads()} threads"}
    modes = [("eager", {}), ("eager_fused", {}), ("graph", {}), ("graph", {"sdpa": True}),
             ("graph", {"sdpa": True, "tf32": True})] if cuda else [("eager", {})]
    if args.modes:
        wanted = args.modes.split(",")
        unknown = set(wanted) - {"_".join([mode, *flags]) for mode, flags in modes}
        if unknown:
            p.error(f"--modes: no mode {', '.join(sorted(unknown))} here")
        modes = [(mode, flags) for mode, flags in modes if "_".join([mode, *flags]) in wanted]
    for name in args.configs.split(","):
        s = shape(name)
        for mode, flags in modes:
            key = "_".join([name, mode, *flags]) + "_ms"
            if cuda:
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats()
            try:
                results[key] = round(step_ms(s, mode, "cuda" if cuda else "cpu", steps=args.steps if cuda else 5,
                                             **flags), 3)
            except Exception as e:  # one mode's failure (out of memory, say) should not hide the others
                results[key] = f"failed: {type(e).__name__}: {str(e)[:200]}"
            line = f"{key} {results[key]}"
            if cuda:
                peak = results[key[:-3] + "_peak_gb"] = round(torch.cuda.max_memory_allocated() / 1e9, 3)
                line += f" (peak {peak} GB)"
            print(line, flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
