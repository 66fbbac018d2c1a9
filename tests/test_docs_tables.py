"""The documents' tables render: every run of table rows starts with a header row and its
delimiter row. Rows added after a section's prose (four settings, in the middle of "Shared
cookie sessions" of the reference) showed as a paragraph of pipes, not in the settings
table they belong to."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCUMENTS = [ROOT / "README.md", ROOT / "CHANGES.rst", *sorted((ROOT / "docs").glob("*.md"))]


def headless_tables(text: str) -> list[int]:
    """The line numbers of table rows that start a run of rows without a delimiter row
    (``| --- |``, ``| :-- |``) right under the first."""
    lines = [*text.splitlines(), ""]
    found = []
    for i, line in enumerate(lines[:-1]):
        first = line.startswith("|") and (i == 0 or not lines[i - 1].startswith("|"))
        if first and not lines[i + 1].replace(" ", "").startswith(("|-", "|:-")):
            found.append(i + 1)
    return found


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: p.name)
def test_every_table_has_its_header(document: Path) -> None:
    assert headless_tables(document.read_text()) == []
