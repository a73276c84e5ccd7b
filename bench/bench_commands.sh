#!/bin/bash
# Alternated before/after wall and CPU times of whole commands, each a fresh process.
#
#   git worktree add /tmp/old <before-commit>
#   bash bench/bench_commands.sh /tmp/old [rounds]
#
# The "before" tree runs through PYTHONPATH (the same venv and numba, its own sources); a
# first run of a tree compiles its numba kernels into that tree, so run once untimed, or
# read past the first round. Writes nothing under the repository; works in a temp folder.
set -euo pipefail
OLD=$(cd "$1" && pwd)
ROUNDS=${2:-3}
NEW=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-python}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
cd "$WORK"
sed 's/name = "rtx4090x4"/name = "box"/' "$NEW/casmoe/sim/box/profiles/rtx4090x4.toml" > box.toml
sed 's/name = "rtx4090x4"/name = "my4090"/; s/^gpus = 4$/gpus = 1/; s/host_ram_gib = 256.0/host_ram_gib = 64.0/' \
  "$NEW/casmoe/sim/box/profiles/rtx4090x4.toml" > my4090.toml
TRACE="$NEW/traces/tiny-mixtral.npz"
t() {
  local tag=$1; shift
  local s e; s=$(date +%s.%N)
  /usr/bin/time -f "%U %S" -o cpu.txt "$@" > /dev/null 2>&1
  e=$(date +%s.%N)
  echo "$tag wall $(echo "$e - $s" | bc) s, cpu $(awk '{print $1 + $2}' cpu.txt) s"
}
echo "load: $(cut -d' ' -f1-3 /proc/loadavg)"
for _ in $(seq "$ROUNDS"); do
  for v in before after; do
    if [ $v = before ]; then P=$OLD; else P=$NEW; fi
    rm -rf lb s pl
    t "$v leaderboard (pictures drawn)" env PYTHONPATH="$P" CASMOE_PLOTS=wait $PY -m casmoe leaderboard \
      --trace "$TRACE" --hardware box.toml --requests 2 --jobs 1 --no-fit-planner --out lb
    t "$v search" env PYTHONPATH="$P" $PY -m casmoe search --trace "$TRACE" --requests 2 --policy lru \
      --policy n-cpu-moe --out s --model mixtral-8x7b --hardware my4090.toml --target "tok/s>=0.1"
    t "$v plan (pictures drawn)" env PYTHONPATH="$P" CASMOE_PLOTS=wait $PY -m casmoe plan --model qwen3-30b-a3b \
      --hardware "$NEW/examples/rtx4090-64g.toml" --engine llama.cpp --precision q6_k --requests 2 --no-compare --out pl
    rm -rf pl
    t "$v plan (default)" env PYTHONPATH="$P" $PY -m casmoe plan --model qwen3-30b-a3b \
      --hardware "$NEW/examples/rtx4090-64g.toml" --engine llama.cpp --precision q6_k --requests 2 --no-compare --out pl
    t "$v simulate (main job)" env PYTHONPATH="$P" CASMOE_PLOTS=none $PY -m casmoe simulate --out sim
  done
done
echo "load: $(cut -d' ' -f1-3 /proc/loadavg)"
