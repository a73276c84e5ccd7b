#!/usr/bin/env bash
# GPU checks of the torch backend, PASS/FAIL per check: at most 290 s of timeouts in all, about
# 3 minutes on one GPU. Needs a CUDA device; uses a second one when present.
# Usage: bench/gpu_check.sh      Writes bench/gpu_check/results.json and pytest's log.
#   1. the CUDA unit tests (tests/backends/test_backend_gpu.py: small experts, every code path)
#   2. bench/gpu_check.py: exactness with 96 MiB experts and multi-token prompts through the
#      streamed path, with and without the RAM tier, batched, on 1 and 2 GPUs; --verify; a
#      use-before-arrival race stress; loader copy rate vs the measured pinned H2D rate
# Dry run of step 2 on a CPU: python bench/gpu_check.py --device cpu --small
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=bench/gpu_check
mkdir -p "$OUT"
python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'no CUDA device visible to torch')" || exit 2
nvidia-smi --query-gpu=name,memory.total,pcie.link.gen.current,pcie.link.width.current --format=csv,noheader || true
status=0
echo "== CUDA unit tests"
if timeout 90 python -m pytest tests/backends/test_backend_gpu.py -m gpu -q -p no:cacheprovider > "$OUT/pytest.log" 2>&1; then
  echo "PASS  tests/backends/test_backend_gpu.py  $(tail -1 "$OUT/pytest.log")"
else
  echo "FAIL  tests/backends/test_backend_gpu.py  $(tail -1 "$OUT/pytest.log")"; status=1
fi
echo "== large-expert checks"
timeout 200 python bench/gpu_check.py --out "$OUT/results.json" || status=1
exit $status
