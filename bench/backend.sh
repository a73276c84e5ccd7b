#!/usr/bin/env bash
# The torch backend on this CPU: bench figures and the simulator's fidelity, as in bench/RESULTS.md.
# Usage: bench/backend.sh [MODEL] [OUT]   (default: the shipped tiny-mixtral, bench/backend-out)
# Takes about 15-25 minutes on the project's 2-core machine.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${1:-tiny-mixtral}
OUT=${2:-bench/backend-out}
mkdir -p "$OUT"
nice -n 10 casmoe validate backend --model "$MODEL" --num-prompts 8 --max-new-tokens 32 --json > "$OUT/validate.json"
LINK=0.05  # GB/s: an emulated link on which an expert copy costs about one layer's decode compute

for policy in ondemand lru semoe; do
  nice -n 10 casmoe bench --model "$MODEL" --policy "$policy" --capacity 4 --link-gbps "$LINK" --threads 1 \
    --num-prompts 8 --max-new-tokens 32 --json > "$OUT/bench-$policy.json"
done
for cap in 2 4 6; do
  nice -n 10 casmoe bench --model "$MODEL" --policy lru --capacity "$cap" --miss-mode substitute --threads 1 \
    --num-prompts 4 --max-new-tokens 8 --ppl-texts 32 --json > "$OUT/bench-substitute-$cap.json"
done

python - "$OUT" <<'PY'
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
for f in sorted(out.glob("bench-*.json")):
    r = json.loads(f.read_text())
    ppl = f" | ppl {r['perplexity']:.2f} (un-offloaded {r['reference_perplexity']:.2f})" if "perplexity" in r else ""
    print(f"{f.stem:24s} {r['tokens_per_s']:7.2f} tok/s  TTFT {r['ttft_s']:.3f} s  p50 {r['median_token_latency_s']*1e3:7.1f} ms"
          f"  stall {r['stall_s']:7.2f} s  hit {r['cache_hit_rate']:.3f}{ppl}")
for r in json.loads((out / "validate.json").read_text()):
    print(f"validate {r['policy']:9s} backend p50 {r['backend_median']*1e3:7.1f} ms  sim p50 {r['sim_median']*1e3:7.1f} ms"
          f"  error {r['median_error']:.3f}  (one calibration {r['median_error_upfront']:.3f}, in-run {r['median_error_inrun']:.3f})")
PY
