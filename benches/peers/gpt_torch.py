"""PyTorch eager peer of `arrayjit gpt`: the same GPT (vocabulary 62, context 64, width 128,
4 heads, 2 layers, MLP 512 with exact GELU, pre-LayerNorm, causal attention, tied output head,
cross-entropy), batch 16, AdamW (lr 3e-3, betas 0.9/0.99, weight decay 0.01) with gradient
clipping at norm 1 — written as people write it in PyTorch (nn.Linear, view/transpose,
masked_fill, F.softmax). Prints the median step time in milliseconds for each thread count.

    PYTHONPATH=<torch> python3 benches/peers/gpt_torch.py --threads 1 2 --steps 30
"""

import argparse
import math
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Attention(nn.Module):
    def __init__(self, width, heads):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width)
        self.out = nn.Linear(width, width)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=2)
        shape = (b, t, self.heads, d // self.heads)
        q, k, v = (z.view(shape).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(k.size(-1))
        mask = torch.triu(torch.ones(t, t, dtype=torch.bool), diagonal=1)
        att = F.softmax(att.masked_fill(mask, float("-inf")), dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(b, t, d)
        return self.out(y)


class Block(nn.Module):
    def __init__(self, width, heads, hidden):
        super().__init__()
        self.norm1 = nn.LayerNorm(width)
        self.attention = Attention(width, heads)
        self.norm2 = nn.LayerNorm(width)
        self.up = nn.Linear(width, hidden)
        self.down = nn.Linear(hidden, width)

    def forward(self, x):
        x = x + self.attention(self.norm1(x))
        return x + self.down(F.gelu(self.up(self.norm2(x))))


class Gpt(nn.Module):
    def __init__(self, vocabulary, context, width, heads, layers, hidden):
        super().__init__()
        self.tokens = nn.Embedding(vocabulary, width)
        self.positions = nn.Embedding(context, width)
        self.blocks = nn.ModuleList(Block(width, heads, hidden) for _ in range(layers))
        self.norm = nn.LayerNorm(width)
        for p in self.parameters():
            if p.dim() > 1:
                nn.init.normal_(p, std=0.02)

    def forward(self, ids, targets):
        t = ids.shape[1]
        x = self.tokens(ids) + self.positions(torch.arange(t))
        for block in self.blocks:
            x = block(x)
        logits = self.norm(x) @ self.tokens.weight.t()
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def training_step(threads, seed=1):
    """The model, optimizer and one fixed batch at `threads` threads, and a function taking one
    training step (zero grads, forward, backward, clip, AdamW) that returns the loss."""
    vocabulary, context, batch = 62, 64, 16
    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    model = Gpt(vocabulary, context, 128, 4, 2, 512)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, betas=(0.9, 0.99), weight_decay=0.01)
    ids = torch.randint(0, vocabulary, (batch, context))
    targets = torch.randint(0, vocabulary, (batch, context))

    def step(m=model):
        opt.zero_grad(set_to_none=True)
        loss = m(ids, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return loss

    return model, step


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, nargs="+", default=[1])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--compile", action="store_true", help="also time torch.compile")
    args = ap.parse_args()
    for threads in args.threads:
        model, step = training_step(threads)
        variants = [("eager", model)]
        if args.compile:
            variants.append(("compile", torch.compile(model)))
        for name, m in variants:
            times = []
            for k in range(args.steps + 5):
                started = time.perf_counter()
                loss = step(m)
                if k >= 5:
                    times.append(time.perf_counter() - started)
            print(f"torch {name} threads={threads} step_ms={1e3 * statistics.median(times):.2f} loss={loss.item():.4f}")


if __name__ == "__main__":
    main()
