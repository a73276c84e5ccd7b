"""What-ifs from Python: `casmoe.sim.simulate(...)` is `casmoe simulate` as a function.

Same options (`casmoe simulate --help`: `casmoe.sim.run.grid.OPTIONS`, by name), same defaults (the
shipped trace's first requests, every GPU of the profile, every policy, the cache sizes the box
holds, the requests no fitted policy saw) and the same checks (a capacity, a device count or RAM
the profile lacks is refused unless `allow_overcommit`). An option takes one value or a list
(a list of an axis runs each); `policies=`, `capacities=`, `global_capacities=`, `tasks=` and
`range=` are the older names of `policy`, `capacity`, `global_capacity`, `task` and `span`.
The answer holds one record per run, as `results.json`, and a pandas DataFrame of them:

    >>> import casmoe.sim
    >>> res = casmoe.sim.simulate(policies=["lru", "lfu"], capacities=[2, 4], requests=2)
    >>> res.frame()[["policy", "capacity", "decode_tokens_per_s"]]  # doctest: +SKIP
"""

from __future__ import annotations

import inspect
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from casmoe.errors import CasmoeError
from casmoe.options import OptionError
from casmoe.sim.passes.timeline import Timeline
from casmoe.sim.run.grid import Grid, Runs
from casmoe.sim.run.options import ALIASES, BY_NAME, OPTIONS
from casmoe.sim.run.runner import run, whole_trace
from casmoe.sim.run.runtimes import on_runtimes
from casmoe.sim.run.spec import file_digest
from casmoe.summary import headline

if TYPE_CHECKING:
    import pandas as pd


@dataclass(frozen=True)
class Results:
    """The runs of one what-if: `records` (dicts, a `skipped` entry for a run that could not
    be built), `runs` (the specs, per trace and machine) and what the user should know (`notes`)."""

    records: list[dict[str, Any]]
    runs: Runs

    @property
    def notes(self) -> list[str]:
        return self.runs.notes

    def frame(self) -> pd.DataFrame:
        """The runs that ran, one row each (columns as results.csv; nested values as lists)."""
        import pandas as pd

        return pd.DataFrame([r for r in self.records if "skipped" not in r])

    def headline(self) -> str:
        """The fastest policy per cache size, as `casmoe simulate` prints it (one line each)."""
        return "\n".join(headline([r for r in self.records if "skipped" not in r]))

    def priced(self) -> list[str]:
        """What was priced, one line per trace and machine, as `casmoe simulate` prints it first:
        the requests scored, the model on the box, each part's precision and the top-k."""
        return priced(self.runs)

    def __str__(self) -> str:
        """What was priced, then the headline: `print(res)` says what the figures are of."""
        return "\n".join([*self.priced(), self.headline()])

    def __repr__(self) -> str:  # the records are long (per-layer lists): a summary, not every field
        skipped = sum("skipped" in r for r in self.records)
        return (f"<casmoe.sim.Results: {len(self.records) - skipped} runs" + (f", {skipped} skipped" if skipped else "")
                + f"; {'; '.join(self.priced())}; print() for the headline, .frame() for every field>")


def priced(runs: Runs) -> list[str]:
    """The first lines of `casmoe simulate`: per trace and machine, the requests scored, the
    model on the box, each part's precision and the top-k (`Machine.priced`)."""
    lines = []
    for g, line in zip(runs.groups, runs.describe()):
        # the cache sizes the box holds are the table's columns: the group's "up to N experts per
        # layer fit" says it again (casmoe/sim/run/grid.py Group.describe)
        trace = whole_trace(str(g.trace), file_digest(g.trace))
        lines.append(f"{line.partition('; up to ')[0]}, {g.machine.priced(trace)}")
    return lines


def simulate(
    trace: str | os.PathLike[str] | None = None,
    *,
    timeline: str | os.PathLike[str] | None = None,
    progress: Callable[[int, int], None] | None = None,
    **options: Any,
) -> Results:
    """Simulate on modelled hardware; `options` are `casmoe simulate`'s (see the module
    docstring), with its defaults. `timeline` writes a Chrome/Perfetto trace of the first run;
    `progress(done, total)` is called after each run."""
    if trace is not None:
        if not isinstance(trace, (str, os.PathLike)) or isinstance(trace, bool):
            raise OptionError(f"simulate(): trace must be a path, got {trace!r}")
        options["trace"] = os.fspath(trace)
    if timeline is not None and not isinstance(timeline, (str, os.PathLike)):
        raise OptionError(f"simulate(): timeline must be a path, got {timeline!r}")
    runs = Grid.of(options, "simulate()").specs(strict=True)
    return run_specs(runs, None if timeline is None else Path(timeline), progress)


def run_specs(runs: Runs, timeline: Path | None = None,
              progress: Callable[[int, int], None] | None = None) -> Results:
    """Run every spec of `runs` in this process, in order (`casmoe simulate` and the API); a
    run that cannot be built is a `skipped` record, unless it is the only one. The headline's
    methods are priced again on their runtimes' stacks (`casmoe.sim.run.runtimes`)."""
    specs = runs.specs
    first = specs[0]
    recorder = None
    if timeline is not None:
        g = first.machine.preset.geometry
        recorder = Timeline(g.experts, first.machine.devices, f"{first.policy.label} @ {first.capacity.label}")
    records = []
    for i, spec in enumerate(specs):
        try:
            records.append(run(spec, recorder if i == 0 else None))
        except CasmoeError as exc:
            if len(specs) == 1:
                raise
            records.append({**spec.describe(), "skipped": str(exc)})
        if progress is not None:
            progress(i + 1, len(specs))
    if all("skipped" in r for r in records):  # nothing to report: a refusal, not an empty table
        raise CasmoeError(f"no run could be simulated; {records[0]['policy']} @ {records[0]['capacity_spec']}: "
                          f"{records[0]['skipped']}")
    if recorder is not None:
        recorder.write(timeline)  # type: ignore[arg-type]
    return Results(on_runtimes(runs, records), runs)


def _signature() -> inspect.Signature:
    """`simulate`'s signature with every option named, for `help()` and editors."""
    params = [inspect.Parameter("trace", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None)]
    params += [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None) for name in ("timeline", "progress")]
    params += [inspect.Parameter(o.name, inspect.Parameter.KEYWORD_ONLY, default=o.default) for o in OPTIONS
               if o.name != "trace"]
    params += [inspect.Parameter(alias, inspect.Parameter.KEYWORD_ONLY, default=None) for alias in ALIASES
               if alias not in BY_NAME and ALIASES[alias] != "trace"]
    return inspect.Signature(params)


simulate.__signature__ = _signature()  # type: ignore[attr-defined]
