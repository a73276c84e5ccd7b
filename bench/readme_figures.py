"""Draw the pictures of the README and docs/ (docs/img/*.png) from the result files committed beside this script.

One picture of each kind that the main job and the plan draw, from bench/readme-figures/:

- `simulate/results.json`: `casmoe simulate --out bench/readme-figures/simulate --plots none` (the
  README's main job: the shipped trace on rtx4090x4, every policy, the cache sizes that fit);
- `plan/plan.json`: `casmoe plan --model qwen3-30b-a3b --hardware rtx4090x4@gpus=1,host_ram_gib=64
  --out PLAN`, its plan.json copied here (the plan's other files are not needed).

Run `python bench/readme_figures.py` after either is made again: the PNGs are drawn by the
commands' own functions, at a lower resolution (a README shows them at its column's width), and
stored with a palette of 256 colours chosen to cover the image, undithered (a quarter of the
bytes; a median-cut palette of fewer colours merged orange into yellow, which the plots tell
policies apart by).
tests/cli/test_plots.py checks that these inputs exist and that the README or a docs page shows every picture.
The figures the pages quote from the same files are filled by `python bench/docs_figures.py --write`.
"""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
INPUTS = ROOT / "bench" / "readme-figures"
SIMULATE = INPUTS / "simulate" / "results.json"
PLAN = INPUTS / "plan" / "plan.json"
OUT = ROOT / "docs" / "img"
PICTURES = ("decode_vs_capacity.png", "stall_by_layer.png", "timeliness.png", "plan_memory.png", "plan_speed.png")
DPI = 80


def main() -> list[Path]:
    from PIL import Image

    from casmoe.cli.figures import draw_plan, draw_report

    OUT.mkdir(parents=True, exist_ok=True)
    written = [*draw_report(OUT, json.loads(SIMULATE.read_text()), DPI), *draw_plan(PLAN.parent, OUT, DPI)]
    assert sorted(p.name for p in written) == sorted(PICTURES), written
    for path in written:
        with Image.open(path) as image:
            small = image.convert("RGB").quantize(256, Image.Quantize.MAXCOVERAGE, dither=Image.Dither.NONE)
        small.save(path, optimize=True)
    return written


if __name__ == "__main__":
    for path in main():
        print(path)
