#!/usr/bin/env bash
# Times the CPU blocked product's C helper for several blockings against each other on the GPT
# step's product shapes and square matmuls (benches/gemm/shapes.c), interleaved round by round
# so that a noisy host moves them alike; prints each size's best and median time per blocking.
#   scripts/gemm-blocking.sh [-r ROUNDS] [-w WORKERS] "MR NR MC KC NC" ["MR NR MC KC NC" ...]
# e.g. scripts/gemm-blocking.sh -w 2 "12 32 768 256 512" "12 32 768 512 512"
# Compiled with the CPU backends' flags (cc -O2 -ftree-vectorize -fno-math-errno -ffp-contract=off
# -march=native).
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=6 workers=1
while getopts "r:w:" opt; do
  case $opt in
    r) rounds=$OPTARG ;;
    w) workers=$OPTARG ;;
    *) sed -n 2,7p "$0"; exit 1 ;;
  esac
done
shift $((OPTIND - 1))
[ $# -ge 1 ] || { sed -n 2,7p "$0"; exit 1; }
cc=${CC:-cc}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cargo build --release --quiet -p arrayjit-codegen --example gemm_helper
names=()
for blocking in "$@"; do
  # shellcheck disable=SC2086
  set -- $blocking
  if [ $# -ne 5 ]; then
    echo "a blocking is five sizes \"MR NR MC KC NC\" (f32), not \"$blocking\"" >&2
    exit 1
  fi
  name=$(echo "$blocking" | tr ' ' _)
  # shellcheck disable=SC2086
  target/release/examples/gemm_helper $blocking > "$work/$name.c"
  $cc -O2 -ftree-vectorize -fno-math-errno -ffp-contract=off -march=native -c "$work/$name.c" -o "$work/$name.o"
  $cc -O2 benches/gemm/shapes.c "$work/$name.o" -o "$work/$name" -lpthread
  names+=("$name")
done
for _ in $(seq "$rounds"); do
  for name in "${names[@]}"; do echo "$name $("$work/$name" "$workers")"; done
done > "$work/times"
python3 - "$work/times" "$workers" <<'PY'
import collections, re, statistics, sys
times = collections.defaultdict(lambda: collections.defaultdict(list))
for line in open(sys.argv[1]):
    name = line.split()[0]
    for size, ms in re.findall(r"(\w+)\s+([\d.]+) ms", line):
        times[name][size].append(float(ms))
print(f"{sys.argv[2]} worker(s), ms (best / median of {len(next(iter(times.values()))['d128'])} rounds)")
for name, sizes in times.items():
    print(f"{name:22}", "  ".join(f"{s} {min(v):.1f}/{statistics.median(v):.1f}" for s, v in sizes.items()))
PY
