"""The documentation as an entry: a README of at most 200 lines that links into docs/, one page per
question in mkdocs.yml's nav, every figure filled from the results file it names, a site that
builds strictly, and no reference a reader cannot resolve (an issue, session or round of this
project's own tracker).

The commands the pages show run in tests/project/test_readme.py.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from support.paths import REPO
from support.scripts import load_script

README = REPO / "README.md"
DOCS = REPO / "docs"


def _figures():
    return load_script(REPO / "bench" / "docs_figures.py")


def _nav() -> list[str]:
    return re.findall(r":\s*([\w./-]+\.md)\s*$", (REPO / "mkdocs.yml").read_text(encoding="utf-8"), flags=re.M)


def test_every_marked_figure_agrees_with_its_results_file():
    """`python bench/docs_figures.py --write` fills these; a results file made again without it,
    or a number edited by hand between the markers, fails here."""
    figures = _figures()
    sources: dict = {}
    stale = [line for path in figures.documents() for line in figures.stale(path, sources)]
    assert not stale, "\n".join(stale + ["run: python bench/docs_figures.py --write"])


def test_the_pages_quote_figures_from_results_files():
    """The figures the brief names come from files: the validation summary, the test suite's time."""
    text = "\n".join(p.read_text(encoding="utf-8") for p in [README, *DOCS.glob("*.md")])
    for spec in ("generated: validation-line", "figure: validation_run.commit", "figure: suite.minutes",
                 "generated: headline", "generated: policies"):
        assert spec in text, spec


def test_a_figure_that_disagrees_with_its_file_is_caught():
    figures = _figures()
    sources: dict = {}
    tests = figures.figure("suite.tests", sources)
    good = f"took <!-- figure: suite.tests -->{tests}<!-- /figure --> tests"
    assert figures.stale_text(good, "x", sources) == []
    bad = good.replace(f"-->{tests}<", "-->1<")
    assert len(figures.stale_text(bad, "x", sources)) == 1
    assert figures.fill(bad, sources) == good
    assert figures.figure("validation.summary.median_abs_log_ratio exp .2f", sources).startswith(("0", "1", "2"))
    with pytest.raises(figures.FigureError):
        figures.figure("validation.summary.no_such_field", sources)
    with pytest.raises(figures.FigureError):
        figures.figure("no_such_file.x", sources)


def test_the_policies_page_lists_every_registered_policy_from_the_registry():
    from casmoe.policies import POLICIES

    page = (DOCS / "policies.md").read_text(encoding="utf-8")
    for name, cls in POLICIES.items():
        assert f"| `{name}` |" in page and cls.summary in page, name


def test_the_readme_is_short_and_links_into_the_docs():
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 200
    links = re.findall(r"\]\((docs/[^)#\s]+)", text)
    assert {Path(link).name for link in links if link.endswith(".md")} >= {p for p in _nav() if p != "index.md"}
    for link in links:
        assert (REPO / link).exists(), link


def test_every_page_is_in_the_nav_and_every_nav_entry_exists():
    nav = _nav()
    assert len(nav) == len(set(nav))
    assert sorted(nav) == sorted(p.name for p in DOCS.glob("*.md"))


INTERNAL = re.compile(r"(?<![-\w])(?:[Ii]ssues?|[Ss]essions?|[Rr]ounds?)[ -]\d")
"""The word issue, session or round followed by a number: this project's own tracker and work
sessions, which a reader cannot resolve. An external tracker's number is written with its # (llama.cpp
issue #15136) and is a citation; a file name (bench/history's logs keep theirs) is not a reference."""

SCANNED = ["*.py", "*.md", "*.toml", "*.yml", "*.sh", "*.cfg", "*.txt", ".ci/*"]
"""What a reader reads: code, docs, and the shipped data whose `source` lines they are shown (a hardware
profile's sources, a published measurement's). Recorded data (traces, corpora, results) is not prose."""


def _scanned() -> list[Path]:
    tracked = subprocess.run(["git", "-C", str(REPO), "ls-files", *SCANNED], capture_output=True, text=True).stdout.split()
    if not tracked:
        pytest.skip("needs git")
    files = {REPO / f for f in tracked} | {README, REPO / "bench" / "RESULTS.md", *DOCS.glob("*.md"),
                                         *REPO.glob("bench/*.py"), *REPO.glob("tests/*.py")}
    return sorted(f for f in files if f.exists() and "bench/history" not in f.as_posix())


def test_no_reference_to_this_projects_issues_sessions_or_rounds():
    found = []
    for path in _scanned():
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if INTERNAL.search(re.sub(r"[\w./-]+\.(?:md|json|py)\b", "", line)):
                found.append(f"{path.relative_to(REPO)}:{n}: {line.strip()[:120]}")
    assert not found, "say what and why instead:\n" + "\n".join(found)


def test_the_site_builds_strictly(tmp_path):
    """What .ci/run does: a broken link or anchor, a page missing from the nav, any warning fails."""
    pytest.importorskip("mkdocs")
    pytest.importorskip("material")
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "--site-dir", str(tmp_path)],
                          cwd=REPO, capture_output=True, text=True, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
