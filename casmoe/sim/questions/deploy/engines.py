"""The engines' own flags, and the command lines `casmoe plan` writes with them.

Every flag a plan prints was read in the engine's source at a named version: the lists of
`casmoe/engines/*.toml` (llama-server, the KTransformers `--kt-*` flags of the kvcache-ai
SGLang fork, vLLM's `vllm serve`, upstream SGLang) and `verified.toml` beside this module
(the programs themselves, `-m`, `--model-path`, `llama-quantize --tensor-type`, and the fork's
lines of the SGLang flags the KTransformers command uses). A `Command` is a value: a program,
its arguments, and the engine whose list it must pass; `check` holds it to that list (names,
value kinds, enum choices, llama.cpp's `-ot` syntax) and is what tests/sim/questions/test_plan_engines.py
runs on every command a plan prints. casmoe's own `bench` line is checked against the installed
command's parameters by the CLI and the tests (this package cannot import the CLI).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any, Sequence

from casmoe.errors import CasmoeError
from casmoe.tables import read_table

ENGINE_DATA = Path(__import__("casmoe").__file__).resolve().parent / "engines"
"""casmoe/engines/*.toml: a checkout's, or the installed package's copy (setup.py's package data)."""
VERIFIED = Path(__file__).with_name("verified.toml")

LLAMA_SERVER = "llama-server"
LLAMA_QUANTIZE = "llama-quantize"
VLLM = "vllm serve"
SGLANG = "python -m sglang.launch_server"
CASMOE = "casmoe bench"
SHELL = "shell"
"""The `flags_of` of a preparation step that is no engine's command line (a download, llama.cpp's
convert_hf_to_gguf.py): its text comes from casmoe/engines/support.toml [[prepare]], not a flag list."""

ENGINES = ("llama.cpp", "ktransformers", "vllm", "sglang", "casmoe")
"""The engines `casmoe plan` writes configurations for."""

FFN_EXPS = r"\.ffn_(up|down|gate|gate_up)_(ch|)exps"
"""llama.cpp's own pattern of a layer's expert tensors (LLM_FFN_EXPS_REGEX, common/common.h:991
at b8914), the one `--n-cpu-moe` appends after `blk\\.N`."""
BUFFER_TYPE = re.compile(r"CPU|CUDA\d+")
"""`-ot` buffer types of a CUDA build: CPU, CUDA<i> (llama.cpp.toml, buffer_type_names)."""
GGML_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q2_k", "q3_k", "q4_k", "q5_k", "q6_k",
              "mxfp4", "iq4_xs", "iq4_nl")
"""ggml type names `--tensor-type` takes (ggml_type_name, matched case-insensitively)."""


class EngineFlagError(CasmoeError, ValueError):
    """A command line that its engine's source does not accept as written."""


@dataclass(frozen=True)
class Flag:
    """One flag as read in the engine's source."""

    name: str
    aliases: tuple[str, ...]
    kind: str  # str, int, float, enum, switch, regex-list
    choices: tuple[str, ...]
    program: str
    source: str
    negations: tuple[str, ...] = ()

    @property
    def spellings(self) -> tuple[str, ...]:
        return (self.name, *self.aliases)


@dataclass(frozen=True)
class FlagList:
    """The flags one program accepts, by every spelling, with where they were read."""

    program: str
    engine: str
    version: str
    flags: dict[str, Flag] = field(default_factory=dict)

    def get(self, spelling: str) -> Flag | None:
        return self.flags.get(spelling)


def _read(path: Path) -> dict[str, Any]:
    return read_table(path)


def _flags_of(table: list[dict[str, Any]], program: str, engine: str) -> list[Flag]:
    out = []
    for f in table:
        if f.get("program", program) != program or f.get("engine", engine) != engine:
            continue
        out.append(Flag(f["name"], tuple(f.get("aliases", ())), f["kind"], tuple(f.get("choices", ())), program,
                        f["source"], tuple(f.get("negated_by", ()))))
    return out


@cache
def flag_list(program: str) -> FlagList:
    """The flags of `program` (`LLAMA_SERVER`, `LLAMA_QUANTIZE`, `VLLM`, `SGLANG`, or
    `SGLANG + ' (ktransformers)'`, the kvcache-ai fork with its `--kt-*` flags)."""
    verified = _read(VERIFIED)
    extra = verified.get("flag", [])
    if program == LLAMA_SERVER:
        data = _read(ENGINE_DATA / "llama.cpp.toml")
        flags = _flags_of(data["flag"], program, "llama.cpp") + _flags_of(extra, program, "llama.cpp")
        return _list(program, "llama.cpp", data["version"], flags)
    if program == LLAMA_QUANTIZE:
        data = _read(ENGINE_DATA / "llama.cpp.toml")
        return _list(program, "llama.cpp", data["version"], _flags_of(extra, program, "llama.cpp"))
    if program == VLLM:
        data = _read(ENGINE_DATA / "vllm.toml")
        return _list(program, "vllm", data["version"], _flags_of(data["flag"], program, "vllm"))
    if program == SGLANG:
        data = _read(ENGINE_DATA / "sglang.toml")
        flags = _flags_of(data["flag"], program, "sglang") + _flags_of(extra, program, "sglang")
        return _list(program, "sglang", data["version"], flags)
    if program == SGLANG + " (ktransformers)":
        kt, up = _read(ENGINE_DATA / "ktransformers.toml"), _read(ENGINE_DATA / "sglang.toml")
        flags = (_flags_of(kt["flag"], SGLANG, "ktransformers") + _flags_of(extra, SGLANG, "ktransformers")
                 + _flags_of(extra, SGLANG, "sglang"))
        known = {s for f in flags for s in f.spellings}
        # upstream flags (read at the fork's upstream parent) that the fork does not redefine
        flags += [f for f in _flags_of(up["flag"], SGLANG, "sglang") if not known & set(f.spellings)]
        return _list(SGLANG, "ktransformers", kt["version"].strip(), flags)
    raise EngineFlagError(f"no flag list for {program!r}")


def _list(program: str, engine: str, version: str, flags: Sequence[Flag]) -> FlagList:
    table: dict[str, Flag] = {}
    for f in flags:
        for s in (*f.spellings, *f.negations):
            table.setdefault(s, f)
    return FlagList(program, engine, version, table)


def program_source(program: str) -> str:
    """Where the program's name and usage were read."""
    entry = _read(VERIFIED)["program"].get(program)
    return "" if entry is None else entry["source"]


def fact(name: str) -> tuple[str, str]:
    """(text, source) of an engine fact `casmoe plan` relies on (`verified.toml [facts]`)."""
    entry = _read(VERIFIED)["facts"][name]
    return entry["text"], entry["source"]


# ---------------------------------------------------------------------------------------- commands
@dataclass(frozen=True)
class Command:
    """A program and its arguments: (flag, value) pairs, value None for a switch, flag "" for a
    positional argument. `flags_of` names the flag list it is held to."""

    program: str
    args: tuple[tuple[str, str | None], ...]
    flags_of: str = ""
    env: tuple[tuple[str, str], ...] = ()
    creates: str = ""  # the file or folder a preparation step makes (a script skips the step when it exists)

    def argv(self) -> list[str]:
        out = self.program.split()
        for flag, value in self.args:
            if flag:
                out.append(flag)
            if value is not None:
                out.append(value)
        return out

    def text(self, width: int = 100) -> str:
        """The command as a shell would take it, one flag a line past `width` characters."""
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in self.env)
        head = (env + " " if env else "") + self.program
        parts = [" ".join(shlex.quote(x) for x in ([f] if f else []) + ([v] if v is not None else []))
                 for f, v in self.args]
        one = " ".join([head, *parts])
        return one if len(one) <= width else (" \\\n    ").join([head, *parts])

    def value(self, spelling: str) -> str | None:
        """The value of the first argument spelt `spelling` (KeyError when absent)."""
        for flag, value in self.args:
            if flag == spelling:
                return value
        raise KeyError(spelling)

    def has(self, spelling: str) -> bool:
        return any(flag == spelling for flag, _ in self.args)

    def check(self) -> None:
        """Raise `EngineFlagError` unless every flag is one the engine's source has, with a
        value of its kind (a choice of its enum, llama.cpp's `-ot` syntax)."""
        if self.flags_of in (CASMOE, SHELL):
            return  # `casmoe bench`: held to the installed command by the CLI and the tests; a shell step: no flag list
        flags = flag_list(self.flags_of or self.program)
        for flag, value in self.args:
            if not flag:
                continue
            spec = flags.get(flag)
            if spec is None:
                raise EngineFlagError(f"{self.program}: {flag} is not a flag of {flags.engine} at {flags.version}")
            _check_value(spec, flag, value, self.program)


def _check_value(spec: Flag, flag: str, value: str | None, program: str) -> None:
    where = f"{program} {flag}"
    if spec.kind == "switch" or flag in spec.negations:
        if value is not None:
            raise EngineFlagError(f"{where} is a switch and takes no value (got {value!r})")
        return
    if value is None:
        raise EngineFlagError(f"{where} needs a value ({spec.kind})")
    if spec.kind == "int":
        for part in value.split():  # nargs='+' flags (--kt-numa-nodes) take several
            try:
                int(part)
            except ValueError:
                raise EngineFlagError(f"{where} takes a whole number, not {value!r}") from None
    elif spec.kind == "float":
        try:
            float(value)
        except ValueError:
            raise EngineFlagError(f"{where} takes a number, not {value!r}") from None
    elif spec.kind == "enum" and spec.choices and value not in spec.choices:
        raise EngineFlagError(f"{where} takes one of {', '.join(spec.choices)}, not {value!r}")
    elif spec.kind == "regex-list":
        parse_overrides(value)
    if flag == "--tensor-type":
        name, sep, kind = value.partition("=")
        if not sep or not name or kind.lower() not in GGML_TYPES:
            raise EngineFlagError(f"{where} takes tensor_name=ggml_type, not {value!r}")
        re.compile(name)
    if flag in ("-ngl", "--n-gpu-layers", "--gpu-layers") and value not in ("auto", "all"):
        try:
            int(value)
        except ValueError:
            raise EngineFlagError(f"{where} takes a number, auto or all, not {value!r}") from None


def parse_overrides(text: str) -> list[tuple[str, str]]:
    """llama.cpp's `-ot` value as its parser reads it (parse_tensor_buffer_overrides,
    common/arg.cpp:245-276 at b8914): items split on ',', each at its first '=' into a regex and
    a buffer type of a CUDA build; a malformed one is an `EngineFlagError`."""
    out = []
    for item in text.split(","):
        pattern, sep, buft = item.partition("=")
        if not sep:
            raise EngineFlagError(f"-ot item {item!r} has no '=' (llama.cpp: 'invalid value')")
        if not BUFFER_TYPE.fullmatch(buft):
            raise EngineFlagError(f"-ot item {item!r}: unknown buffer type {buft!r} (CPU, CUDA0, CUDA1, ...)")
        try:
            re.compile(pattern)
        except re.error as exc:
            raise EngineFlagError(f"-ot item {item!r}: not a regex ({exc})") from None
        out.append((pattern, buft))
    return out


def override_target(overrides: Sequence[tuple[str, str]], tensor: str) -> str | None:
    """Where llama.cpp puts `tensor` under `overrides`: the buffer type of the first regex found
    in its name (std::regex_search, first match wins: src/llama-model-loader.cpp:1156-1178), or
    None (the tensor stays where -ngl puts its layer)."""
    for pattern, buft in overrides:
        if re.search(pattern, tensor):
            return buft
    return None


def blocks_regex(blocks: Sequence[int]) -> str:
    """The expert tensors of these transformer blocks: `blk\\.(3|7|12)` + llama.cpp's pattern.
    No comma inside (the `-ot` parser splits on commas)."""
    ids = sorted(set(int(b) for b in blocks))
    alt = str(ids[0]) if len(ids) == 1 else "(" + "|".join(str(b) for b in ids) + ")"
    return rf"blk\.{alt}{FFN_EXPS}"


def overrides_text(placement: Sequence[tuple[Sequence[int], str]]) -> str:
    """`-ot` value for (blocks, buffer type) pairs, empty block lists left out."""
    return ",".join(f"{blocks_regex(blocks)}={buft}" for blocks, buft in placement if blocks)
