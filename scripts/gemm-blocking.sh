#!/usr/bin/env bash
# Times the CPU blocked product's C helper for several blockings, or several versions of it,
# against each other, interleaved round by round so that a noisy host moves them alike; prints
# each measure's best and median time per helper.
#   scripts/gemm-blocking.sh [-a] [-r ROUNDS] [-w WORKERS] HELPER [HELPER ...]
# A HELPER is a blocking "MR NR MC KC NC" (f32; the helper this checkout generates for it) or a
# C file the `gemm_helper` example printed (e.g. from an older checkout, to compare versions).
# By default the harness is benches/gemm/shapes.c (the GPT step's product shapes per size, and
# square matmuls); with -a, benches/gemm/attention.c (the causal attention's guarded products,
# from a cold cache).
# e.g. scripts/gemm-blocking.sh -w 2 "12 32 768 256 512" "12 32 768 512 512"
#      target/release/examples/gemm_helper 12 32 768 512 1024 > /tmp/old.c   # (older checkout)
#      scripts/gemm-blocking.sh -a /tmp/old.c "12 32 768 512 1024"
# Compiled with the CPU backends' flags (cc -O1 -fexpensive-optimizations -fgcse -ftree-vectorize -fno-math-errno -ffp-contract=off
# -march=native).
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=6 workers=1 harness=shapes
while getopts "ar:w:" opt; do
  case $opt in
    a) harness=attention ;;
    r) rounds=$OPTARG ;;
    w) workers=$OPTARG ;;
    *) sed -n 2,16p "$0"; exit 1 ;;
  esac
done
shift $((OPTIND - 1))
[ $# -ge 1 ] || { sed -n 2,16p "$0"; exit 1; }
cc=${CC:-cc}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cargo build --release --quiet -p arrayjit-codegen --example gemm_helper
names=()
for helper in "$@"; do
  if [[ $helper == *.c ]]; then
    if [ ! -f "$helper" ]; then
      echo "no helper file $helper" >&2
      exit 1
    fi
    name=$(basename "$helper" .c)
    cp "$helper" "$work/$name.c"
  else
    # shellcheck disable=SC2086
    set -- $helper
    if [ $# -ne 5 ]; then
      echo "a helper is five sizes \"MR NR MC KC NC\" (f32) or a .c file, not \"$helper\"" >&2
      exit 1
    fi
    name=$(echo "$helper" | tr ' ' _)
    # shellcheck disable=SC2086
    target/release/examples/gemm_helper $helper > "$work/$name.c"
  fi
  $cc -O1 -fexpensive-optimizations -fgcse -ftree-vectorize -fno-math-errno -ffp-contract=off -march=native -c "$work/$name.c" -o "$work/$name.o"
  $cc -O2 "benches/gemm/$harness.c" "$work/$name.o" -o "$work/$name" -lpthread
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
rounds = len(next(iter(next(iter(times.values())).values())))
print(f"{sys.argv[2]} worker(s), ms (best / median of {rounds} rounds)")
for name, sizes in times.items():
    print(f"{name:22}", "  ".join(f"{s} {min(v):.2f}/{statistics.median(v):.2f}" for s, v in sizes.items()))
PY
