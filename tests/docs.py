"""The documentation's code blocks, read where they live, for the tests that run them as written.

One reader for every test: ``doc_block("docs/security.md", "## Exposing the collector safely",
"bash")`` is the first ``bash`` block under that heading, up to the next heading of the same or
a higher level. A heading that is not there, or a block that is not under it, fails loudly with
the headings the file has, so a moved section breaks its test instead of silently testing
nothing.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FENCE = re.compile(r"^```(\S*)\n(.*?)^```", flags=re.S | re.M)


def _headings(text: str) -> list[tuple[int, int, str]]:
    """(offset, level, heading line) of every Markdown heading outside code blocks."""
    fenced = [(m.start(), m.end()) for m in FENCE.finditer(text)]
    found = []
    for m in re.finditer(r"^(#{1,6}) .*$", text, flags=re.M):
        if not any(a <= m.start() < b for a, b in fenced):
            found.append((m.start(), len(m.group(1)), m.group(0).strip()))
    return found


def doc_section(path: str | Path, heading: str) -> str:
    """The text under ``heading`` (a whole heading line, ``"## Guarantees"``) in ``path``
    (relative to the repository root), up to the next heading of its level or higher."""
    text = (ROOT / path).read_text()
    headings = _headings(text)
    matches = [(start, level) for start, level, line in headings if line == heading.strip()]
    if len(matches) != 1:
        have = "\n".join(line for _, _, line in headings)
        raise LookupError(f"{path}: {len(matches)} headings {heading!r}; it has:\n{have}")
    ((start, level),) = matches
    end = next((s for s, lv, _ in headings if s > start and lv <= level), len(text))
    return text[start:end]


def doc_blocks(path: str | Path, heading: str | None, lang: str) -> list[str]:
    """Every ``lang`` code block under ``heading`` (the whole file when ``heading`` is None)."""
    text = (ROOT / path).read_text() if heading is None else doc_section(path, heading)
    return [body for tag, body in FENCE.findall(text) if tag == lang]


def doc_block(path: str | Path, heading: str, lang: str, index: int = 0) -> str:
    """The ``index``-th ``lang`` code block under ``heading`` in ``path``."""
    blocks = doc_blocks(path, heading, lang)
    if index >= len(blocks):
        raise LookupError(f"{path}: {len(blocks)} {lang} blocks under {heading!r}, not {index + 1}")
    return blocks[index]
