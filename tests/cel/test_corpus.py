"""The conformance corpus as the CEL tests read it (tests/cel/corpus.py): every
CEL file is paired with the original compiler's AIR, and a pair whose AIR is
missing fails rather than dropping out of every test that walks the pairs."""

from __future__ import annotations

import shutil

import pytest

from tests.cel.corpus import AIR_OF, CONFORMANCE, WITHHELD, pairs


def test_every_pair_but_the_withheld_files_is_walked():
    held = {name for name, airs in AIR_OF.items() if set(airs) & WITHHELD}
    assert [name for name, _ in pairs()] == sorted(set(AIR_OF) - held, key=lambda n: int(n[4:]))
    assert len(pairs()) == 36 and all(p.exists() for _, paths in pairs() for p in paths)


def test_a_missing_air_file_is_an_error(tmp_path):
    shutil.copytree(CONFORMANCE / "air", tmp_path / "air")
    (tmp_path / "air" / "T1.xml").unlink()
    with pytest.raises(FileNotFoundError, match="test1: the conformance corpus lacks T1.xml"):
        pairs(tmp_path)
