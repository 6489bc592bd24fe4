# Peers for `arrayjit bench`: the same workloads in NumPy (and PyTorch when installed), timed the
# same way (one warm-up, then the median of repeated runs). The thread count is fixed by the
# caller through OPENBLAS_NUM_THREADS / OMP_NUM_THREADS / MKL_NUM_THREADS before NumPy loads, and
# passed as --threads for PyTorch. Prints one JSON object per line:
#   {"lib": "numpy", "workload": "matmul 1024", "seconds": 0.0123}
# Set up with scripts/setup-bench.sh (a virtual environment with NumPy, PyTorch optional).
import argparse, json, statistics, sys, time

parser = argparse.ArgumentParser()
parser.add_argument("--threads", type=int, default=1)
parser.add_argument("--quick", action="store_true")
parser.add_argument("--only", default="", help="run only workloads whose name contains this")
args = parser.parse_args()
GPT = "GPT step d128 L2 b16"


def timed(f, budget=1.0, max_reps=20):
    f()
    times = []
    start = time.perf_counter()
    while len(times) < 3 or (time.perf_counter() - start < budget and len(times) < max_reps):
        t0 = time.perf_counter()
        f()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def emit(lib, workload, f):
    if args.only in workload:
        seconds = timed(f)
        print(json.dumps({"lib": lib, "workload": workload, "seconds": seconds}), flush=True)


def emit_compiled(workload, model, step):
    """`step(m)` through `torch.compile(model)`: its first step, which holds the compile (lib
    "torch.compile first step"), then its steps timed as the others (lib "torch.compile"). A
    compile that fails (no C compiler for inductor, an unsupported op) is reported on stderr and
    leaves the two cells empty."""
    import torch

    if args.only not in workload or not hasattr(torch, "compile"):
        return
    try:
        compiled = torch.compile(model)
        t0 = time.perf_counter()
        step(compiled)
        first = time.perf_counter() - t0
    except Exception as e:  # noqa: BLE001 - any failure of the peer's compiler
        print(f"torch.compile of {workload} failed: {e}", file=sys.stderr, flush=True)
        return
    print(json.dumps({"lib": "torch.compile first step", "workload": workload, "seconds": first}), flush=True)
    emit("torch.compile", workload, lambda: step(compiled))


def numpy_suite():
    import numpy as np

    rng = np.random.default_rng(1)
    f32 = np.float32
    sizes = [512, 1024] if args.quick else [512, 1024, 2048]
    for n in sizes:
        a = rng.uniform(-1, 1, (n, n)).astype(f32)
        b = rng.uniform(-1, 1, (n, n)).astype(f32)
        emit("numpy", f"matmul {n}", lambda: a @ b)
    n = 1 << 24
    a, b, c, d = (rng.uniform(-1, 1, n).astype(f32) for _ in range(4))
    emit("numpy", "chain relu(a*b+c)*d 16M", lambda: np.maximum(a * b + c, 0) * d)
    emit("numpy", "sum 16M", lambda: a.sum())
    x = rng.uniform(-1, 1, (4096, 1024)).astype(f32)

    def softmax():
        e = np.exp(x - x.max(1, keepdims=True))
        return e / e.sum(1, keepdims=True)

    emit("numpy", "softmax 4096x1024", softmax)
    xc = rng.uniform(-1, 1, (32, 1024, 64)).astype(f32)
    wc = rng.uniform(-1, 1, (64, 64)).astype(f32)
    emit("numpy", "conv-like nhc,oc->nho", lambda: (xc.reshape(-1, 64) @ wc.T).reshape(32, 1024, 64))

    sizes = [784, 256, 256, 10]
    W = [(rng.uniform(-1, 1, (i, o)) * np.sqrt(6 / i)).astype(f32) for i, o in zip(sizes, sizes[1:])]
    B = [np.zeros(o, f32) for o in sizes[1:]]
    xb = rng.uniform(-1, 1, (256, 784)).astype(f32)
    yb = np.eye(10, dtype=f32)[rng.integers(0, 10, 256)]
    lr = f32(0.01)

    def step():
        hs = [xb]
        h = xb
        for k in range(3):
            z = h @ W[k] + B[k]
            h = np.maximum(z, 0) if k < 2 else z
            hs.append(h)
        e = np.exp(h - h.max(1, keepdims=True))
        p = e / e.sum(1, keepdims=True)
        g = (p - yb) / f32(256)
        for k in (2, 1, 0):
            gw = hs[k].T @ g
            gb = g.sum(0)
            if k > 0:
                g = (g @ W[k].T) * (hs[k] > 0)
            W[k] -= lr * gw
            B[k] -= lr * gb

    emit("numpy", "MLP step 784-256-256-10 b256", step)


def torch_suite():
    try:
        import torch
    except ImportError:
        return
    torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(1)
    rand = lambda *s: torch.rand(*s, generator=g) * 2 - 1
    sizes = [512, 1024] if args.quick else [512, 1024, 2048]
    with torch.no_grad():
        for n in sizes:
            a, b = rand(n, n), rand(n, n)
            emit("torch", f"matmul {n}", lambda: a @ b)
        n = 1 << 24
        a, b, c, d = (rand(n) for _ in range(4))
        emit("torch", "chain relu(a*b+c)*d 16M", lambda: torch.relu(a * b + c) * d)
        emit("torch", "sum 16M", lambda: a.sum())
        x = rand(4096, 1024)
        emit("torch", "softmax 4096x1024", lambda: torch.softmax(x, 1))
        xc, wc = rand(32, 1024, 64), rand(64, 64)
        emit("torch", "conv-like nhc,oc->nho", lambda: torch.einsum("nhc,oc->nho", xc, wc))
    sizes = [784, 256, 256, 10]
    layers = [torch.nn.Linear(i, o) for i, o in zip(sizes, sizes[1:])]
    model = torch.nn.Sequential(layers[0], torch.nn.ReLU(), layers[1], torch.nn.ReLU(), layers[2])
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    xb = rand(256, 784)
    yb = torch.randint(0, 10, (256,), generator=g)

    def step(m=model):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(m(xb), yb).backward()
        opt.step()

    emit("torch", "MLP step 784-256-256-10 b256", step)
    emit_compiled("MLP step 784-256-256-10 b256", model, step)

    # The GPT training step of `arrayjit gpt` (benches/peers/gpt_torch.py: the same model and
    # optimizer, written as people write it in PyTorch).
    if args.only in GPT:
        import os

        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from gpt_torch import training_step

        gpt_model, gpt_step = training_step(args.threads)
        emit("torch", GPT, gpt_step)
        emit_compiled(GPT, gpt_model, gpt_step)


try:
    numpy_suite()
except ImportError:
    print(json.dumps({"error": "numpy is not installed (run scripts/setup-bench.sh)"}), flush=True)
    sys.exit(0)
torch_suite()
