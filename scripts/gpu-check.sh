#!/usr/bin/env bash
# The GPU checks of issues 36 and 37 as one prepared run on a lent GPU machine (H100/H200), within
# its few minutes of device time (about 2 minutes on an H200 when everything works; each phase
# has its own timeout, 9 minutes in all). Prepare on
# the build machine (no GPU needed):
#
#   cargo build --release -p arrayjit-cli
#   cargo test --release -p arrayjit --no-run --test differential --test gpt --test bf16_training \
#     --test matrix_units --test tensor_copies --test simt_tiles --test memory_limits --test large_arrays 2>&1 | grep -o 'target/release/deps/[a-z0-9_]*-[0-9a-f]*' > /tmp/tests
#   cargo build --release -p arrayjit --example attention_bench
#   mkdir -p .gpu && cp target/release/arrayjit target/release/examples/attention_bench $(cat /tmp/tests) .gpu/ \
#     && strip .gpu/* && xz -T0 -6 .gpu/*
#
# (about 16 MB). Optionally also NVRTC 12.9 as CI uses it (about 30 MB more; without it the
# machine's toolkit NVRTC is used, CUDA 13 on the lent H200s, which compiled everything too):
#
#   mkdir -p .gpu/nvrtc12 && cp <wheel>/nvidia/cuda_nvrtc/lib/libnvrtc{.so.12,-builtins.so.12.9} \
#     .gpu/nvrtc12/ && xz -T0 -6 .gpu/nvrtc12/*
#
# then run `bash scripts/gpu-check.sh` on the device machine, from the repository's root, with
# `.gpu` carried (it is ignored by git). What it prints goes to $OUT/gpu-check.log (where $OUT is
# set, else /tmp); the device table to bench.md, the tests' output to tests.log and Nsight
# Compute's kernel times to ncu-gpt-b16.csv, ncu-gpt-b128.csv and ncu-matmul.csv beside it.
#
# Phases, in order: a smoke run of the GPT demo (with CUDA graphs; again without them if that
# fails, and the rest then runs without them), the device table beside PyTorch, the tests that
# run on `cuda`, the large arrays of issue 40 (`large`), every kernel's time of one GPT step
# (`ncu-gpt`) and of the 4096 products (`ncu-matmul`), Nsight Compute's occupancy, warp
# states and memory sections of the 4096 products (`ncu-detail`, to ncu-detail.csv), and the
# fused attention alone, forward + backward at GPT-2's heads (`attention`: batch 4, 12 heads of
# 64, T = 1024, causal; the GPU attention pass of issue 64 against the unfused path), the
# schedule search of the 4096 products on the device (`search`: tiles, matrix-unit buffers and their depth,
# tensor copies, group sizes, each timed; to search.log). The device table and Nsight Compute
# also take the bf16 products with their factors staged by the tensor memory accelerator
# (`matmul bf16 tma N`), off by default: check its rows and its tests first. PHASES (space-separated, default: all of smoke
# bench tests attention large ncu-gpt ncu-matmul ncu-detail search) selects some, to fit the device time
# left.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-/tmp}"
exec > >(tee "$out/gpu-check.log") 2>&1
phase() { echo "== $(date +%T) $*"; }
phases="${PHASES:-smoke bench tests attention large ncu-gpt ncu-matmul ncu-detail search}"
want() { [[ " $phases " == *" $1 "* ]]; }

bin=.gpu
for f in "$bin"/*.xz "$bin"/nvrtc12/*.xz; do [ -e "$f" ] && xz -d -f "$f"; done
chmod +x "$bin"/* 2>/dev/null

# cudarc opens libnvrtc.so: point it at the NVRTC that CI uses (12.9, from NVIDIA's wheel, carried
# in .gpu/nvrtc12 when it fits), else at the toolkit's (or a Python wheel's) NVRTC.
mkdir -p /tmp/nvrtc
nvrtc=
for c in "$PWD/$bin"/nvrtc12/libnvrtc.so.* /usr/local/cuda/lib64/libnvrtc.so*; do
  case "$c" in *builtins*) ;; *) [ -e "$c" ] && { nvrtc=$c; break; } ;; esac
done
[ -z "$nvrtc" ] && nvrtc=$(find / -name 'libnvrtc.so*' -not -path '/proc/*' 2>/dev/null | grep -v builtins | head -1)
echo "NVRTC: $nvrtc"
ln -sf "$nvrtc" /tmp/nvrtc/libnvrtc.so
export LD_LIBRARY_PATH="/tmp/nvrtc:$(dirname "$nvrtc")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export ARRAYJIT_CACHE_DIR="${TMPDIR:-/tmp}/arrayjit-cache"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,driver_version --format=csv,noheader || true
python3 -c 'import torch; print("torch", torch.__version__, torch.cuda.get_device_name(0))' 2>&1 | tail -1

if want smoke; then
phase "smoke: 3 GPT steps on cuda (f32, then bf16), losses to compare with sync_cc's"
gpt() { timeout 60 "$bin/arrayjit" --backend cuda gpt --steps 3 --eval-every 3 --sample 0 \
  --checkpoint /tmp/smoke.safetensors "$@" 2>&1 | grep -v -E '^\s*$' | tail -8; }
if ! gpt; then
  echo "-- failed with CUDA graphs; again without them (ARRAYJIT_CUDA_GRAPHS=0 from here on)"
  export ARRAYJIT_CUDA_GRAPHS=0
  gpt
fi
gpt --precision bf16
fi

if want bench; then
phase "the device table: f32 / TF32 / bf16 products, the chain, the GPT step in f32 and bf16, beside PyTorch"
timeout 300 "$bin/arrayjit" bench --backend cuda --python python3 > "$out/bench.md"
echo "bench exit $?"
cat "$out/bench.md"
fi

if want attention && [ -x "$bin/attention_bench" ]; then
phase "attention: fused (the GPU attention pass) and unfused, forward + backward, b4 h12 T1024 d64"
for kind in fused unfused; do
  ARRAYJIT_BACKEND=cuda timeout 90 "$bin/attention_bench" 4 12 1024 64 "$kind" 10
  echo "attention $kind exit $?"
done
python3 - <<'PY' 2>&1 | tail -2
import time, torch
import torch.nn.functional as F
q, k, v = (torch.randn(4, 12, 1024, 64, device="cuda", requires_grad=True) for _ in range(3))
def step():
    F.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward()
for _ in range(3): step()
torch.cuda.synchronize(); t = time.perf_counter()
for _ in range(10): step()
torch.cuda.synchronize(); print("torch SDPA fwd+bwd ms", (time.perf_counter() - t) / 10 * 1e3)
PY
fi

if want tests; then
phase "tests on cuda (in parallel: correctness only)"
export ARRAYJIT_REQUIRE_BACKENDS=sync_cc,cuda
pids=()
for t in differential gpt bf16_training matrix_units tensor_copies simt_tiles; do
  exe=$(ls "$bin"/${t}-* 2>/dev/null | head -1)
  [ -n "$exe" ] && (timeout 100 "$exe" --test-threads 4 > "/tmp/test-$t.log" 2>&1; echo "$t exit $?" >> "/tmp/test-$t.log") &
  pids+=($!)
done
wait "${pids[@]}" # not a bare `wait`: that would wait for the log's tee too
for t in differential gpt bf16_training matrix_units tensor_copies simt_tiles; do
  echo "--- $t"; cat "/tmp/test-$t.log"
done > "$out/tests.log"
grep -h -E "test result|FAILED|panicked|exit [0-9]+$" "$out/tests.log"
fi

if want large; then
  phase "issue 40 on cuda: a 4 TiB link refused within a second; u8 past 2^31, 4 GiB f32, a 4 GiB parameter trained, the 5e10-step sum"
  export ARRAYJIT_REQUIRE_BACKENDS=cuda
  exe=$(ls "$bin"/memory_limits-* 2>/dev/null | head -1)
  [ -n "$exe" ] && timeout 60 "$exe" --test-threads 1 2>&1 | grep -E "test |result|panicked|cuda"
  exe=$(ls "$bin"/large_arrays-* 2>/dev/null | head -1)
  [ -n "$exe" ] && /usr/bin/time -f "large_arrays_on_the_gpu: %e s, host peak RSS %M KB" \
    timeout 150 "$exe" --ignored --exact large_arrays_on_the_gpu --nocapture 2>&1 \
    | grep -E "test |result|panicked|cuda|RSS"
fi

if command -v ncu >/dev/null 2>&1 && want ncu-gpt; then
  for batch in 16 128; do
    phase "every kernel's time of one GPT step at batch $batch (Nsight Compute)"
    timeout 60 ncu --clock-control none --metrics gpu__time_duration.sum --csv \
      "$bin/arrayjit" --backend cuda gpt --batch $batch --steps 1 --eval-every 1000 --sample 0 \
      --checkpoint /tmp/ncu.safetensors > "$out/ncu-gpt-b$batch.csv" 2>/dev/null
    echo "ncu gpt b$batch exit $? ($(grep -c gpu__time_duration "$out/ncu-gpt-b$batch.csv") kernels)"
  done
fi
if command -v ncu >/dev/null 2>&1 && want ncu-matmul; then
  phase "the 4096 products' kernels (Nsight Compute)"
  for kind in "" "tf32 " "bf16 " "bf16 tma "; do
    timeout 40 ncu --clock-control none --launch-count 6 \
      --metrics gpu__time_duration.sum,sm__warps_active.avg.pct_of_peak_sustained_active,launch__registers_per_thread,launch__occupancy_limit_registers \
      --csv "$bin/arrayjit" bench --backend cuda --no-peers --only "matmul ${kind}4096" 2>/dev/null
  done > "$out/ncu-matmul.csv"
  grep -E "gpu__time|warps_active" "$out/ncu-matmul.csv" | cut -c1-300 | head -40
fi
if command -v ncu >/dev/null 2>&1 && want ncu-detail; then
  phase "the 4096 products in detail: launch, occupancy, warp states, memory (Nsight Compute)"
  for kind in "" "tf32 " "bf16 " "bf16 tma "; do
    echo "### matmul ${kind}4096"
    timeout 60 ncu --clock-control none --launch-skip 2 --launch-count 1 \
      --section LaunchStats --section Occupancy --section WarpStateStats \
      --section SpeedOfLight --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis \
      --csv --page details "$bin/arrayjit" bench --backend cuda --no-peers --only "matmul ${kind}4096" 2>/dev/null
  done > "$out/ncu-detail.csv"
  grep -E "Registers Per|Shared Memory Config|Dynamic Shared|Static Shared|Achieved Occupancy|Theoretical Occupancy|Block Limit|Stall|Compute \(SM\) Throughput|Memory Throughput|Duration|###" \
    "$out/ncu-detail.csv" | cut -c1-220 | head -80
fi
if want search; then
  phase "the schedule search of the 4096 products on the device (tiles, buffers and their depth, group sizes)"
  for kind in "" "tf32 " "bf16 "; do
    timeout 120 "$bin/arrayjit" bench --backend cuda --no-peers --search --only "matmul ${kind}4096"
  done > "$out/search.log" 2>&1
  grep -E "winner|ms  register|\| matmul" "$out/search.log" | sed 's/register_rows=auto mc_log2=0 kc_log2=0 nc_log2=0 reduction_vectors=4 //' | cut -c1-200
fi
phase done
