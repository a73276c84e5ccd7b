"""Cache policies: one module per policy, the registry (`registry.py`) that names them, and
`PolicySpec` (`spec.py`), a policy named with its options on a command line or in a sweep."""

from casmoe.policies.registry import POLICIES, PolicyNotFound, get_policy
from casmoe.policies.spec import PolicySpec, PolicySpecError, default_policies, parse_policies, variants

__all__ = ["POLICIES", "PolicyNotFound", "PolicySpec", "PolicySpecError", "default_policies", "get_policy", "parse_policies", "variants"]
