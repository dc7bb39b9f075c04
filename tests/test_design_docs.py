"""The design notes under docs/ are what the code cites: every citation of
``docs/<file>.md#<section>`` anywhere in the repository names a file and a heading
that exist, and no citation of the documents that are not in the repository
(the old product specification, the papers by file number) is left."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


CITATION = re.compile(r"docs/(?:design/)?[\w.-]+\.md(?:#[\w-]+)?")
#: a link between the notes themselves: (semantics.md#automata)
RELATIVE = re.compile(r"\]\(([\w.-]+\.md)(#[\w-]+)?\)")
OUTSIDE = re.compile(r"\bSPEC §|\b00[0-4] (?:§|Fig\.)|(?<![\w§])§ ?\d")


def _tracked() -> list[Path]:
    names = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    out = []
    for name in names.split():
        if name.startswith("server/console/static/vendor/") or not name.endswith((".py", ".md", ".pyx", ".pxd",
                                                                                    ".toml", ".yaml", ".cfg", ".js")):
            continue
        path = ROOT / name
        if path.is_file():
            out.append(path)
    return out


def _slug(heading: str) -> str:
    """The anchor GitHub gives a Markdown heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(doc: Path) -> set[str]:
    return {_slug(m.group(1)) for m in re.finditer(r"^#+ (.*)$", doc.read_text(), re.M)}


def test_every_citation_of_the_docs_resolves():
    bad = []
    cited = 0
    for path in _tracked():
        text = path.read_text(errors="replace")
        refs = [(m.group(0), ROOT) for m in CITATION.finditer(text)]
        if path.parent.name in ("docs", "design") and path.suffix == ".md":
            refs += [(m.group(1) + (m.group(2) or ""), path.parent) for m in RELATIVE.finditer(text)]
        for ref, base in refs:
            cited += 1
            file, _, anchor = ref.partition("#")
            doc = base / file
            if not doc.is_file():
                bad.append(f"{path.relative_to(ROOT)}: {ref} (no such file)")
            elif anchor and anchor not in _anchors(doc):
                bad.append(f"{path.relative_to(ROOT)}: {ref} (no heading #{anchor} in {file})")
    assert cited > 50, f"only {cited} citations found: the probe is broken"
    assert not bad, "citations of docs/ that do not resolve:\n" + "\n".join(bad)


def test_no_citation_of_documents_outside_the_repository():
    left = []
    for path in _tracked():
        rel = path.relative_to(ROOT).as_posix()
        if rel == "tests/test_design_docs.py":
            continue
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if OUTSIDE.search(line):
                left.append(f"{rel}:{n}: {line.strip()}")
    assert not left, ("citations of documents users do not have (cite the notes in docs/design/ instead):\n"
                      + "\n".join(left))
