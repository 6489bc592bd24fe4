#!/usr/bin/env bash
# The GPU check: one prepared run on a lent GPU machine (H100/H200), made to say everything in
# one try within the device time a session gets (15 minutes, the machine's start included).
#
# Prepare on the build machine (no GPU needed; about 16 MB carried):
#
#   bash scripts/gpu-check.sh --prepare
#
# builds the CLI and the test binaries in release, strips and compresses them into `.gpu/`
# (ignored by git), with NVRTC 12.9 from $NVRTC_LIB (default: CI's wheel in
# /tmp/arrayjit-nvrtc-12.9.86/nvidia/cuda_nvrtc/lib) and, compiled by it, the CUBIN of the GPT
# demo's routines planned for an H100 and an H200 (`arrayjit plan --compile --cache-dir`).
# Then, on the device machine, from the repository's root with `.gpu` carried:
# `bash scripts/gpu-check.sh`.
#
# Phases, in the order of what must be known first, each under its own timeout (seconds):
#   tests    150  the CUDA tests in parallel: differential corpus, gpt, bf16_training,
#                 tensor_copies, matrix_units, memory_limits (each with sync_cc and cuda required)
#   demo      90  20 GPT demo steps with CUDA graphs, then 20 without; losses and ms/step side
#                 by side (graphs must not change the losses)
#   bench    120  the device table beside PyTorch where it is installed (`bench --quick`)
#   profile   90  every kernel's time of one GPT step (Nsight Compute; skipped, saying so,
#                 where `ncu` is missing)
# The default run is those four: 450 s of timeouts at most, printed first; on an H100 it takes
# about half. More, by name in PHASES (space-separated; PHASES replaces the default):
#   attention 100 (fused vs unfused vs torch SDPA, b4 h12 T1024 d64), large 150 (issue 40's
#   large arrays), ncu-matmul 160, ncu-detail 240, search 360.
# The carried CUBIN is unpacked into the compile cache first; the rest (the tests' routines,
# and everything where the device's limits differ from the model's: `info.log` shows them)
# the device compiles itself, NVRTC on all its cores, in units split by the program alone. The
# last lines say how many units were compiled on the device.
#
# Evidence: everything goes to $OUT (else /tmp/gpu-check): gpu-check.log (this output),
# one log per phase, nvidia-smi at the start and the end, the CUDA error names any log holds
# (driver-errors.txt), and the full output of every test that failed (tests.log).
#
# GPU_CHECK_DRY=1 runs the script itself against `cuda_emu` (the CUDA kernels on the CPU) with
# tiny sizes and the debug binaries of target/ (or those of GPU_CHECK_BIN: GPU_CHECK_BIN=.gpu
# checks a prepared bundle before it is carried): CI runs it so the script cannot rot between
# GPU sessions.
set -uo pipefail
cd "$(dirname "$0")/.."

tests_list="differential gpt bf16_training tensor_copies matrix_units memory_limits"

if [ "${1:-}" = "--prepare" ]; then
  set -e
  cargo build --release -p arrayjit-cli
  # shellcheck disable=SC2046
  cargo test --release -p arrayjit --no-run $(printf -- '--test %s ' $tests_list large_arrays) \
    2>&1 | grep -o 'target/release/deps/[a-z0-9_]*-[0-9a-f]*' | sort -u > /tmp/gpu-tests
  cargo build --release -p arrayjit --example attention_bench
  rm -rf .gpu && mkdir -p .gpu
  cp target/release/arrayjit target/release/examples/attention_bench $(cat /tmp/gpu-tests) .gpu/
  strip .gpu/* 2>/dev/null || true
  NVRTC_LIB="${NVRTC_LIB:-${TMPDIR:-/tmp}/arrayjit-nvrtc-12.9.86/nvidia/cuda_nvrtc/lib}"
  if [ -e "$NVRTC_LIB/libnvrtc.so.12" ]; then
    mkdir -p .gpu/nvrtc12
    cp "$NVRTC_LIB"/libnvrtc.so.12 "$NVRTC_LIB"/libnvrtc-builtins.so.12.* .gpu/nvrtc12/
    # The CUBIN of the GPT demo's routines (batch 16, f32) planned for an H100 and an H200,
    # compiled by the NVRTC carried: on a device whose limits are the model's, the demo,
    # profile and bench steps compile nothing (the check says how many units it compiled).
    for model in h100 h200; do
      LD_LIBRARY_PATH="$NVRTC_LIB" ./target/release/arrayjit plan --device "$model" --summary \
        --compile --cache-dir .gpu/cache | tail -3
    done
    tar -C .gpu -cf .gpu/cache.tar cache && rm -rf .gpu/cache
  else
    echo "no NVRTC at $NVRTC_LIB: the device will use its own and compile every unit"
  fi
  xz -T0 -6 .gpu/* .gpu/nvrtc12/* 2>/dev/null || true
  du -sh .gpu
  exit 0
fi

out="${OUT:-/tmp/gpu-check}"
mkdir -p "$out"
exec > >(tee "$out/gpu-check.log") 2>&1
dry="${GPU_CHECK_DRY:-0}"
phases="${PHASES:-tests demo bench profile}"
want() { [[ " $phases " == *" $1 "* ]]; }
declare -A budget=([tests]=150 [demo]=90 [bench]=120 [profile]=90 [attention]=100 [large]=150
  [ncu-matmul]=160 [ncu-detail]=240 [search]=360)
total=0
for p in $phases; do
  [ -n "${budget[$p]:-}" ] || { echo "unknown phase $p (known: ${!budget[*]})"; exit 2; }
  total=$((total + budget[$p]))
done
echo "gpu-check: phases [$phases], $total s of timeouts in all$([ "$dry" = 1 ] && echo ', DRY RUN on cuda_emu')"
phase() { echo "== $(date +%T) $*"; }
failed=()
# Runs a phase's command under its timeout into its own log; the log's tail is shown.
run_logged() { # name timeout command...
  local name=$1 limit=$2; shift 2
  timeout "$limit" "$@" > "$out/$name.log" 2>&1
  local rc=$?
  [ $rc -eq 124 ] && echo "!! $name: timed out after $limit s" >> "$out/$name.log"
  [ $rc -ne 0 ] && failed+=("$name (exit $rc)")
  return $rc
}

if [ "$dry" = 1 ]; then
  backend=cuda_emu
  bin="${GPU_CHECK_BIN:-target/debug}"
  demo_args=(--batch 2 --steps 2 --eval-every 2)
  require=sync_cc,cuda_emu
else
  backend=cuda
  bin=.gpu
  demo_args=(--steps 20 --eval-every 20)
  require=sync_cc,cuda
fi
# A prepared bundle (`--prepare`) comes compressed; a build folder keeps its tests in deps/.
for f in "$bin"/*.xz "$bin"/nvrtc12/*.xz; do [ -e "$f" ] && xz -d -f "$f"; done
tests_dir="$bin"
[ -d "$bin/deps" ] && tests_dir="$bin/deps"
if [ "$dry" != 1 ]; then
  chmod +x "$bin"/* 2>/dev/null
  # cudarc opens libnvrtc.so: the NVRTC CI uses (carried), else the machine's toolkit's.
  mkdir -p /tmp/nvrtc
  nvrtc=
  for c in "$PWD/$bin"/nvrtc12/libnvrtc.so.* /usr/local/cuda/lib64/libnvrtc.so*; do
    case "$c" in *builtins*) ;; *) [ -e "$c" ] && { nvrtc=$c; break; } ;; esac
  done
  [ -z "$nvrtc" ] && nvrtc=$(find / -name 'libnvrtc.so*' -not -path '/proc/*' 2>/dev/null | grep -v builtins | head -1)
  echo "NVRTC: ${nvrtc:-none found}"
  [ -n "$nvrtc" ] && ln -sf "$nvrtc" /tmp/nvrtc/libnvrtc.so
  export LD_LIBRARY_PATH="/tmp/nvrtc:$(dirname "${nvrtc:-/tmp/nvrtc/x}")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
export ARRAYJIT_CACHE_DIR="${ARRAYJIT_CACHE_DIR:-${TMPDIR:-/tmp}/arrayjit-cache}"
mkdir -p "$ARRAYJIT_CACHE_DIR"
[ -e "$bin/cache.tar" ] && tar -C "$ARRAYJIT_CACHE_DIR" --strip-components=1 -xf "$bin/cache.tar"
units() { find "$ARRAYJIT_CACHE_DIR/ptx" -type f 2>/dev/null | wc -l; }
units_before=$(units)
echo "CUBIN units in the compile cache at the start: $units_before ($ARRAYJIT_CACHE_DIR)"
cli="$bin/arrayjit"
[ -x "$cli" ] || { echo "no $cli: prepare first (bash scripts/gpu-check.sh --prepare)"; exit 2; }
smi() {
  if command -v nvidia-smi >/dev/null 2>&1; then nvidia-smi -q > "$out/nvidia-smi-$1.txt" 2>&1
    nvidia-smi --query-gpu=name,memory.total,memory.used,clocks.max.sm,driver_version --format=csv,noheader
  else echo "nvidia-smi: not on this machine"; fi
}
smi start
# What the backend sees of the device (its limits decide the plans, so the CUBIN a cache holds).
"$cli" info > "$out/info.log" 2>&1
grep -A1 "^$backend:" "$out/info.log" | cut -c1-240
python3 -c 'import torch; print("torch", torch.__version__, torch.cuda.is_available())' 2>&1 | tail -1

if want tests; then
  phase "tests on $backend, in parallel (${budget[tests]} s)"
  pids=() names=()
  for t in $tests_list; do
    exe=$(ls -t "$tests_dir"/"$t"-* 2>/dev/null | grep -v '\.d$' | head -1)
    if [ -z "$exe" ]; then echo "-- $t: no binary in $tests_dir"; failed+=("$t (missing)"); continue; fi
    if [ "$dry" = 1 ]; then args=(--list); else args=(--test-threads 4); fi
    (ARRAYJIT_REQUIRE_BACKENDS=$require timeout "${budget[tests]}" "$exe" "${args[@]}" \
      > "$out/test-$t.log" 2>&1; echo "exit $?" >> "$out/test-$t.log") &
    pids+=($!) names+=("$t")
  done
  [ ${#pids[@]} -gt 0 ] && wait "${pids[@]}"
  for t in "${names[@]}"; do
    rc=$(tail -1 "$out/test-$t.log" | grep -o '[0-9]*$')
    printf '%-16s %s\n' "$t" "$(grep -h -E 'test result|tests?, [0-9]+ benchmarks' "$out/test-$t.log" | tail -1) (exit $rc)"
    if [ "$rc" != 0 ]; then
      failed+=("test $t (exit $rc)")
      { echo "### $t"; cat "$out/test-$t.log"; } >> "$out/tests.log"
      grep -E "^test .*FAILED|panicked" "$out/test-$t.log" | head -5
    fi
  done
fi

if want demo; then
  phase "demo: GPT steps on $backend with CUDA graphs, then without (${budget[demo]} s)"
  half=$((budget[demo] / 2))
  for graphs in 1 0; do
    ARRAYJIT_CUDA_GRAPHS=$graphs run_logged "demo-graphs$graphs" "$half" "$cli" --backend "$backend" \
      gpt "${demo_args[@]}" --sample 0 --checkpoint "$out/demo.safetensors"
    echo "graphs=$graphs: $(grep -E 'step|loss' "$out/demo-graphs$graphs.log" | tail -2 | tr '\n' ' ')"
  done
  a=$(grep -o 'held-out loss [0-9.]*' "$out/demo-graphs1.log" | tail -1)
  b=$(grep -o 'held-out loss [0-9.]*' "$out/demo-graphs0.log" | tail -1)
  [ "$a" = "$b" ] && echo "graphs on and off: the same held-out loss ($a)" \
    || { echo "!! graphs on and off differ: '$a' vs '$b'"; failed+=("demo losses differ"); }
fi

if want bench; then
  phase "the device table beside PyTorch (${budget[bench]} s)"
  if [ "$dry" = 1 ]; then only=(--only "matmul 512"); peers=(--no-peers); else only=(); peers=(--python python3); fi
  run_logged bench "${budget[bench]}" "$cli" bench --backend "$backend" --quick "${peers[@]}" "${only[@]}"
  grep '^[|]' "$out/bench.log" | head -30
  grep -q '^[|] [a-z]' "$out/bench.log" || failed+=("bench (no rows)")
fi

if want profile; then
  phase "every kernel's time of one GPT step (${budget[profile]} s)"
  if command -v ncu >/dev/null 2>&1 && [ "$dry" != 1 ]; then
    run_logged profile "${budget[profile]}" ncu --clock-control none --metrics gpu__time_duration.sum \
      --csv "$cli" --backend cuda gpt --steps 1 --eval-every 1000 --sample 0 --checkpoint /tmp/ncu.safetensors
    echo "$(grep -c gpu__time_duration "$out/profile.log") kernel launches profiled (profile.log)"
  else
    echo "ncu not available here$([ "$dry" = 1 ] && echo ' (dry run)'): one step without it instead"
    run_logged profile "${budget[profile]}" "$cli" --backend "$backend" gpt --steps 1 --eval-every 1000 \
      --batch 2 --sample 0 --checkpoint "$out/profile.safetensors"
    tail -2 "$out/profile.log"
  fi
fi

if want attention; then
  phase "attention: fused and unfused, forward + backward, b4 h12 T1024 d64 (${budget[attention]} s)"
  for kind in fused unfused; do
    ARRAYJIT_BACKEND=$backend run_logged "attention-$kind" 40 "$bin/attention_bench" 4 12 1024 64 "$kind" 10
    tail -2 "$out/attention-$kind.log"
  done
  timeout 20 python3 - <<'PY' 2>&1 | tail -2
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

if want large; then
  phase "issue 40 on $backend: large arrays (${budget[large]} s)"
  exe=$(ls -t "$tests_dir"/large_arrays-* 2>/dev/null | grep -v '\.d$' | head -1)
  [ -n "$exe" ] && ARRAYJIT_REQUIRE_BACKENDS=$backend run_logged large "${budget[large]}" \
    "$exe" --ignored --exact large_arrays_on_the_gpu --nocapture
  grep -E "test |result|panicked" "$out/large.log" 2>/dev/null
fi

if command -v ncu >/dev/null 2>&1 && want ncu-matmul; then
  phase "the 4096 products' kernels (Nsight Compute, ${budget[ncu-matmul]} s)"
  for kind in "" "tf32 " "bf16 " "bf16 tma "; do
    timeout 40 ncu --clock-control none --launch-count 6 \
      --metrics gpu__time_duration.sum,sm__warps_active.avg.pct_of_peak_sustained_active,launch__registers_per_thread \
      --csv "$cli" bench --backend cuda --no-peers --only "matmul ${kind}4096" 2>/dev/null
  done > "$out/ncu-matmul.csv"
  grep -E "gpu__time|warps_active" "$out/ncu-matmul.csv" | cut -c1-300 | head -40
fi
if command -v ncu >/dev/null 2>&1 && want ncu-detail; then
  phase "the 4096 products in detail (Nsight Compute, ${budget[ncu-detail]} s)"
  for kind in "" "tf32 " "bf16 " "bf16 tma "; do
    echo "### matmul ${kind}4096"
    timeout 60 ncu --clock-control none --launch-skip 2 --launch-count 1 \
      --section LaunchStats --section Occupancy --section WarpStateStats \
      --section SpeedOfLight --section MemoryWorkloadAnalysis \
      --csv --page details "$cli" bench --backend cuda --no-peers --only "matmul ${kind}4096" 2>/dev/null
  done > "$out/ncu-detail.csv"
  grep -E "Registers Per|Achieved Occupancy|Theoretical Occupancy|Stall|Throughput|Duration|###" \
    "$out/ncu-detail.csv" | cut -c1-220 | head -60
fi
if want search; then
  phase "the schedule search of the 4096 products on the device (${budget[search]} s)"
  for kind in "" "tf32 " "bf16 "; do
    timeout 120 "$cli" bench --backend "$backend" --no-peers --search --only "matmul ${kind}4096"
  done > "$out/search.log" 2>&1
  grep -E "winner|\| matmul" "$out/search.log" | cut -c1-200
fi

smi end
echo "CUBIN units compiled here: $(( $(units) - units_before )) (the rest came from the cache)"
grep -h -o -E "CUDA_ERROR_[A-Z_]+" "$out"/*.log 2>/dev/null | sort | uniq -c > "$out/driver-errors.txt"
[ -s "$out/driver-errors.txt" ] && { echo "driver errors seen:"; cat "$out/driver-errors.txt"; }
phase "done"
if [ ${#failed[@]} -gt 0 ]; then
  echo "FAILED: ${failed[*]} (logs in $out)"
  exit 1
fi
echo "all phases passed (logs in $out)"
