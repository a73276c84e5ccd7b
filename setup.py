"""Which packages the distribution holds, and its data.

Every folder under `casmoe/` is its own import path (`casmoe.sim.box` is `casmoe/sim/box/`), so
setuptools finds the packages itself. `casmoe.data` is the shipped data (`traces/`), found from an
installed copy by `casmoe/shipped.py`; the largest traces stay in the source checkout
(traces/README.md).
"""

from setuptools import find_packages, setup

DATA = ["README.md", "tiny-mixtral.npz", "synthetic-mixtral.npz", "synthetic-gpt-oss-120b-top4.npz", "corpus/*", "models/*/*", "real/*"]
"""Files of traces/ in a wheel: the default trace, the synthetic one of the README's planner
tour, the corpus, the tiny models and the real route CSVs (38 MB; tiny-olmoe.npz and
synthetic-qwen3.npz, 24 MB, are reproducible and stay in the checkout)."""

setup(
    packages=[*find_packages(include=["casmoe", "casmoe.*"]), "casmoe.data"],
    package_dir={"casmoe.data": "traces"},
    package_data={
        "casmoe": ["precisions.toml", "engines/*.toml", "engines/*.md"],
        "casmoe.presets": ["*.toml"],
        "casmoe.sim.box": ["profiles/*.toml", "catalog/*.toml", "catalog/*.md", "links.toml", "prices.toml"],
        "casmoe.sim.cost": ["stacks/*.toml"],
        "casmoe.sim.trust": ["published/*.toml", "published/*.md", "published/profiles/*.toml"],
        "casmoe.sim.questions.deploy": ["*.toml"],
        "casmoe.data": DATA,
    },
)
