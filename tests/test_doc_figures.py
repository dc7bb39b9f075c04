"""Figures in the documents, checked against the product (issue 35: "every
figure in a document either measured by a command next to it or checked by a
test"). What a test cannot measure (an install's download, a suite's minutes)
is given with the command that measured it; these check the rest: the
defaults the README's and RELIABILITY.md's limit tables state, and the README's
endpoint table against /openapi.json."""

from __future__ import annotations

import re

import pytest
import yaml

from server.config import DEFAULT_CONFIG, Settings
from tests.conftest import ROOT

_UNITS = {"": 1, "s": 1, "h": 3600, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}


def _bundled(name: str):
    """A setting's value as the bundled config.yaml writes it, else the class default."""
    data = yaml.safe_load(DEFAULT_CONFIG.read_text(encoding="utf-8"))
    return data[name] if name in data else Settings.model_fields[name].default


def _value(cell: str):
    """A table's default as written, whatever follows it: "64", "1,000,000", "300 s (10 s for ...)", "1 MiB",
    "24 h", "`auto` (25% of memory)", "0: none", "`fsync`", "100,000 events", "none"; None: not a default."""
    m = re.match(r"`(\w+)`|none\b|([\d,]+)\s*(s|h|KiB|MiB|GiB)?\b", cell.strip())
    if m is None:
        return None
    if m.group(1):
        return m.group(1)
    if m.group(2) is None:
        return "none"
    return int(m.group(2).replace(",", "")) * _UNITS[m.group(3) or ""]


def _same(stated, shipped) -> bool:
    return stated == shipped or (stated == "none" and shipped in (None, [], {}, 0))


def _limit_rows(document: str) -> list[tuple[str, str]]:
    """(setting, default) for each row of ``document``'s tables whose first cell names settings only."""
    rows = []
    for line in (ROOT / document).read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 3 or not cells[0].startswith("`"):
            continue
        names = re.findall(r"`(\w+)`", cells[0])
        if not names or re.sub(r"`\w+`|,|\s", "", cells[0]) or not all(n in Settings.model_fields for n in names):
            continue
        values = re.split(r",\s+", cells[1]) if len(names) > 1 else [cells[1]]
        if len(values) == len(names) and all(_value(v) is not None for v in values):  # not a header row
            rows.extend(zip(names, values))
    return rows


@pytest.mark.parametrize("document", ["README.md", "RELIABILITY.md"])
def test_the_limit_tables_state_the_shipped_defaults(document):
    rows = _limit_rows(document)
    assert len(rows) >= 12, f"{document}: the limits table was not found"
    wrong = [(name, cell, _bundled(name)) for name, cell in rows if not _same(_value(cell), _bundled(name))]
    assert wrong == [], f"{document}: (setting, the table's default, config.yaml's) {wrong}"


def test_the_open_files_the_readme_counts_are_what_serve_checks_for():
    from server.serve import descriptors_needed

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    stated = re.search(r"\| open files \| .*?\((\d+) with the defaults\)", readme)
    assert stated and int(stated.group(1)) == descriptors_needed(Settings(**yaml.safe_load(
        DEFAULT_CONFIG.read_text(encoding="utf-8"))))


def test_the_readme_lists_every_operation_of_the_api():
    from server.app import create_app
    from server.daemon import Daemon

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    table = readme.split("## The server\n\n", 1)[1].split("\n\n", 1)[0]
    named = {(m, re.sub(r"\{\w+\}", "{}", p)) for m, p in re.findall(r"`(GET|POST|DELETE|WS) (/[^`\[? ]*)", table)}
    # "GET /subscriptions/{id}/automaton[/instances]": the bracketed part is a second path
    for m, p, extra in re.findall(r"`(GET|POST|DELETE) (/[^`\[ ]*)\[(/[^\]]+)\]", table):
        named.add((m, re.sub(r"\{\w+\}", "{}", p + extra)))
    import tempfile

    from clients.testing import server_settings

    with tempfile.TemporaryDirectory() as tmp:
        daemon = Daemon(server_settings(tmp))
        try:
            doc = create_app(daemon.settings, daemon).openapi()
        finally:
            daemon.stop()
    operations = {(method.upper(), re.sub(r"\{\w+\}", "{}", path)) for path, item in doc["paths"].items()
                  for method in item}
    assert operations - named == set(), "operations the README's endpoint table does not name"
