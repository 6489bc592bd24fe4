"""PyTorch peer of fused attention alone: `F.scaled_dot_product_attention` (its flash kernel on
CPU), forward and backward, f32, causal, on [batch, heads, T, head_dim] tensors. Prints one JSON
line per thread count: the median time of a forward + backward and its rate in GFLOP/s counted
as FlashAttention-2 counts a causal pass (forward 2 products, backward 2.5 times that, over the
half of the scores the mask keeps).

    PYTHONPATH=<torch> python3 benches/peers/attention_torch.py --shape 4,12,1024,64 --threads 1 2
"""

import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="4,12,1024,64", help="batch,heads,T,head_dim")
    ap.add_argument("--threads", type=int, nargs="+", default=[1])
    ap.add_argument("--steps", type=int, default=5)
    args = ap.parse_args()
    b, h, t, e = (int(v) for v in args.shape.split(","))
    torch.manual_seed(1)
    q, k, v = (torch.randn(b, h, t, e, requires_grad=True) for _ in range(3))
    g = torch.randn(b, h, t, e)
    flops = 3.5 * 4.0 * b * h * t * t * e / 2.0
    for threads in args.threads:
        torch.set_num_threads(threads)
        times = []
        for k_ in range(args.steps + 1):
            started = time.perf_counter()
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            out.backward(g)
            elapsed = time.perf_counter() - started
            q.grad = k.grad = v.grad = None
            if k_ > 0:
                times.append(elapsed)
        s = statistics.median(times)
        print(json.dumps({"lib": "torch sdpa", "shape": args.shape, "threads": threads,
                          "s": s, "gflops": flops / s / 1e9}), flush=True)


if __name__ == "__main__":
    main()
