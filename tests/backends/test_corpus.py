"""The shipped corpus: enough real text, several tasks, a held-out split, licences beside it."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from casmoe.backends.corpus import (HELDOUT, TRAIN, CorpusError, CorpusEntry, load_corpus, load_prompts, save_corpus,
                                    split_document)
from casmoe.shipped import data_dir


def test_shipped_corpus_has_tasks_prompts_and_heldout_split() -> None:
    prompts = load_corpus()
    tasks = Counter(p.task for p in prompts)
    assert len(prompts) >= 3000
    assert len(tasks) >= 6
    held = [p for p in prompts if p.split == HELDOUT]
    assert {p.split for p in prompts} == {TRAIN, HELDOUT}
    assert 0.1 < len(held) / len(prompts) < 0.3
    assert {p.task for p in held} == set(tasks)  # every task is represented in the held-out split
    train_docs = {p.document for p in prompts if p.split == TRAIN}
    assert not train_docs & {p.document for p in held}  # no document sits on both sides
    assert all(p.text.strip() and p.continuation.strip() for p in prompts)


def test_every_prompt_has_its_real_continuation() -> None:
    prompts = load_corpus()
    for p in prompts:
        assert split_document(p.document, p.task) == (p.text, p.continuation)
    share = sum(len(p.text) for p in prompts) / sum(len(p.document) for p in prompts)
    assert 0.25 < share < 0.45  # prompts are about a third of their document
    for p in load_corpus(task="arithmetic"):  # the question is the prompt, the worked answer follows
        assert p.text.endswith("?") and p.continuation.startswith(" Answer: ")


@given(st.text(min_size=1, max_size=80), st.sampled_from(["quote", "arithmetic"]))
def test_split_document_cuts_once_at_a_word_boundary(text: str, task: str) -> None:
    prompt, continuation = split_document(text, task)
    assert prompt + continuation == text and prompt
    if any(c.isspace() for c in text.lstrip()) and task == "quote":
        assert continuation[:1].isspace() and not prompt[-1].isspace()


def test_licences_recorded_beside_the_corpus() -> None:
    folder = data_dir() / "corpus"
    licences = (folder / "LICENSES.md").read_text()
    for task in {p.task for p in load_corpus()}:
        assert f"| {task} |" in licences
    for name in ("LICENSE-freebsd-fortunes.txt", "LICENSE-human-eval.txt", "LICENSE-python.txt"):
        assert (folder / name).stat().st_size > 500


def test_filters_and_round_trip(tmp_path: Path) -> None:
    rows = [CorpusEntry("alpha text", "a", TRAIN, " goes on"), CorpusEntry("beta\ntext", "b", HELDOUT)]
    save_corpus(rows, tmp_path / "c.jsonl")
    assert load_corpus(tmp_path / "c.jsonl") == rows
    assert load_corpus(tmp_path / "c.jsonl", split=HELDOUT) == rows[1:]
    assert load_corpus(tmp_path / "c.jsonl", task="a") == rows[:1]
    (tmp_path / "p.txt").write_text("one\n\ntwo\n")
    assert [p.text for p in load_prompts(tmp_path / "p.txt")] == ["one", "two"]


def test_bad_corpus_files_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(CorpusError, match="not found"):
        load_corpus(tmp_path / "missing.jsonl")
    (tmp_path / "bad.jsonl").write_text(json.dumps({"text": "x"}) + "\n")
    with pytest.raises(CorpusError, match="bad.jsonl:1"):
        load_corpus(tmp_path / "bad.jsonl")


def test_arithmetic_answers_are_right() -> None:
    import re

    problems = load_corpus(task="arithmetic")
    assert len(problems) >= 500
    for p in problems:
        a, op, b, c = re.search(r"Answer: (\d+) ([-+*/]) (\d+) = (\d+)\.$", p.document).groups()
        assert {"+": int(a) + int(b), "-": int(a) - int(b), "*": int(a) * int(b),
                "/": int(a) / int(b)}[op] == int(c), p.text


def test_fortune_file_parsing(tmp_path: Path) -> None:
    from casmoe.backends.corpus import _fortunes

    (tmp_path / "f").write_text("%%$FreeBSD$\n%\nFirst\n\tindented\n%\nSecond\n%\n")
    assert list(_fortunes(tmp_path / "f")) == ["First\n    indented", "Second"]


def test_heldout_domains_are_new_tasks_with_continuations_never_trained_on() -> None:
    from casmoe.backends.corpus import build_heldout_domains, heldout_domains_path

    rows = load_corpus(heldout_domains_path())
    tasks = Counter(p.task for p in rows)
    assert len(tasks) >= 3 and min(tasks.values()) >= 100
    assert not set(tasks) & {p.task for p in load_corpus()}  # none of the training corpus's tasks
    assert {p.split for p in rows} == {HELDOUT}  # nothing here is for fitting
    assert all(p.text.strip() and p.continuation.strip() for p in rows)
    assert all(split_document(p.document, p.task) == (p.text, p.continuation) for p in rows)
    assert not {p.document for p in rows} & {p.document for p in load_corpus()}
    licences = (data_dir() / "corpus" / "LICENSES.md").read_text()
    for task in tasks:
        assert f"| {task} |" in licences
    tz = Path("/usr/share/zoneinfo/tzdata.zi")
    if not tz.exists() or "# version 2025b" not in tz.read_text()[:40]:
        pytest.skip("the shipped file was built from tzdata 2025b")
    assert build_heldout_domains(tz) == rows  # reproduces from its sources
