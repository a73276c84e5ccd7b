"""Which packages the distribution holds: everything under the four source folders, found.

pyproject.toml maps import names to folders (`casmoe.sim` is `sim/`, ...); setuptools' own
`packages.find` cannot follow such a mapping, so listing packages by hand left new ones out
(a wheel without `casmoe.kernels` failed in compiled replay). This finds every package below
each mapped folder. `casmoe.data` is the shipped data (`traces/`), found from an installed copy
by `casmoe/shipped.py`; the largest traces stay in the source checkout (traces/README.md).
"""

from setuptools import find_packages, setup

ROOTS = {"casmoe": "casmoe", "casmoe.sim": "sim", "casmoe.backends": "backends", "casmoe.cli": "cli"}
DATA = ["README.md", "tiny-mixtral.npz", "synthetic-mixtral.npz", "corpus/*", "models/*/*", "real/*"]
"""Files of traces/ in a wheel: the default trace, the synthetic one of the README's planner
tour, the corpus, the tiny models and the real route CSVs (38 MB; tiny-olmoe.npz and
synthetic-qwen3.npz, 24 MB, are reproducible and stay in the checkout)."""

packages = [sub for name, folder in ROOTS.items() for sub in [name, *(f"{name}.{p}" for p in find_packages(folder))]]
setup(
    packages=[*packages, "casmoe.data"],
    package_dir={**ROOTS, "casmoe.data": "traces"},
    package_data={
        "casmoe": ["precisions.toml", "engines/*.toml", "engines/*.md"],
        "casmoe.presets": ["*.toml"],
        "casmoe.sim": ["profiles/*.toml", "links.toml", "prices.toml", "published/*.toml", "stacks/*.toml"],
        "casmoe.sim.deploy": ["*.toml"],
        "casmoe.data": DATA,
    },
)
