"""PyTorch's CPU decode of the lesson-sized GPT, the reference for `generation.py cpu`: the same shape (4 layers,
4 heads, 256 wide, block 128, vocabulary 96), an 11-token prompt, 117 new tokens, temperature 0.8 and top-k 20.

Eager PyTorch as a CPU user writes it: a static KV cache (B, nh, block, hs) per layer, the prompt in one prefill
pass that fills it, then one decode step per token whose query attends over the cached rows, sampling on the
CPU, nothing read back until the end. tokens/s = batch * 117 / seconds, prefill included, median of 5 runs.
torch is an optional tool here, never a dependency of tinynn.

    python apps/bench/torch_cpu_generation.py [threads]   # default: torch's own (the cores it may use)
"""
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn

VOCAB, BLOCK, WIDTH, HEADS, LAYERS = 96, 128, 256, 4, 4
HEAD = WIDTH // HEADS
PROMPT, NEW, TEMPERATURE, TOP_K = 11, 117, 0.8, 20


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(WIDTH), nn.LayerNorm(WIDTH)
        self.qkv, self.proj = nn.Linear(WIDTH, 3 * WIDTH), nn.Linear(WIDTH, WIDTH)
        self.fc, self.out = nn.Linear(WIDTH, 4 * WIDTH), nn.Linear(4 * WIDTH, WIDTH)

    def forward(self, x, k_cache, v_cache, start):
        """x (B, T, C) at positions start..start+T-1; their keys and values join the caches (B, nh, BLOCK, hs)."""
        B, T, _ = x.shape
        q, k, v = (t.view(B, T, HEADS, HEAD).transpose(1, 2) for t in self.qkv(self.ln1(x)).split(WIDTH, -1))
        k_cache[:, :, start:start + T], v_cache[:, :, start:start + T] = k, v
        keys, values = k_cache[:, :, :start + T], v_cache[:, :, :start + T]  # (B, nh, start + T, hs)
        y = F.scaled_dot_product_attention(q, keys, values, is_causal=T > 1)  # a prefill starts at 0: causal
        x = x + self.proj(y.transpose(1, 2).reshape(B, T, WIDTH))
        return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(VOCAB, WIDTH), nn.Embedding(BLOCK, WIDTH)
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.ln, self.head = nn.LayerNorm(WIDTH), nn.Linear(WIDTH, VOCAB)

    @torch.no_grad()
    def generate(self, prompt, new):
        B, T = prompt.shape
        caches = [(torch.zeros(B, HEADS, BLOCK, HEAD), torch.zeros(B, HEADS, BLOCK, HEAD)) for _ in self.blocks]
        out = torch.empty(B, T + new, dtype=torch.long)
        out[:, :T] = prompt
        tokens, start = prompt, 0
        for n in range(T, T + new):
            x = self.wte(tokens) + self.wpe(torch.arange(start, n))  # (B, n - start, C)
            for block, (k, v) in zip(self.blocks, caches):
                x = block(x, k, v, start)
            logits = self.head(self.ln(x[:, -1])) / TEMPERATURE  # (B, V)
            top, index = logits.topk(TOP_K, dim=-1)
            pick = torch.multinomial(F.softmax(top, dim=-1), 1)  # (B, 1)
            tokens = index.gather(-1, pick)
            out[:, n:n + 1] = tokens
            start = n
        return out


def tokens_per_s(model, batch, reps=5):
    prompt = torch.arange(1, PROMPT + 1).repeat(batch, 1)
    model.generate(prompt, NEW)  # warm-up
    rates = []
    for _ in range(reps):
        t0 = time.perf_counter()
        model.generate(prompt, NEW)
        rates.append(batch * NEW / (time.perf_counter() - t0))
    return statistics.median(rates)


def main():
    if len(sys.argv) > 1:
        torch.set_num_threads(int(sys.argv[1]))
    torch.manual_seed(0)
    model = GPT().eval()
    for batch in (1, 16):
        print(f"torch {torch.__version__} cpu, {torch.get_num_threads()} threads, batch {batch:>2}, {NEW} new "
              f"tokens: {tokens_per_s(model, batch):>9,.0f} tokens/s", flush=True)


if __name__ == "__main__":
    main()
