"""The policy registry: one name per built-in policy, and `package.module:Class` for users'.

The classes listed here are the definitions, one module each. A built-in class that runs
compiled declares its twin in its own module (`twin = Twin(...)`; see
`casmoe.cache`), and tests/policies/test_compiled_replay.py holds the two to identical decisions; users'
classes, and subclasses of the built-in ones, always run their Python hooks.

Adding a built-in policy: write `casmoe/policies/NAME.py` (an `ExpertCache` subclass with a
unique `name`, and its twin's declaration if it is to run compiled) and add the class to
`POLICIES` below; nothing else names it.
"""

from __future__ import annotations

import importlib
import os
import sys

from casmoe.cache import ExpertCache
from casmoe.errors import CasmoeError
from casmoe.policies.belady import Belady
from casmoe.policies.casmoe import CasMoE
from casmoe.policies.fiddler import Fiddler
from casmoe.policies.hybrimoe import HybriMoE
from casmoe.policies.ktransformers import KTransformers
from casmoe.policies.layer_offload import LayerOffload
from casmoe.policies.least_stale import LeastStale
from casmoe.policies.lfu import LFU
from casmoe.policies.lru import LRU
from casmoe.policies.moe_infinity import MoEInfinity
from casmoe.policies.n_cpu_moe import NCpuMoE
from casmoe.policies.ondemand import OnDemand
from casmoe.policies.routed_placement import RoutedPlacement
from casmoe.policies.sch import SCH
from casmoe.policies.semoe import SEMoE
from casmoe.policies.speculative import Speculative
from casmoe.policies.static import Static

POLICIES: dict[str, type[ExpertCache]] = {
    cls.name: cls
    for cls in (OnDemand, LayerOffload, LRU, LFU, SEMoE, Speculative, MoEInfinity, LeastStale, Static, NCpuMoE,
                KTransformers, Fiddler, HybriMoE, RoutedPlacement, Belady, SCH, CasMoE)
}


class PolicyNotFound(CasmoeError, LookupError):
    pass


def get_policy(spec: str) -> type[ExpertCache]:
    """A registered name (`lru`) or a user's class as `package.module:ClassName`."""
    if spec in POLICIES:
        return POLICIES[spec]
    if ":" not in spec:
        raise PolicyNotFound(
            f"unknown policy {spec!r}; built-in: {', '.join(POLICIES)}; or give your own as package.module:ClassName"
        )
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr.isidentifier():
        raise PolicyNotFound(f"bad policy {spec!r}; write package.module:ClassName")
    if os.getcwd() not in sys.path:  # like uvicorn's --app-dir: users' modules beside them import
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise PolicyNotFound(f"cannot import {module_name!r} for policy {spec!r}: {exc}") from exc
    except SyntaxError as exc:
        raise PolicyNotFound(f"policy module {module_name!r} has a syntax error: {exc}") from exc
    except Exception as exc:  # the module's own code failed while it was imported
        raise PolicyNotFound(f"importing {module_name!r} for policy {spec!r} raised {type(exc).__name__}: {exc}") from exc
    cls = getattr(module, attr, None)
    if not (isinstance(cls, type) and issubclass(cls, ExpertCache)):
        raise PolicyNotFound(f"{spec!r} is not an ExpertCache subclass")
    return cls

