"""What each engine version can run, from casmoe/engines/support.toml: a plan prints no command its
engine cannot load, and each script it writes checks the engine's version before it starts.

- `family_support`: whether an engine loads a model family at all, and from which version
  (`[[model_family]]`, each entry naming the `[[arch_since]]` or `[[loader]]` row it rests on);
  a family with no entry for an engine is not established, and the plan says so instead of
  printing a command;
- `llama_minimum`: the first llama.cpp build that takes every flag (and value: `-ngl all`,
  `--fit off`, `-fa on`) a command line uses, and loads the model's architecture;
- `minimum`: the same for the other engines, from the family's version (their flags' rows are
  checked where support.toml states a version for them);
- `version_check`: the shell lines a script runs first to hold the installed engine to it.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from functools import cache
from typing import Any, Sequence

from casmoe.presets import ModelPreset
from casmoe.sim.questions.deploy.engines import ENGINE_DATA
from casmoe.tables import read_table

SUPPORT = ENGINE_DATA / "support.toml"
ENGINE_KEYS = {"llama.cpp": "llama.cpp", "ktransformers": "ktransformers", "vllm": "vllm", "sglang": "sglang"}
"""`casmoe plan`'s engines as support.toml's [[model_family]] rows name them (casmoe's own backend:
its adapters, `casmoe.backends.adapters`)."""


@cache
def data() -> dict[str, Any]:
    return read_table(SUPPORT)


@dataclass(frozen=True)
class Support:
    """Whether `engine` runs `family`: `since` its first version ('' when unsupported), `why`
    the reason it does not (or '' when it does), `row` the support.toml row it rests on."""

    engine: str
    family: str
    since: str = ""
    why: str = ""
    row: str = ""

    @property
    def supported(self) -> bool:
        return not self.why


def family_of(preset: ModelPreset, gguf_arch: str = "") -> str:
    """The model family (transformers' model_type) of a preset by its name, or of a GGUF by its
    architecture ('' when none is known)."""
    rows = data()["model_family"]
    name = preset.name.lower()
    for row in rows:
        if any(name.startswith(p) for p in row.get("presets", ())):
            return row["family"]
    if gguf_arch:
        for row in rows:
            if gguf_arch in row.get("gguf_arch", ()):
                return row["family"]
    return ""


def family_support(family: str, engine: str) -> Support:
    """Whether `engine` loads models of `family` (see the module docstring)."""
    key = ENGINE_KEYS.get(engine, engine)
    row = next((r for r in data()["model_family"] if r["family"] == family), None)
    if row is None:
        return Support(engine, family, why=f"casmoe knows of no {engine} support for this model's architecture "
                                           f"({family or 'unknown'}; casmoe/engines/support.toml [[model_family]])")
    entry = row.get(key)
    if entry is None:
        return Support(engine, family, why=f"{engine} support for {family} is not established (no source read for it "
                                           "in casmoe/engines/support.toml)")
    if "unsupported" in entry:
        return Support(engine, family, why=entry["unsupported"], row=entry["row"])
    return Support(engine, family, since=entry["since"], row=entry["row"])


# ------------------------------------------------------------------------------------ llama.cpp builds
def build_number(text: str) -> int:
    """'b7553' -> 7553; 'pre-b1046' -> 0 (older than any build a plan would meet)."""
    m = re.fullmatch(r"b(\d+)", text.strip())
    return int(m.group(1)) if m else 0


_VALUE_ROWS = {
    ("--n-gpu-layers", "all"): "-ngl/--n-gpu-layers auto|all",
    ("--n-gpu-layers", "auto"): "-ngl/--n-gpu-layers auto|all",
    ("--fit", None): "--fit [on|off] (incl. '--fit off')",
    ("--numa", None): "--numa distribute|isolate|numactl",
    ("--flash-attn", None): "-fa/--flash-attn on|off|auto",
}
"""llama.cpp flags whose value came later than the flag (support.toml rows by their `flag` text)."""


def _llama_rows() -> dict[str, dict[str, Any]]:
    return {r["flag"]: r for r in data()["flag_since"] if r["engine"] == "llama.cpp"}


def llama_minimum(args: Sequence[tuple[str, str | None]], family: str) -> tuple[int, list[str]]:
    """The first llama.cpp build that takes every (flag, value) of `args` and loads `family`, and
    why (the flags and the architecture that set it, each with its build)."""
    rows = _llama_rows()
    why: dict[str, int] = {}
    for flag, value in args:
        if not flag:
            continue
        row = rows.get(flag)
        if row is None:
            continue
        canonical = row.get("canonical") or flag
        build = build_number(row["first_build"])
        text = flag
        special = _VALUE_ROWS.get((canonical, value)) or _VALUE_ROWS.get((canonical, None))
        if special and special in rows and value is not None:
            build = max(build, build_number(rows[special]["first_build"]))
            text = f"{flag} {value}"
        why[text] = max(why.get(text, 0), build)
    support = family_support(family, "llama.cpp")
    if support.supported:
        why[f"the {family} architecture"] = build_number(support.since)
    need = max(why.values(), default=0)
    return need, [f"{k} (b{v})" for k, v in sorted(why.items(), key=lambda kv: -kv[1]) if v == need and v]


# ------------------------------------------------------------------------------------ other engines
AFTER = re.compile(r"after v(\d+)\.(\d+)\.(\d+)")
"""A vLLM row's 'after v0.11.2 (main ...)': in no release casmoe read; the next patch release is the
least a script can ask for."""


def version_key(text: str) -> tuple[int, ...]:
    """A version as a sortable key: '0.5.0rc0' < '0.5.0' < '0.5.0.post1'; 'v' prefixes dropped."""
    m = re.match(r"v?(\d+)(?:\.(\d+))?(?:\.(\d+))?(?:\.?(rc|post|dev)(\d+))?", text.strip())
    if not m:
        return (0,)
    major, minor, patch, tag, n = m.groups()
    rank = {"dev": -2, "rc": -1, None: 0, "post": 1}[tag]
    return int(major), int(minor or 0), int(patch or 0), rank, int(n or 0)


def _version_of(row: dict[str, Any]) -> str:
    text = str(row.get("first_build") or row.get("first_version") or "")
    m = AFTER.search(text)
    if m:
        return f"{m.group(1)}.{m.group(2)}.{int(m.group(3)) + 1}"
    return text.removeprefix("v")


def minimum(engine: str, args: Sequence[tuple[str, str | None]], family: str) -> tuple[str, str]:
    """The least version of vLLM or SGLang (or KTransformers) that takes every flag of `args`
    support.toml dates, and runs `family`; and why (what sets it)."""
    flags = {f for f, _ in args if f}
    why: list[tuple[str, str]] = []
    for row in data()["flag_since"]:
        if row["engine"] != engine:
            continue
        names = {t for t in re.split(r"[\s/(),+]+", row["flag"]) if t.startswith("--")}
        if names & flags:
            why.append((_version_of(row), f"{' / '.join(sorted(names & flags))} ({_version_of(row)})"))
    s = family_support(family, engine)
    if s.supported and s.since:
        why.append((s.since.removeprefix("v"), f"the {family} architecture ({s.since}: {s.row})"))
    if not why:
        return "", ""
    need = max(why, key=lambda w: version_key(w[0]))[0]
    return need, "; ".join(text for v, text in why if version_key(v) == version_key(need))


# ------------------------------------------------------------------------------------ version checks
def _version_text(text: str) -> str:
    return text.strip().removeprefix("v")


CHECKS = {
    "llama.cpp": ("llama-server --version 2>&1 | sed -n 's/^version: \\([0-9][0-9]*\\).*/\\1/p' | head -n 1",
                  "llama-server --version"),
    "vllm": ("vllm --version 2>/dev/null | tail -n 1", "vllm --version"),
    "sglang": ("python -c 'import sglang; print(sglang.__version__)' 2>/dev/null", "sglang.__version__"),
    "ktransformers": ("python -c 'import kt_kernel; print(kt_kernel.__version__)' 2>/dev/null",
                      "kt_kernel.__version__"),
}
"""How a script reads each engine's installed version (llama.cpp: `--version` prints 'version: 8914 (8bc492eb)',
common/common.cpp; kt-kernel: kt_kernel.__version__, kt-kernel/README.md 'Verify installation')."""


def version_check(engine: str, minimum: str, why: str) -> list[str]:
    """Shell lines that stop a script when the installed `engine` is older than `minimum`
    (llama.cpp: a build number; the others: a version compared as `sort -V` does), or absent."""
    if engine not in CHECKS or not minimum:
        return []
    read, how = CHECKS[engine]
    want = minimum if engine == "llama.cpp" else _version_text(minimum)
    tell = f"casmoe plan: this configuration needs {engine} {'b' if engine == 'llama.cpp' else ''}{want} or newer " \
           f"({why})"
    if engine == "llama.cpp":
        test = f'[ -n "$have" ] && [ "$have" -ge {int(want)} ]'
    else:
        test = f'[ -n "$have" ] && [ "$(printf \'%s\\n%s\\n\' {shlex.quote(want)} "$have" | sort -V | head -n 1)" = ' \
               f'{shlex.quote(want)} ]'
    return [f"have=$({read})",
            f"if ! {{ {test}; }}; then",
            f"  echo {shlex.quote(tell + '; found: ')}\"${{have:-none}}\"' ({how})' >&2",
            "  exit 1",
            "fi"]
