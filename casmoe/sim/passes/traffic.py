"""How requests reach a served run and how the server batches them (`Traffic`): a run option,
part of a run's description; the SimPy processes that serve it are `serving`."""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from casmoe.errors import CasmoeError
from casmoe.trace import Request


class ServingError(CasmoeError, ValueError):
    """Traffic that cannot be served (no arrival times in the trace, a rate <= 0, ...)."""


class Arrival(enum.Enum):
    POISSON = "poisson"  # open loop, exponential gaps of mean 1 / rate
    TRACE = "trace"  # open loop, the trace's per-request arrival times
    CLOSED = "closed"  # `users` users, each waiting for its answer and thinking `think`


class Schedule(enum.Enum):
    PREFILL_FIRST = "prefill-first"
    CHUNKED = "chunked"


@dataclass(frozen=True)
class Traffic:
    """How requests reach the server and how it batches them."""

    arrival: Arrival
    rate: float = 0.0  # requests per second (poisson)
    users: int = 1  # closed loop
    think: float = 0.0  # closed loop
    max_batch: int = 8
    schedule: Schedule = Schedule.PREFILL_FIRST
    chunk: int = 512  # tokens per step (chunked)
    seed: int = 0
    prefill_batch: int = 1  # prompts prefilled together in one step (prefill-first)

    def __post_init__(self) -> None:
        if self.arrival is Arrival.POISSON and not self.rate > 0:
            raise ServingError(f"--rate must be > 0 requests/s for poisson arrivals (got {self.rate})")
        if self.users < 1 or self.max_batch < 1 or self.chunk < 1 or not self.think >= 0:
            raise ServingError("--users, --max-batch and --chunk must be >= 1 and --think >= 0")
        if self.prefill_batch < 1 or (self.prefill_batch > 1 and self.schedule is Schedule.CHUNKED):
            raise ServingError("--prefill-batch N (>= 1) prefills whole prompts together: use it with --schedule "
                               "prefill-first (chunked prefill splits prompts into the decode steps instead)")

    @classmethod
    def from_options(
        cls,
        arrival: str | None = None,
        rate: float | None = None,
        users: int | None = None,
        think: float = 0.0,
        max_batch: int = 8,
        schedule: str = "prefill-first",
        chunk: int = 512,
        seed: int = 0,
        prefill_batch: int = 1,
    ) -> Traffic | None:
        """From the command line or a sweep file; None: no serving options (requests back to
        back). `users` means a closed loop; `rate` alone means Poisson arrivals."""
        if users is not None and (arrival not in (None, Arrival.CLOSED.value) or rate is not None):
            raise ServingError("give either --arrival (open loop) or --users (closed loop), not both")
        for flag, value in (("--think", think), ("--rate", rate)):
            if value is not None and not (math.isfinite(value) and value >= 0):
                raise ServingError(f"{flag} must be a finite number >= 0, got {value}")
        if arrival is None and users is None and rate is None:
            given = [flag for flag, value, default in (
                ("--think", think, 0.0), ("--max-batch", max_batch, 8), ("--schedule", schedule, "prefill-first"),
                ("--chunk", chunk, 512), ("--seed", seed, 0)) if value != default]
            if given:
                raise ServingError(f"{', '.join(given)} shape{'s' * (len(given) == 1)} serving; add --arrival or "
                                    "--users (without them requests run back to back)")
            return None
        if arrival is None:
            arrival = Arrival.CLOSED.value if users is not None else Arrival.POISSON.value
        kinds = {a.value: a for a in Arrival}
        schedules = {x.value: x for x in Schedule}
        if arrival not in kinds:
            raise ServingError(f"unknown --arrival {arrival!r}; one of {[a for a in kinds if a != 'closed']} (or --users N)")
        if schedule not in schedules:
            raise ServingError(f"unknown --schedule {schedule!r}; one of {list(schedules)}")
        if kinds[arrival] is Arrival.POISSON and rate is None:
            raise ServingError("--arrival poisson needs --rate (requests per second)")
        unused = [why for why, given in (  # a value that shapes another kind of serving would be dropped
            ("--think is the closed loop's time between an answer and the next request (--users N)",
             think != 0.0 and kinds[arrival] is not Arrival.CLOSED),
            ("--rate is the Poisson arrivals' (--arrival poisson)",
             rate is not None and kinds[arrival] is Arrival.TRACE),
            ("--seed draws the Poisson arrivals (--arrival poisson --rate R)",
             seed != 0 and kinds[arrival] is not Arrival.POISSON),
            ("--chunk sizes the chunked schedule (--schedule chunked)",
             chunk != 512 and schedules[schedule] is not Schedule.CHUNKED),
        ) if given]
        if unused:
            raise ServingError(f"{unused[0]}, and this run has none; leave it out")
        return cls(kinds[arrival], rate or 0.0, users or 1, think, max_batch, schedules[schedule], chunk, seed,
                   prefill_batch)

    @property
    def sequences(self) -> tuple[int, str]:
        """The most requests whose KV cache the server holds at once, and the flag that sets
        it: every running request keeps its cache, up to `max_batch`; a closed loop of fewer
        users never runs more than its users."""
        if self.arrival is Arrival.CLOSED and self.users < self.max_batch:
            return self.users, "--users"
        return self.max_batch, "--max-batch"

    def describe(self) -> str:
        if self.arrival is Arrival.POISSON:
            how = f"poisson {self.rate:g}/s"
        elif self.arrival is Arrival.TRACE:
            how = "trace arrivals"
        else:
            how = f"{self.users} users, think {self.think:g} s"
        sched = self.schedule.value + (f" {self.chunk}" if self.schedule is Schedule.CHUNKED else "")
        sched += f", {self.prefill_batch} prompts a step" if self.prefill_batch > 1 else ""
        return f"{how}, max batch {self.max_batch}, {sched}"

    def arrival_times(self, requests: Sequence[Request]) -> list[float]:
        """Open loop: when each request arrives (a closed loop has no times of its own: [])."""
        if self.arrival is Arrival.CLOSED:
            return []
        if self.arrival is Arrival.TRACE:
            times = [r.arrival for r in requests]
            if any(t is None for t in times):
                raise ServingError("--arrival trace needs a trace with per-request arrival times")
            return [float(t) for t in times]  # type: ignore[arg-type]
        gaps = np.random.default_rng(self.seed).exponential(1.0 / self.rate, len(requests))
        return np.cumsum(gaps).tolist()
