"""The repository explains itself: code and docs cite no requirement tags (R3.1), no documents
that are not in the repository (DESIGN.md, RULES.md, STYLE.md) and no issue numbers."""

from __future__ import annotations

import re

from helpers import REPO

SKIP_DIRS = {".git", ".venv", "build", "dist", ".baseline", ".pytest_cache", ".hypothesis", "__pycache__"}
SUFFIXES = {".py", ".md", ".h", ".cuh", ".cu", ".cc", ".sh", ".toml", ".jinja", ".yaml", ".txt"}
FORBIDDEN = re.compile(r"\bR\d+\.\d+\b|\b(?:DESIGN|RULES|STYLE)\.md\b|(?i:\bissue\s*#?\d+)")


def _files():
    for path in REPO.rglob("*"):
        rel = path.relative_to(REPO)
        if rel.parts and (rel.parts[0] in SKIP_DIRS or rel.parts[:2] == ("benchmarks", "results")):
            continue
        if any(part in SKIP_DIRS or part.endswith(".egg-info") or part.startswith(".") for part in rel.parts):
            continue
        if path.is_file() and path.suffix in SUFFIXES and path.name != "test_repository.py":
            yield path


def test_no_requirement_tags_or_outside_documents_are_cited():
    found = [f"{p.relative_to(REPO)}:{n}: {m.group(0)}"
             for p in _files() for n, line in enumerate(p.read_text(errors="replace").splitlines(), 1)
             for m in [FORBIDDEN.search(line)] if m]
    assert found == [], "cite the repository's own docs instead:\n" + "\n".join(found)
