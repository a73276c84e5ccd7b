#!/usr/bin/env bash
# GPU checks of the torch backend and a short bench, on one GPU: at most 270 s of timeouts in all.
# Usage: bench/gpu_check.sh [MODEL]   (default: the shipped tiny-mixtral; any local model folder works)
# Writes bench/gpu_check/*.json and a calibrated profile; prints a summary.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${1:-tiny-mixtral}
OUT=bench/gpu_check
mkdir -p "$OUT"
python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'no CUDA device visible to torch')"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true

echo "== GPU tests"
timeout 90 python -m pytest tests/test_backend_gpu.py -m gpu -q -p no:cacheprovider

echo "== bench ($MODEL on cuda:0)"
for policy in ondemand lru semoe; do
  timeout 35 casmoe bench --model "$MODEL" --device cuda:0 --dtype bfloat16 --policy "$policy" --capacity 4 \
    --num-prompts 8 --max-new-tokens 32 --json > "$OUT/bench-$policy.json"
done
timeout 35 casmoe bench --model "$MODEL" --device cuda:0 --dtype bfloat16 --policy lru --capacity 2 --miss-mode substitute \
  --num-prompts 8 --max-new-tokens 32 --json > "$OUT/bench-lru-substitute.json"

echo "== calibrate"
timeout 40 casmoe calibrate --model "$MODEL" --device cuda:0 --dtype bfloat16 --out "$OUT/profile.toml" --json > "$OUT/calibrate.json"

python - "$OUT" <<'PY'
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
for f in sorted(out.glob("bench-*.json")):
    r = json.loads(f.read_text())
    extra = f", ppl {r['perplexity']:.2f} vs {r['reference_perplexity']:.2f}" if "perplexity" in r else ""
    print(f"{f.stem}: {r['tokens_per_s']:.1f} tok/s, TTFT {r['ttft_s']*1e3:.1f} ms, stall {r['stall_s']:.3f} s, "
          f"hit rate {r['cache_hit_rate']:.3f}{extra}")
c = json.loads((out / "calibrate.json").read_text())
print(f"calibrate: copies {c['copy_bw']/1e9:.2f} GB/s + {c['copy_latency']*1e6:.1f} us, step {c['step_s']*1e3:.2f} ms")
PY
