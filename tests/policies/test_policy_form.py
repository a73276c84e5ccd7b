"""A policy is one file: each built-in policy's module is its whole definition, its compiled
twin, its fitting and its variants included (`casmoe.cache`'s docstring), and nothing else
names it or reads its fields.

The runtimes (replay, the compiled driver, the simulator, the backend, the CLI) reach policies
through the registry and the declaration, so a new built-in policy is its own module plus its
line in `casmoe/policies/registry.py` (tests/policies/test_compiled_replay.py holds the twins equal).
"""

from __future__ import annotations

import ast
import importlib

import pytest

from casmoe.cache import ExpertCache
from casmoe.geometry import Geometry
from casmoe.policies import POLICIES
from casmoe.twin import Twin, TwinState, twin_of
from support.import_graph import PACKAGES, graph, modules
from support.paths import REPO

ROOT = REPO
POLICY_HOME = ROOT / "casmoe" / "policies"
OWNERS = {ROOT / "casmoe" / "cache.py", ROOT / "casmoe" / "testing.py", *POLICY_HOME.glob("*.py")}
"""Where a cache's private fields may be read: the base, the policies (subclasses), and the
contract's checking subclass."""


@pytest.mark.parametrize("name", list(POLICIES))
def test_a_built_in_policy_is_its_own_module(name):
    cls = POLICIES[name]
    assert cls.__module__ == f"casmoe.policies.{name.replace('-', '_')}"  # moe-infinity lives in moe_infinity.py
    module = importlib.import_module(cls.__module__)
    defined = [v for v in vars(module).values() if isinstance(v, type) and issubclass(v, ExpertCache) and v.__module__ == module.__name__]
    assert defined == [cls], f"{module.__name__} defines {defined}"


PYTHON_ONLY = ("moe-infinity", "n-cpu-moe", "ktransformers", "layer-offload", "fiddler", "hybrimoe", "routed-placement")
"""Built-in policies without a compiled twin: they run their Python hooks everywhere
(a placement has no victim to choose; layer-offload's streaming, fiddler's and hybrimoe's per-step
CPU-or-copy choice are in no kernel)."""


def test_options_a_twin_cannot_mirror_run_in_python():
    """speculative's deeper guesses learn as the request runs: that form has no twin."""
    from casmoe.compiled import has_twin

    g = Geometry(3, 4, 2, hidden=8, intermediate=4)
    assert has_twin(POLICIES["speculative"](g, 2)) and not has_twin(POLICIES["speculative"](g, 2, ahead=2))


@pytest.mark.parametrize("name", PYTHON_ONLY)
def test_a_policy_without_a_twin_runs_in_python(name):
    from casmoe.compiled import has_twin

    cls = POLICIES[name]
    assert twin_of(cls) is None
    g = Geometry(2, 4, 2, hidden=8, intermediate=4)
    needs = {"ktransformers": {"popularity": [1.0] * g.total_experts}, "fiddler": {"popularity": [1.0] * g.total_experts},
             "routed-placement": {"shares": [[1.0] * g.experts] * g.layers}}
    assert not has_twin(cls(g, 2, **needs.get(name, {})))


@pytest.mark.parametrize("name", [n for n in POLICIES if n not in PYTHON_ONLY])
def test_the_twin_is_declared_by_the_class_itself(name):
    cls = POLICIES[name]
    twin = twin_of(cls)
    assert isinstance(twin, Twin) and callable(twin.order), f"{name} declares no compiled twin"
    # the victim order lives in a policy's own file (its own, or one whose order it shares), not the kernel
    assert twin.order.__module__.startswith("casmoe.policies."), twin.order.__module__
    g = Geometry(2, 4, 2, hidden=8, intermediate=4)
    needs = {"static": {"popularity": [1.0] * g.total_experts}, "casmoe": {"predictor": lambda request: None}}
    cache = cls(g, 2, **needs.get(name, {}))
    assert isinstance(twin.state(cache), TwinState)

    class Mine(cls):  # a user's subclass: its hooks are not in the kernel
        pass

    assert twin_of(Mine) is None


def test_a_policy_declares_its_fitting_and_its_variants():
    """What the leaderboard, the selection and the default policy list know of a policy comes from
    the policy's own declarations: which are fitted (and on what), and what a bare name runs."""
    from casmoe.policies import default_policies, variants

    fitted = {name for name, cls in POLICIES.items() if cls.fit is not None}
    assert fitted == {"static", "ktransformers", "fiddler", "routed-placement", "moe-infinity", "casmoe"}
    assert [s.label for s in variants("casmoe")] == ["casmoe[planner=auto]", "casmoe[predictor=exact]",
                                                     "casmoe[predictor=noisy]"]
    assert [s.label for s in variants("casmoe", "my/planner")][0] == "casmoe[planner=my/planner]"
    assert len(default_policies(POLICIES)) == sum(len(cls.variants) for cls in POLICIES.values())


def test_no_runtime_names_a_policy():
    """Outside casmoe/policies, no module imports a policy's own module (only the registry
    and the spec), and none asks `isinstance` of a policy class."""
    policy_modules = {f"casmoe.policies.{p.stem}" for p in POLICY_HOME.glob("*.py")} - {
        "casmoe.policies.__init__", "casmoe.policies.registry", "casmoe.policies.spec", "casmoe.policies.fitting",
        "casmoe.policies.family"}
    classes = {cls.__name__ for cls in POLICIES.values()}
    bad = []
    for name, targets in graph(PACKAGES).items():
        if not name.startswith("casmoe.policies"):
            bad += [f"{name} imports {t}" for t in targets if t in policy_modules]
    for name, path in modules(PACKAGES).items():
        if path.parent == POLICY_HOME:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and ast.unparse(node.func) in ("isinstance", "issubclass"):
                if any(n.id in classes for n in ast.walk(node.args[1]) if isinstance(n, ast.Name)):
                    bad.append(f"{name}:{node.lineno} {ast.unparse(node)}")
    assert not bad, "\n".join(bad)


def _private_fields(paths) -> set[str]:
    """`self._x` attributes the classes in `paths` set."""
    names = set()
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and ast.unparse(node.value) == "self":
                if node.attr.startswith("_") and not node.attr.startswith("__"):
                    names.add(node.attr)
    return names


def test_nothing_outside_a_policy_reads_its_fields():
    """No `x._field` of the cache base's or a policy's private fields outside them. A name
    that other classes also use for their own fields (`_step`, `_scores`) cannot be told apart
    by reading the source, so only the caches' own names are checked."""
    files = modules(PACKAGES)
    others = _private_fields(p for p in files.values() if p not in OWNERS)
    fields = _private_fields([ROOT / "casmoe" / "cache.py", *POLICY_HOME.glob("*.py")]) - others
    assert {"_n", "_served", "_budget", "_pool_members", "_layer_bytes"} <= fields  # what compiled.py used to read
    bad = []
    for name, path in files.items():
        if path in OWNERS:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in fields and ast.unparse(node.value) not in ("self", "cls"):
                bad.append(f"{name}:{node.lineno} {ast.unparse(node)}")
    assert not bad, "private cache fields read from outside the policy:\n" + "\n".join(bad)


def test_every_built_in_policy_says_what_it_is_and_its_family_follows_its_hooks():
    """The legend under simulate's table and the plots' panels read these declarations; the
    family comes from the hooks and flags, not from a list of names."""
    from casmoe.cache import MissMode
    from casmoe.policies.family import Family, describe, family_of, plain_cache

    for name, cls in POLICIES.items():
        assert cls.summary and len(cls.summary) <= 100 and "\n" not in cls.summary, name
        assert cls.runtime is None or (ROOT / "casmoe" / "sim" / "cost" / "stacks" / f"{cls.runtime}.toml").exists()
    families = {name: family_of(cls) for name, cls in POLICIES.items()}
    assert {n for n, f in families.items() if f is Family.ORACLE} == {"belady", "sch"}
    assert {n for n, f in families.items() if f is Family.HOST} == {"n-cpu-moe", "ktransformers", "fiddler", "hybrimoe",
                                                                  "routed-placement"}
    assert {"semoe", "speculative", "moe-infinity", "layer-offload", "casmoe"} == {
        n for n, f in families.items() if f is Family.PREFETCH}
    assert family_of(POLICIES["lru"], miss_mode=MissMode.CPU) is Family.HOST  # the run's miss mode counts
    assert family_of(POLICIES["casmoe"], oracle=True) is Family.ORACLE  # an oracle predictor's record
    plain = {n for n in POLICIES if plain_cache({"policy": n, "oracle": False})}
    assert plain == {"lru", "lfu", "least-stale"}  # not on-demand (keeps nothing), not static (fitted)
    assert "oracle" not in describe("casmoe[planner=auto]") and "bound" in describe("casmoe[predictor=exact]*")
    assert describe("n-cpu-moe[n=4]") == POLICIES["n-cpu-moe"].summary and describe("my.module:Nope") == ""
