"""PyTorch eager peer of `arrayjit gpt`: the same GPT (vocabulary 62, context 64, width 128,
4 heads, 2 layers, MLP 512 with exact GELU, pre-LayerNorm, causal attention, tied output head,
cross-entropy), batch 16, AdamW (lr 3e-3, betas 0.9/0.99, weight decay 0.01) with gradient
clipping at norm 1 — written as people write it in PyTorch (nn.Linear, view/transpose,
masked_fill, F.softmax). Prints the median step time in milliseconds for each thread count.

    PYTHONPATH=<torch> python3 benches/peers/gpt_torch.py --threads 1 2 --steps 30

With `--check INIT.safetensors` it trains instead from the parameters `arrayjit gpt` saved before
its first step (`arrayjit gpt --steps 0 --checkpoint INIT.safetensors`), on the same batches of
the sonnets (the same Philox counter-based generator and windows), and prints the held-out loss
after each step, to compare with `arrayjit gpt --steps N --eval-every 1`:

    arrayjit gpt --steps 0 --sample 0 --checkpoint /tmp/init.safetensors
    arrayjit gpt --steps 5 --eval-every 1 --sample 0 --checkpoint /tmp/after.safetensors
    PYTHONPATH=<torch> python3 benches/peers/gpt_torch.py --check /tmp/init.safetensors --steps 5
With `--size CONTEXT,WIDTH,HEADS,LAYERS,BATCH` it times that model instead (MLP 4 × width, the
same optimizer), as `arrayjit bench`'s GPT size axis does, and prints one JSON line: the build
time (model and optimizer), the first step, the median step, and the process's peak resident
memory:

    PYTHONPATH=<torch> python3 benches/peers/gpt_torch.py --size 256,768,12,12,4 --threads 2 --steps 3

`--vocabulary 50257 --gelu-tanh` makes it GPT-2's model, `--sdpa` computes attention with
`F.scaled_dot_product_attention` (PyTorch's fused kernel), `--compile` times the model through
`torch.compile` (its first step includes the compile).
"""

import argparse
import math
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Attention(nn.Module):
    def __init__(self, width, heads, sdpa=False):
        super().__init__()
        self.heads = heads
        self.sdpa = sdpa
        self.qkv = nn.Linear(width, 3 * width)
        self.out = nn.Linear(width, width)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=2)
        shape = (b, t, self.heads, d // self.heads)
        q, k, v = (z.view(shape).transpose(1, 2) for z in (q, k, v))
        if self.sdpa:
            # PyTorch's fused attention (a flash kernel on CPU), as nanoGPT calls it.
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.out(y.transpose(1, 2).contiguous().view(b, t, d))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(k.size(-1))
        mask = torch.triu(torch.ones(t, t, dtype=torch.bool, device=att.device), diagonal=1)
        att = F.softmax(att.masked_fill(mask, float("-inf")), dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(b, t, d)
        return self.out(y)


class Block(nn.Module):
    def __init__(self, width, heads, hidden, sdpa=False, gelu="none"):
        super().__init__()
        self.gelu = gelu
        self.norm1 = nn.LayerNorm(width)
        self.attention = Attention(width, heads, sdpa)
        self.norm2 = nn.LayerNorm(width)
        self.up = nn.Linear(width, hidden)
        self.down = nn.Linear(hidden, width)

    def forward(self, x):
        x = x + self.attention(self.norm1(x))
        return x + self.down(F.gelu(self.up(self.norm2(x)), approximate=self.gelu))


class Gpt(nn.Module):
    def __init__(self, vocabulary, context, width, heads, layers, hidden, sdpa=False, gelu="none"):
        super().__init__()
        self.tokens = nn.Embedding(vocabulary, width)
        self.positions = nn.Embedding(context, width)
        self.blocks = nn.ModuleList(
            Block(width, heads, hidden, sdpa, gelu) for _ in range(layers)
        )
        self.norm = nn.LayerNorm(width)
        for p in self.parameters():
            if p.dim() > 1:
                nn.init.normal_(p, std=0.02)

    def forward(self, ids, targets):
        t = ids.shape[1]
        x = self.tokens(ids) + self.positions(torch.arange(t, device=ids.device))
        for block in self.blocks:
            x = block(x)
        logits = self.norm(x) @ self.tokens.weight.t()
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


MASK32 = (1 << 32) - 1


def philox_block(seed, stream, n):
    """Philox 4x32-10 as `arrayjit_tensor::rng::Philox::block`: four words for counter `n`."""
    c = [n & MASK32, (n >> 32) & MASK32, stream, 0x41727261]
    k = [seed & MASK32, (seed >> 32) & MASK32]
    for _ in range(10):
        p0, p1 = 0xD2511F53 * c[0], 0xCD9E8D57 * c[2]
        hi0, lo0, hi1, lo1 = p0 >> 32, p0 & MASK32, p1 >> 32, p1 & MASK32
        c = [hi1 ^ c[1] ^ k[0], lo1, hi0 ^ c[3] ^ k[1], lo0]
        k = [(k[0] + 0x9E3779B9) & MASK32, (k[1] + 0xBB67AE85) & MASK32]
    return c


def philox_uniform(seed, stream, i):
    b = philox_block(seed, stream, i)
    bits = ((b[0] << 21) ^ (b[1] >> 11)) & ((1 << 53) - 1)
    return bits / float(1 << 53)


def windows(data, batch, context, step, seed):
    """`arrayjit::gpt::batch`: `batch` windows of `context + 1` ids as inputs and targets."""
    starts = len(data) - context
    ids, targets = [], []
    for b in range(batch):
        u = philox_uniform(seed, 0x6774, step * batch + b)
        s = min(int(u * starts), starts - 1)
        ids.append(data[s:s + context])
        targets.append(data[s + 1:s + context + 1])
    return torch.tensor(ids), torch.tensor(targets)


def read_safetensors(path):
    """The f32 tensors of a safetensors file, by name (the format: a little-endian u64 header
    length, a JSON header of dtype/shape/offsets, then the data)."""
    import json
    import struct

    with open(path, "rb") as f:
        raw = f.read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    body = raw[8 + n:]
    out = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        assert meta["dtype"] == "F32", (name, meta["dtype"])
        lo, hi = meta["data_offsets"]
        values = torch.frombuffer(bytearray(body[lo:hi]), dtype=torch.float32)
        out[name] = values.reshape(meta["shape"]) if meta["shape"] else values.reshape(())
    return out


def load_arrayjit(model, path):
    """Copies arrayjit's GPT parameters into `model`: Q/K/V `[width, heads, head_width]` are
    `[width, width]` matrices applied as `x · W` (a Linear's weight is their transpose), the
    attention output `[heads, head_width, width]` likewise, the MLP weights `[in, out]`."""
    p = read_safetensors(path)
    d = model.tokens.weight.shape[1]
    with torch.no_grad():
        model.tokens.weight.copy_(p["token_embedding"])
        model.positions.weight.copy_(p["position_embedding"])
        for i, block in enumerate(model.blocks):
            a = f"block{i}."
            w = torch.cat([p[a + f"attention.{n}"].reshape(d, d).t() for n in ("query", "key", "value")])
            block.attention.qkv.weight.copy_(w)
            block.attention.qkv.bias.copy_(torch.cat([p[a + f"attention.{n}_bias"].reshape(d) for n in ("query", "key", "value")]))
            block.attention.out.weight.copy_(p[a + "attention.output"].reshape(d, d).t())
            block.attention.out.bias.copy_(p[a + "attention.output_bias"])
            for norm, name in ((block.norm1, "norm1"), (block.norm2, "norm2")):
                norm.weight.copy_(p[a + name + ".gain"])
                norm.bias.copy_(p[a + name + ".bias"])
            block.up.weight.copy_(p[a + "mlp.up.weight"].t())
            block.up.bias.copy_(p[a + "mlp.up.bias"])
            block.down.weight.copy_(p[a + "mlp.down.weight"].t())
            block.down.bias.copy_(p[a + "mlp.down.bias"])
        model.norm.weight.copy_(p["final_norm.gain"])
        model.norm.bias.copy_(p["final_norm.bias"])


def check(path, steps):
    """Trains from arrayjit's initial parameters on its batches; prints the held-out loss
    (`arrayjit gpt`'s: the mean over 4 batches of the last tenth) after each step."""
    import os

    text_path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../data/shakespeare-sonnets.txt")
    with open(text_path, encoding="utf-8") as f:
        text = f.read()
    vocab = sorted(set(text))
    index = {c: i for i, c in enumerate(vocab)}
    data = [index[c] for c in text]
    split = len(data) * 9 // 10
    train, held_out = data[:split], data[split:]
    context, batch = 64, 16
    torch.set_num_threads(1)
    model = Gpt(len(vocab), context, 128, 4, 2, 512)
    load_arrayjit(model, path)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.01)

    def held_out_loss():
        with torch.no_grad():
            return sum(model(*windows(held_out, batch, context, k, 0xE7A1)).item() for k in range(4)) / 4

    print(f"torch step 0: held-out loss {held_out_loss():.6f}")
    for step in range(steps):
        ids, targets = windows(train, batch, context, step, 1)
        opt.zero_grad(set_to_none=True)
        loss = model(ids, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        print(f"torch step {step + 1}: train loss {loss.item():.6f}, held-out loss {held_out_loss():.6f}")


def training_step(threads, seed=1, device="cpu", batch=16, autocast=None):
    """The model, optimizer and one fixed batch at `threads` threads on `device`, and a function
    taking one training step (zero grads, forward, backward, clip, AdamW) that returns the
    loss; `autocast` (a dtype such as torch.bfloat16) runs the forward under autocast, as
    `arrayjit gpt --precision bf16` multiplies its products in bf16."""
    vocabulary, context = 62, 64
    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    model = Gpt(vocabulary, context, 128, 4, 2, 512).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, betas=(0.9, 0.99), weight_decay=0.01)
    ids = torch.randint(0, vocabulary, (batch, context), device=device)
    targets = torch.randint(0, vocabulary, (batch, context), device=device)

    def step(m=model):
        opt.zero_grad(set_to_none=True)
        if autocast is None:
            loss = m(ids, targets)
        else:
            with torch.autocast(device_type=device, dtype=autocast):
                loss = m(ids, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return loss

    return model, step


def size_step(size, threads, steps, vocabulary=62, sdpa=False, gelu="none", compiled=False):
    """Times the GPT of `size` (context, width, heads, layers, batch) on one fixed batch: build,
    first step (with `compiled`, torch.compile's compile time is in it), median of `steps`
    more; prints them and the peak resident memory as JSON."""
    import json
    import resource

    context, width, heads, layers, batch = size
    torch.set_num_threads(threads)
    torch.manual_seed(1)
    started = time.perf_counter()
    model = Gpt(vocabulary, context, width, heads, layers, 4 * width, sdpa, gelu)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, betas=(0.9, 0.99), weight_decay=0.01)
    run = torch.compile(model) if compiled else model
    built = time.perf_counter()
    ids = torch.randint(0, vocabulary, (batch, context))
    targets = torch.randint(0, vocabulary, (batch, context))

    def step():
        opt.zero_grad(set_to_none=True)
        run(ids, targets).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()

    step()
    first = time.perf_counter() - built
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    # ru_maxrss is in KiB on Linux.
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps({
        "lib": "torch", "threads": threads, "attention": "sdpa" if sdpa else "unfused",
        "compiled": compiled, "build_s": built - started, "first_step_s": first,
        "step_s": statistics.median(times), "peak_rss_bytes": peak,
    }), flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, nargs="+", default=[1])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--compile", action="store_true", help="also time torch.compile")
    ap.add_argument("--check", metavar="INIT", help="train from arrayjit's initial checkpoint on its batches")
    ap.add_argument("--size", metavar="T,D,H,L,B", help="time the GPT of this context, width, heads, layers, batch")
    ap.add_argument("--vocabulary", type=int, default=62, help="token ids of --size's model (GPT-2: 50257)")
    ap.add_argument("--sdpa", action="store_true", help="--size's attention by F.scaled_dot_product_attention")
    ap.add_argument("--gelu-tanh", action="store_true", help="--size's GELU in its tanh form (GPT-2's)")
    args = ap.parse_args()
    if args.size:
        size_step(
            [int(v) for v in args.size.split(",")], args.threads[0], args.steps,
            vocabulary=args.vocabulary, sdpa=args.sdpa,
            gelu="tanh" if args.gelu_tanh else "none", compiled=args.compile,
        )
        return
    if args.check:
        check(args.check, args.steps)
        return
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
