"""Hugging Face `transformers`' GPT-2 beside `arrayjit generate` (issue 65's peer).

    python gpt2_generate_torch.py --model DIR [--threads N] [--tokens 64] [--prefill 512]
        [--dtype float32|bfloat16]

Prints one JSON line: the decode rate of `generate` with its KV cache (greedy, batch 1, eight
prompt tokens; the rate counts the new tokens after the first over the time after the first
token, the first token's time being the prompt's forward), and the time of one forward of
`--prefill` tokens (the median of 3 after one untimed). `--dtype bfloat16` loads the weights in
bf16 (PyTorch then computes in bf16 too). Needs torch and transformers.
"""

import argparse
import json
import statistics
import time

import torch
from transformers import GPT2LMHeadModel


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--prefill", type=int, default=512)
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    m = GPT2LMHeadModel.from_pretrained(a.model, dtype=getattr(torch, a.dtype)).eval()
    prompt = torch.tensor([[15496, 11, 314, 1101, 257, 3303, 2746, 11]])
    mask = torch.ones_like(prompt)
    with torch.no_grad():
        m.generate(prompt, attention_mask=mask, max_new_tokens=4, do_sample=False, pad_token_id=0)
        # The first new token's time: one forward of the prompt.
        t = time.perf_counter()
        m.generate(prompt, attention_mask=mask, max_new_tokens=1, do_sample=False, pad_token_id=0)
        first = time.perf_counter() - t
        t = time.perf_counter()
        out = m.generate(
            prompt, attention_mask=mask, max_new_tokens=a.tokens, do_sample=False,
            pad_token_id=0, min_new_tokens=a.tokens,
        )
        total = time.perf_counter() - t
        assert out.shape[1] == prompt.shape[1] + a.tokens
        ids = torch.randint(0, 50257, (1, a.prefill))
        m(ids)
        times = []
        for _ in range(3):
            t = time.perf_counter()
            m(ids)
            times.append(time.perf_counter() - t)
    print(json.dumps({
        "threads": a.threads,
        "dtype": a.dtype,
        "decode_tokens_per_s": (a.tokens - 1) / max(1e-9, total - first),
        "generate_total_s": total,
        "prefill_tokens": a.prefill,
        "prefill_ms": statistics.median(times) * 1e3,
    }))


if __name__ == "__main__":
    main()
