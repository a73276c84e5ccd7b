"""Build and simulate every published row with a run: does each configuration still run, and what
does casmoe predict for it beside the published figure? A sanity check of the table, not a fit:
it prints each row's predicted/published ratio with the stack constants as they stand.

    python bench/published_check.py [ID_SUBSTRING ...] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import time

from casmoe.sim.questions.validation import load_rows, predict


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("ids", nargs="*", help="only rows whose id contains one of these")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    rows = [r for r in load_rows() if r.run and (not args.ids or any(s in r.id for s in args.ids))]
    out = []
    for row in rows:
        start = time.perf_counter()
        try:
            rate = predict(row)
            res = dict(id=row.id, system=row.system, stack=row.stack, published=row.rate, predicted=rate,
                       ratio=rate / row.rate)
            print(f"{row.id:75s} {row.stack:14s} pub {row.rate:9.3f} pred {rate:9.3f} ratio {rate / row.rate:6.3f} "
                  f"({time.perf_counter() - start:.1f}s)", flush=True)
        except Exception as exc:  # a row that no longer builds is the finding
            res = dict(id=row.id, system=row.system, stack=row.stack, error=f"{type(exc).__name__}: {exc}")
            print(f"{row.id:75s} ERROR {res['error']}", flush=True)
        out.append(res)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=1)
    bad = [r for r in out if "error" in r]
    print(f"{len(out)} rows with a run, {len(bad)} failed")


if __name__ == "__main__":
    main()
