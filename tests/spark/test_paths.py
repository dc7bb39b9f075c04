"""The Parquet dataset of an output stream stays inside the output directory
(issue 19): the name is checked (air/names.py) and, in depth, the resolved
path must be a direct child of the output directory. No Spark needed."""

from __future__ import annotations

import os

import pytest

from air.names import NAME_RULE
from clients.spark.run import dataset_path


def test_a_valid_stream_name_is_a_dataset_in_the_output_directory(tmp_path):
    assert dataset_path(tmp_path, "Rising") == tmp_path.resolve() / "Rising"
    assert dataset_path(tmp_path, "94") == tmp_path.resolve() / "94"


@pytest.mark.parametrize("bad", ["../../x", "..", "a/b", "/etc", "x" * 300, ""])
def test_a_name_that_could_leave_the_directory_is_refused(tmp_path, bad):
    with pytest.raises(ValueError, match="cannot write the Parquet dataset") as info:
        dataset_path(tmp_path / "out", bad)
    assert NAME_RULE in str(info.value)
    assert sorted(os.listdir(tmp_path)) == []


def test_a_symlink_out_of_the_directory_is_refused(tmp_path):
    out, elsewhere = tmp_path / "out", tmp_path / "elsewhere"
    out.mkdir()
    elsewhere.mkdir()
    (out / "Rising").symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(ValueError, match="outside the output directory"):
        dataset_path(out, "Rising")
