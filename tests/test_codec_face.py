"""`scrapy_ha.codec` is the codec's public face: every name the rest of the package and
users import from it is there, and the implementation behind it stays in small modules."""

from __future__ import annotations

import ast
from pathlib import Path

from scrapy_ha import codec

CODEC = Path(codec.__file__).resolve().parent
PACKAGE = CODEC.parent
#: The size past which a module usually holds two jobs (issue 12: no module over 450 lines).
MAX_LINES = 450


def test_every_name_imported_from_the_codec_is_public():
    imported = set()
    outside = [p for p in PACKAGE.rglob("*.py") if CODEC not in p.parents]
    for path in outside:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == "scrapy_ha.codec":
                imported |= {alias.name for alias in node.names}
    assert imported, "nothing imports the codec: the walk is broken"
    assert imported <= set(codec.__all__)
    assert all(hasattr(codec, name) for name in codec.__all__)


def test_the_codec_modules_are_small():
    sizes = {path.name: len(path.read_text().splitlines()) for path in sorted(CODEC.glob("*.py"))}
    assert len(sizes) > 5 and all(n <= MAX_LINES for n in sizes.values()), sizes
