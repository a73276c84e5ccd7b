"""A simulated run's placement or cache as the engine that runs it is told: `--n-cpu-moe N`
(llama.cpp counts blocks, dense ones included), `-ot` layers, KTransformers' GPU-expert count or
ratio, all on the GPU, or a cache's slots per layer.

`search` and `leaderboard` answer in slots per layer or experts in a pool; a user needs the flag.
The placement is the policy's own choice on the run's trace (`runner.resolve`, then the policy
built as the simulator builds it), so the words name exactly the experts that were priced.
"""

from __future__ import annotations

from typing import Any

from casmoe.sim.questions.deploy import engines as eng
from casmoe.sim.run.runner import resolve


def engine_terms(spec: Any) -> str:
    """How the engine running `spec`'s policy is told its placement (see the module docstring)."""
    run, _ = resolve(spec)
    g = run.trace.geometry
    L, E = g.layers, g.experts
    cap = run.capacity
    if not run.policy.fills_at_start:  # a cache, not a placement (its GPU set is chosen as it runs)
        pool = cap.clamped(g).total(g)
        if cap.per_layer and cap.slots >= E or not cap.per_layer and pool >= g.total_experts:
            return "all on the GPU (every expert cached)"
        return f"{cap.slots} slots per layer" if cap.per_layer else f"a pool of {pool} experts (~{pool // max(1, L)} a layer)"
    expert_bytes = spec.machine.expert_bytes(run.trace)
    cache = run.policy.create(g, cap, miss_mode=run.miss_mode, expert_bytes=expert_bytes, trace=run.trace,
                              **dict(run.options))
    gpu = set(cache.gpu)
    if len(gpu) >= g.total_experts:
        return "all on the GPU (llama.cpp -ngl all; KTransformers --kt-num-gpu-experts " f"{E})"
    per = [0] * L
    for e in gpu:
        per[e // E] += 1
    dense = spec.machine.preset.dense_layers
    host = [layer for layer in range(L) if per[layer] == 0]
    if all(n in (0, E) for n in per):
        if host == list(range(len(host))):
            return f"llama.cpp --n-cpu-moe {dense + len(host)}"
        return f"llama.cpp -ot '{eng.overrides_text([([dense + layer for layer in host], 'CPU')])}'"
    # SGLang places uniformly unless told the frequency strategy (and given the routing profile)
    strategy = "" if dict(run.options).get("strategy") == "uniform" else " --kt-expert-placement-strategy frequency"
    if len(set(per)) == 1:
        return f"KTransformers --kt-num-gpu-experts {per[0]}{strategy}"
    ratio = (len(gpu) + 0.5) / g.total_experts
    return (f"KTransformers --kt-gpu-experts-ratio {ratio!r}{strategy} ({len(gpu)} of {g.total_experts} experts)")
