"""Replay and simulate speed of one source tree, for before/after comparisons of a refactor.

`--tree DIR` imports casmoe from another checkout's folders (`DIR/casmoe`, `DIR/sim`,
`DIR/backends`, as pyproject.toml maps them; e.g. `git archive COMMIT | tar -x -C DIR`) instead
of the installed one, so two trees run the same script. Run the trees alternately, several
times each, and compare the minima: the machine is shared, and other load moves absolute
times by 2x within minutes.

Workload (pinned, generated): a Mixtral-shaped synthetic trace (32 layers x 8 experts, top-2,
`casmoe.synthetic` seed 0) of `--tokens` tokens in requests of 1 prompt token + 199 decoded,
4 slots per layer; `lru` and `belady` replayed compiled and in Python, `lru` and `semoe`
simulated on rtx4090x4 / mixtral-8x7b with the compiled and the Python decision pass. With
`--backend`, also the torch backend: a seeded random-init tiny Mixtral (4 layers, 8 experts,
top-2, hidden 64) generating 24 tokens for each of 4 prompts, un-offloaded (`reference`) and
offloaded with `lru` at 3 slots per layer (`run`, load mode). Prints one JSON line: CPU seconds
(minimum of `--repeat` interleaved rounds) and the hit counts (backend: hits and the generated
tokens), which must be equal across trees.

Run:  python bench/bench_tree_speed.py [--tree DIR] [--tokens 20000] [--repeat 3] [--backend]
"""

from __future__ import annotations

import argparse
import importlib.abc
import importlib.util
import json
import sys
from pathlib import Path


def use_tree(tree: Path) -> None:
    """Import casmoe from `tree`: its casmoe/ folder, and for a tree of the older layout the
    simulator, backend and command line from sim/, backends/ and cli/."""
    folders = {"casmoe": tree / "casmoe"}
    if (tree / "sim").is_dir():  # before the folders were import paths
        folders.update({"casmoe.sim": tree / "sim", "casmoe.backends": tree / "backends"})
        if (tree / "cli").is_dir():
            folders["casmoe.cli"] = tree / "cli"

    class Finder(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name not in folders:
                return None
            return importlib.util.spec_from_file_location(
                name, folders[name] / "__init__.py", submodule_search_locations=[str(folders[name])]
            )

    sys.meta_path.insert(0, Finder())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tree", type=Path, default=None, help="a checkout to import casmoe from")
    ap.add_argument("--tokens", type=int, default=20_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--backend", action="store_true", help="also time the torch backend on a tiny model")
    args = ap.parse_args()
    if args.tree is not None:
        use_tree(args.tree.resolve())
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from side_by_side import interleaved, load_average

    import casmoe
    from casmoe.cache import Capacity
    from casmoe.geometry import Geometry
    from casmoe.policies import get_policy
    from casmoe.presets import get_preset
    from casmoe.replay import replay
    from casmoe.sim.box.hardware import load_profile
    from casmoe.synthetic import SynthConfig, generate

    g = Geometry(32, 8, 2, hidden=4096, intermediate=14336)
    trace = generate(g, SynthConfig(requests=args.tokens // 200, prefill=(1, 1), decode=(199, 199)))
    cap = Capacity(4)
    hw, preset = load_profile("rtx4090x4"), get_preset("mixtral-8x7b")

    def rep(name: str, compiled: bool):
        return lambda: replay(trace, get_policy(name).create(g, cap, trace=trace), compiled=compiled).stats.hits

    try:  # since the run description (after 402a7ed): a run is priced on a Machine (model x box x stack)
        from casmoe.sim.passes.driver import run_trace
        from casmoe.sim.passes.assembly import Run
        from casmoe.sim.cost.machine import Machine

        def sim(name: str, compiled: bool):
            return lambda: run_trace(Run(trace, get_policy(name), cap, Machine(preset, hw)), compiled=compiled).stats.hits
    except ImportError:  # a tree from before it (`--tree`): the same run through its engine
        from casmoe.sim.passes.driver import simulate as old_simulate

        def sim(name: str, compiled: bool):
            return lambda: old_simulate(trace, get_policy(name), cap, hw, preset, compiled=compiled).stats.hits

    runs = {
        "replay lru compiled": rep("lru", True),
        "replay lru python": rep("lru", False),
        "replay belady compiled": rep("belady", True),
        "replay belady python": rep("belady", False),
        "simulate lru compiled": sim("lru", True),
        "simulate lru python": sim("lru", False),
        "simulate semoe compiled": sim("semoe", True),
    }
    if args.backend:
        runs.update(backend_runs())
    for fn in runs.values():  # numba: compile or load from its cache, untimed
        fn()
    res = interleaved(runs, args.repeat)
    print(json.dumps({"tree": str(Path(casmoe.__file__).parents[1]), "load": load_average(),
                      "cpu_s": {k: round(t, 4) for k, (t, _) in res.items()}, "hits": {k: h for k, (_, h) in res.items()}}))


def backend_runs() -> dict:
    """The backend's two paths on a tiny model built here (the same weights for every tree)."""
    import torch
    import transformers as tf

    from casmoe.backends.runtime import OffloadedModel, Prompt
    from casmoe.policies import get_policy

    torch.set_num_threads(1)
    torch.manual_seed(0)
    cfg = tf.MixtralConfig(vocab_size=96, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                           max_position_embeddings=128, intermediate_size=96, num_hidden_layers=4,
                           num_local_experts=8, num_experts_per_tok=2)
    om = OffloadedModel(tf.MixtralForCausalLM(cfg).eval())
    prompts = [Prompt([(7 * i + j) % 96 for j in range(12)]) for i in range(4)]

    def reference():
        r = om.reference(prompts, 24)
        return r.generated

    def offloaded():
        r = om.run(prompts, get_policy("lru"), 3, max_new_tokens=24)
        return [r.stats.hits, r.generated]

    return {"backend reference": reference, "backend lru run": offloaded}


if __name__ == "__main__":
    main()
