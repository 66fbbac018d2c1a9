"""What a stored or printed text hides from a plain search: base64 tagged bytes (a stored
request's header values, its body) and Basic credentials. A test that looks for a secret
searches :func:`readable` of a text, or a secret in a header value would slip through."""

from __future__ import annotations

import base64
import re

#: Tagged bytes, also within a JSON string (an archive's payload column as JSON: ``\\"__b\\"``).
_TAGGED = re.compile(r'__b\\?":\s*\\?"([A-Za-z0-9+/=]*)')
#: Basic credentials (``user:password`` in base64).
_BASIC = re.compile(r"Basic ([A-Za-z0-9+/=]{4,})")


def readable(text: str) -> str:
    """*text* and what it hides: tagged bytes of a stored document and Basic credentials,
    decoded (twice: a header's bytes are tagged, its credentials base64 within)."""
    found = [text]
    for _ in range(2):
        extra = []
        for pattern in (_TAGGED, _BASIC):
            for match in pattern.finditer(found[-1]):
                try:
                    extra.append(base64.b64decode(match[1]).decode("latin-1"))
                except ValueError:
                    continue
        found.append("\n".join(extra))
    return "\n".join(found)
