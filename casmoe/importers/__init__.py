"""External routing formats -> `Trace` (one module per format), and `Trace` -> the long CSV.

- `route_csv`: the long routing CSV (`route_trace v1`), read and written;
- `lrc_arrays`: moe-lrc's per-layer arrays (expert ids, logits or int8 ranks);
- `json_routing`: plain JSON requests and moe-lrc's named case traces.

`import_trace` picks the reader (by `fmt`, or by suffix and content); `read_specs` reads the
`PATH` / `PATH#KEY` arguments of the commands that take traces of any format. Every fault
raises `TraceError` naming the file and what is wrong.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from casmoe.importers.json_routing import read_json
from casmoe.importers.lrc_arrays import read_lrc_arrays
from casmoe.importers.route_csv import CSV_COLUMNS, read_route_csv, write_route_csv
from casmoe.trace import Trace, TraceError

__all__ = ["CSV_COLUMNS", "FORMATS", "import_trace", "read_json", "read_lrc_arrays", "read_route_csv", "read_specs",
           "write_route_csv"]

FORMATS = ("auto", "csv", "json", "arrays", "npz")


def import_trace(sources: Sequence[str | Path], fmt: str = "auto", **options: Any) -> Trace:
    """Read any supported source; `fmt='auto'` decides by suffix (a directory means arrays)."""
    sources = [Path(s) for s in sources]
    if not sources:
        raise TraceError("no input given")
    if fmt == "auto":
        first = sources[0]
        if first.is_dir() or len(sources) > 1 or first.suffix in (".npy", ".safetensors"):
            fmt = "arrays"
        elif first.suffix == ".npz":
            fmt = "npz" if _is_casmoe_npz(first) else "arrays"
        elif first.suffix == ".json":
            fmt = "json"
        else:
            fmt = "csv"
    if fmt != "arrays" and len(sources) != 1:
        raise TraceError(f"format {fmt} takes one input file, got {len(sources)}")
    if fmt == "csv":
        return read_route_csv(sources[0])
    if fmt == "json":
        return read_json(sources[0], key=options.get("key"))
    if fmt == "npz":
        return Trace.load(sources[0])
    if fmt == "arrays":
        names = ("kind", "num_experts", "top_k", "prefill", "keep_logits")
        opts = {n: options[n] for n in names if options.get(n) is not None}
        return read_lrc_arrays(sources, **opts)
    raise TraceError(f"unknown format {fmt!r} ({', '.join(FORMATS)})")


def read_specs(specs: Sequence[str]) -> list[tuple[str, Trace]]:
    """Each `PATH` or `PATH#KEY` (one named entry of a JSON file), any format -> (label, Trace).

    The label is the key, else the file's stem; repeated labels get their position appended."""
    loaded = []
    for spec in specs:
        path, _, key = spec.partition("#")
        loaded.append((key or Path(path).stem, import_trace([path], key=key or None)))
    names = [name for name, _ in loaded]
    return [(f"{n}[{i}]" if names.count(n) > 1 else n, tr) for i, (n, (_, tr)) in enumerate(zip(names, loaded))]



def _is_casmoe_npz(path: Path) -> bool:
    import zipfile

    try:
        with zipfile.ZipFile(path) as zf:
            return "meta.npy" in zf.namelist()
    except (OSError, zipfile.BadZipFile):
        return False
