"""Compiled (numba) kernels for the loops that interpreted Python makes slow.

Each module holds the hot loop of one computation, written as plain Python loops over numpy
arrays and compiled by numba on first use (`cache=True`: the machine code is kept next to the
module, or in numba's user cache when that folder is read-only, so later processes skip the
compile). The modules import numba at load time; callers import them inside the functions that
need them, so `import casmoe` and the CLI's start-up never pay for numba.

Where a kernel mirrors logic that also exists in Python (the cache mechanics and built-in
policies of `casmoe.cache` / `casmoe.policies`), the Python classes stay the definition a
reader follows and an equality test over random inputs keeps the two identical.
"""
