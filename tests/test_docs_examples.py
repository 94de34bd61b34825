"""Every example in README.md and docs/*.md does what the doc says, run as a reader would run it.

The rules for blocks, markers and shown output are in ``tests/docblocks.py``; how blocks run
(namespaces as machines, fresh homes, waiting for ready lines) in ``tests/docrunner.py``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import docblocks as db
from tests.docrunner import REPO, DocRun
from tests.netns import NetnsLab

DOCS = ["README.md", *sorted(str(p.relative_to(REPO)) for p in (REPO / "docs").glob("*.md"))]

# Every block the runner leaves out, and why; a new skip must be added here (keep them few).
PLUGIN_COMMANDS = "tests/test_plugin.py runs these with the pinned Claude Code, in a HOME of its own and no peerd on PATH"
SKIPPED = {
    ("README.md", "runs the whole suite, this test among it"),
    ("README.md", "the checks and the whole suite; CI runs both"),
    ("docs/mcp.md", "starts Claude Code itself, an interactive client"),
    ("docs/mcp.md", "installs from npm; scripts/test runs it before the suite when the Inspector is missing"),
    ("docs/mcp.md", "a fragment of your own server: the names above it are yours"),
    ("README.md", PLUGIN_COMMANDS),
    ("docs/mcp.md", PLUGIN_COMMANDS),
}


def doc_blocks(doc: str) -> list[db.Block]:
    return db.blocks(doc, (REPO / doc).read_text())


def test_every_block_has_a_decision() -> None:
    """Every fence names a language the runner knows what to do with; $ commands are console blocks."""
    for doc in DOCS:
        for block in doc_blocks(doc):
            db.check_block(block)


def test_config_blocks_parse() -> None:
    """json, toml and ini blocks parse (the MCP configurations among them are also run, per doc)."""
    for doc in DOCS:
        for block in doc_blocks(doc):
            if block.skip is not None:
                continue
            if block.lang == "json":
                db.json_servers(block.body, block.where)
            elif block.lang == "toml":
                db.toml_servers(block.body, block.where)
            elif block.lang == "ini":
                db.check_ini(block.body, block.where)


def test_skipped_blocks_are_listed() -> None:
    """The blocks left out are exactly the ones listed here, each with its reason."""
    skipped = {(b.path, b.skip) for doc in DOCS for b in doc_blocks(doc) if b.skip is not None}
    assert skipped == SKIPPED


def test_first_ten_minutes_is_linked_from_the_readme() -> None:
    """A newcomer finds the walkthrough from the README."""
    assert "(docs/first-ten-minutes.md)" in (REPO / "README.md").read_text()


@pytest.fixture
def run(tmp_path: Path) -> Iterator[DocRun]:
    with NetnsLab.create() as lab:
        doc_run = DocRun(lab, tmp_path)
        try:
            yield doc_run
        finally:
            doc_run.close()


@pytest.mark.netns
@pytest.mark.timeout(1200)  # a guard against a hang: a long document runs many daemons and clients in turn
@pytest.mark.parametrize("doc", [d for d in DOCS if any(b.skip is None and b.lang not in db.SHOWN_LANGS
                                                          for b in doc_blocks(d))])
def test_doc_examples_run(doc: str, run: DocRun) -> None:
    """Each block of the doc, in order, on fresh machines, does what the doc shows."""
    for block in doc_blocks(doc):
        run.run(block)
