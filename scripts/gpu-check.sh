#!/usr/bin/env bash
# The GPU checks of issues 36 and 37 as one prepared run on a lent GPU machine (H100/H200), within
# its few minutes of device time. Prepare on the build machine (no GPU needed):
#
#   cargo build --release -p arrayjit-cli
#   cargo test --release -p arrayjit --no-run --test differential --test gpt --test bf16_training \
#     --test matrix_units --test simt_tiles 2>&1 | grep -o 'target/release/deps/[a-z0-9_]*-[0-9a-f]*' > /tmp/tests
#   mkdir -p .gpu && cp target/release/arrayjit $(cat /tmp/tests) .gpu/ && strip .gpu/* && xz -T0 -9 .gpu/*
#
# then run `bash scripts/gpu-check.sh` on the device machine with `.gpu` carried (it is ignored by
# git). Everything it prints goes to $OUT/gpu-check.log too (where $OUT is set).
set -uo pipefail
cd "$(dirname "$0")/.."
log="${OUT:-/tmp}/gpu-check.log"
exec > >(tee "$log") 2>&1

# cudarc opens libnvrtc.so: point it at the toolkit's.
mkdir -p /tmp/nvrtc
for lib in /usr/local/cuda/lib64/libnvrtc.so*; do ln -sf "$lib" /tmp/nvrtc/libnvrtc.so; break; done
export LD_LIBRARY_PATH="/tmp/nvrtc:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export ARRAYJIT_CACHE_DIR="${TMPDIR:-/tmp}/arrayjit-cache"

bin=.gpu
for f in "$bin"/*.xz; do [ -e "$f" ] && xz -d -f "$f"; done
chmod +x "$bin"/* 2>/dev/null
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader || true

echo "== correctness on cuda: the corpus (with the matrix-unit cases), the GPT trainer, bf16 training,"
echo "   every matrix-unit variant (warps and, on sm_90, warpgroups) and every f32 SIMT variant"
export ARRAYJIT_REQUIRE_BACKENDS=sync_cc,cuda
for t in differential gpt bf16_training matrix_units simt_tiles; do
  exe=$(ls "$bin"/${t}-* 2>/dev/null | head -1)
  [ -n "$exe" ] && timeout 240 "$exe" --test-threads 2 2>&1 | grep -E "test result|FAILED|panicked|cuda" | head -20
done

echo "== the device table: f32 / TF32 / bf16 products, the chain, the GPT step in f32 and bf16, beside PyTorch"
timeout 300 "$bin/arrayjit" bench --backend cuda --python python3

echo "== every kernel's time of the 4096 products (Nsight Compute)"
if command -v ncu >/dev/null 2>&1; then
  for kind in "" "tf32 " "bf16 "; do
    timeout 120 ncu --metrics gpu__time_duration.sum,sm__warps_active.avg.pct_of_peak_sustained_active \
      --csv "$bin/arrayjit" bench --backend cuda --no-peers --only "matmul ${kind}4096" 2>/dev/null \
      | grep -E "aj|Kernel Name" | head -8
  done
fi
