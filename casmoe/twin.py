"""A built-in policy's compiled twin, as the policy declares it.

The built-in policies also run in one numba kernel (`casmoe/kernels/cache_machine.py`), 25-40x
faster with identical decisions. A policy that has such a twin says so in its own module, which
is all it takes: a small function, its victim order, and one class attribute,
`twin = Twin(order, ...)`. The order `(machine, expert) -> (primary, secondary)` is written in
the subset of Python numba compiles and reads the kernel's arrays (`cache_machine.Machine`, its
scalar slots named in `casmoe.kernels.layout`); the kernel evicts the candidate with the
smallest pair, so the pair must order candidates as the class's `victim` does. The rest of the
declaration says what else the kernel reads: a hook run after each access or insert (`touched`,
belady's refresh of its key), every expert's future visits (`reads_future`), and the functions of
a cache that hand the kernel its state. A policy whose order another one already has imports it
(ondemand, semoe and speculative use lru's). Nothing outside the policy reads the policy's
fields; `casmoe/compiled.py` reads the declaration. Only the class that declares the twin runs
compiled: a subclass (a user's `HotNextLayer(LRU)`) inherits the hooks, not the twin, and runs
in Python unless it declares its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, NamedTuple

from casmoe.cache import PolicyError

if TYPE_CHECKING:
    import numpy as np

    from casmoe.cache import ExpertCache, PolicyError


class TwinState(NamedTuple):
    """What a built-in policy hands its compiled twin (`Twin.state`): the kernel's settings and
    arrays that its order and its prefetches read."""

    next_layer_budget: int = 0  # experts of the next layer prefetched before each layer (semoe)
    lookahead: int = 0  # tokens of future routing an expert's priority counts (sch's m)
    pinned: tuple[int, ...] = ()  # evicted only when nothing else is evictable (static)
    served: np.ndarray | None = None  # float64 [L x E] of the policy's own, + 1 per routed use (casmoe)
    guess_rows: int = 0  # most rows of a request's `Twin.request_guesses` table; 0: no table (speculative)
    guess_ids: int = 0  # most ids in one such table
    guess_width: int = 0  # most experts one row guesses

    @property
    def per_visit(self) -> int:
        """Most prefetches the kernel issues before one visit (for sizing the decision log)."""
        return self.next_layer_budget + self.guess_width


class Guesses(NamedTuple):
    """The experts a policy prefetches before each visit of one request (`Twin.request_guesses`):
    row `j * L + layer`, for `layer` of the request's `j`-th step, holds the local ids
    `ids[ptr[row]:ptr[row + 1]]`, best first; `j` counts from the first step a guess is read at."""

    ptr: np.ndarray  # int64 [steps * L + 1]
    ids: np.ndarray  # int64 [guesses]

    @property
    def rows(self) -> int:
        return len(self.ptr) - 1


def _nothing(cache: Any) -> None:
    return None


def _always(cache: Any) -> bool:
    return True


def _no_state(cache: Any) -> TwinState:
    return TwinState()


@dataclass(frozen=True)
class Twin:
    """The declaration: `order(mc, expert)`, the policy's victim order, `(float, int)` per
    candidate, smallest evicted first (compiled into the kernel); `touched(mc, expert)`, run
    after each access or insert of `expert`, or None; `reads_future`, whether the order reads
    every expert's future visits (`mc.use_ptr`, `mc.use_visit`; the kernel gets them only then);
    `state(cache)`, what the kernel reads from a fresh cache (called once); `request_key(cache)`,
    after the policy's own `prefetch_request` in a compiled run, the key [L x E] its order reads
    for this request's victims (`mc.key`, casmoe's scores), or None; `request_guesses(cache)`,
    after it, the experts the policy prefetches before each of the request's visits (`Guesses`,
    speculative's), or None; `runs(cache)`, whether this cache, with the options it was built
    with, makes the twin's decisions (casmoe's updating form does not)."""

    order: Callable[[Any, int], tuple[float, int]]
    touched: Callable[[Any, int], None] | None = None
    reads_future: bool = False
    state: Callable[[Any], TwinState] = _no_state
    request_key: Callable[[Any], np.ndarray | None] = _nothing
    request_guesses: Callable[[Any], Guesses | None] = _nothing
    runs: Callable[[Any], bool] = _always


def twin_of(policy: type[ExpertCache]) -> Twin | None:
    """The twin `policy` declares itself (not one it inherits), or None."""
    return policy.__dict__.get("twin")


def beyond_guesses(name: str, step: int) -> PolicyError:
    """A step past the running request's `Guesses` (another request's, or a prompt split into
    chunks): the error both runtimes of such a policy raise."""
    return PolicyError(f"{name}: step {step} lies beyond its request's steps (one request at a time, whole prefills)")
