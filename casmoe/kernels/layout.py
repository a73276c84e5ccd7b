"""The compiled cache machine's scalar slots (`cache_machine.Machine.cfg` and `.reg`), by name.

The kernels in `cache_machine.py` read them, and so may a built-in policy's victim order, the
small function its own module declares (`Twin.order`, `casmoe.twin`): least-stale's reads the
running layer, sch's the visit and its lookahead. This module imports no numba, so a policy
module that names a slot stays cheap to import.

numba's on-disk cache checks only the source file of the function it caches, so a kernel in
`cache_machine.py` would keep a slot number from before an edit here. `cache_machine.py` therefore
restates the numbers it was written for and checks them at import: renumbering a slot means
editing that file too, which recompiles its kernels.
"""

# cfg slots (the run's settings)
(C_E, C_L, C_SLOTS, C_PER_LAYER, C_MISS, C_KEEPS, C_NEXT_LAYER_BUDGET, C_LOOKAHEAD, C_LOG, C_DECIDE,
 C_GUESSES) = range(11)
N_CFG = 11
# reg slots (mutable scalars); R_GUESS_*: the running request's guess table (speculative): its
# rows (-1: none), the step its first guess was read at (-1: not yet), a step beyond it (-1: none)
R_TICK, R_STEP, R_LAYER, R_NPROT, R_LIVE, R_LOG, R_ISSUED, R_GUESS_ROWS, R_GUESS_FIRST, R_GUESS_OVER = range(10)
N_REG = 10
