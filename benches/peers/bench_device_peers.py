# Device peer for `arrayjit bench --backend <gpu backend>`: PyTorch on CUDA for the same
# workloads, timed the same way (one warm-up, then the median of repeated runs, each waiting
# for the device). Products run in f32 with TF32 off (cuBLAS's exact-f32 kernels), and with
# --kinds also as TF32 (allow_tf32 on) and on bf16 tensors. The GPT training step is
# gpt_torch.py's model and optimizer (the same as `arrayjit gpt`) on CUDA in fp32, eager and
# under torch.compile, and with --gpt-bf16 eager under bf16 autocast. Prints one JSON object
# per line:
# {"lib": "torch-cuda", "workload": "matmul 4096", "seconds": 0.01}
import argparse, json, os, statistics, sys, time

parser = argparse.ArgumentParser()
parser.add_argument("--sizes", default="1024,2048,4096")
parser.add_argument("--chain-m", type=int, default=256)
parser.add_argument("--gpt-batches", default="16,128")
parser.add_argument("--kinds", default="f32", help="matmul kinds: f32, tf32, bf16 (comma list)")
parser.add_argument("--gpt-bf16", action="store_true", help="also the GPT steps under bf16 autocast")
args = parser.parse_args()

try:
    import torch
except ImportError:
    print(json.dumps({"error": "PyTorch is not installed"}))
    raise SystemExit(0)
if not torch.cuda.is_available():
    print(json.dumps({"error": "PyTorch sees no CUDA device"}))
    raise SystemExit(0)

torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
dev = torch.device("cuda")


def timed(f, budget=1.0, max_reps=50):
    f()
    torch.cuda.synchronize()
    times = []
    start = time.perf_counter()
    while len(times) < 3 or (time.perf_counter() - start < budget and len(times) < max_reps):
        t0 = time.perf_counter()
        f()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def emit(workload, f):
    print(json.dumps({"lib": "torch-cuda", "workload": workload, "seconds": timed(f)}), flush=True)


with torch.no_grad():
    kinds = [k for k in args.kinds.split(",") if k]
    for n in [int(s) for s in args.sizes.split(",") if s]:
        a = torch.rand(n, n, device=dev) * 2 - 1
        b = torch.rand(n, n, device=dev) * 2 - 1
        if "f32" in kinds:
            emit(f"matmul {n}", lambda: a @ b)
        if "tf32" in kinds:
            torch.backends.cuda.matmul.allow_tf32 = True
            emit(f"matmul tf32 {n}", lambda: a @ b)
            torch.backends.cuda.matmul.allow_tf32 = False
        if "bf16" in kinds:
            a16, b16 = a.bfloat16(), b.bfloat16()
            emit(f"matmul bf16 {n}", lambda: a16 @ b16)
            del a16, b16
        del a, b
    n = args.chain_m << 20
    a, b, c, d = (torch.rand(n, device=dev) * 2 - 1 for _ in range(4))
    emit(f"chain relu(a*b+c)*d {args.chain_m}M", lambda: torch.relu(a * b + c) * d)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
for batch in [int(s) for s in args.gpt_batches.split(",") if s]:
    try:
        from gpt_torch import training_step

        model, step = training_step(1, device="cuda", batch=batch)
        emit(f"GPT step d128 L2 b{batch}", lambda: step(model))
        compiled = torch.compile(model)
        emit(f"GPT step d128 L2 b{batch} torch.compile", lambda: step(compiled))
        if args.gpt_bf16:
            model16, step16 = training_step(1, device="cuda", batch=batch, autocast=torch.bfloat16)
            emit(f"GPT step d128 L2 b{batch} bf16", lambda: step16(model16))
    except Exception as e:  # a peer that cannot run is a note, not the end of the table
        print(json.dumps({"error": f"PyTorch GPT step b{batch}: {e}"}), flush=True)
