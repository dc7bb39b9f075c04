"""Distributed runs inside a real local Spark equal ``cayuga run``, as multisets."""

from __future__ import annotations

import io
import json

import pytest
from click.testing import CliRunner

from clients.offline import run_offline
from clients.spark.io import ColumnMapping
from clients.spark.run import run_distributed, write_jsonl, write_parquet
from clients.spark_cli import spark as spark_group
from tests.conftest import AIR_DIR, CEL_DIR, STOCK
from tests.spark.conftest import multiset

PARQUET_MAPPING = ColumnMapping(t0="ts_start", t1="ts", attributes={"Name": "symbol"})


def offline(queries, event_files) -> list[dict]:
    with open(event_files["jsonl"], encoding="utf-8") as fh:
        return run_offline([STOCK], [str(q) for q in queries], fh, "jsonl").witnesses


@pytest.mark.parametrize("name", ["test5", "test25", "test206", "test7", "test4", "test6", "test27"])
@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_conformance_queries_match_the_single_engine(spark, event_files, name, fmt):
    q = CEL_DIR / f"{name}.cel"
    expected = offline([q], event_files)
    assert expected, f"the test stream should make {name} match"
    said = []
    res = run_distributed(spark, [STOCK], [str(q)], str(event_files[fmt]), fmt,
                          mapping=PARQUET_MAPPING if fmt == "parquet" else None, say=said.append)
    assert multiset(res.collect()) == multiset(expected)
    assert res.events == 600 and res.rejected == 0
    assert res.witnesses == len(expected)
    assert said == [f"stage 1/1 [{name}] reads Stock: hash-partitioned by Stock.Name"]
    parts = [p for p in res.partitions if p.stage == 1]
    assert len(parts) == 4 and sum(p.events for p in parts) == 600
    assert sum(p.witnesses for p in parts) == len(expected)
    res.release()


def test_csv_input(spark, event_files):
    q = CEL_DIR / "test25.cel"
    res = run_distributed(spark, [STOCK], [str(q)], str(event_files["csv"]), "csv")
    assert multiset(res.collect()) == multiset(offline([q], event_files))
    res.release()


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_resubscription_chain_inside_partitions(spark, event_files, fmt):
    qs = [AIR_DIR / "94.xml", AIR_DIR / "LONG_MONOTONIC_INC.xml"]
    expected = offline(qs, event_files)
    assert expected
    res = run_distributed(spark, [STOCK], [str(q) for q in qs], str(event_files[fmt]), fmt,
                          mapping=PARQUET_MAPPING if fmt == "parquet" else None)
    assert len(res.plan.stages) == 1 and res.plan.stages[0].key is not None
    assert multiset(res.collect()) == multiset(expected)
    res.release()


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_resubscription_without_key_runs_in_stages(spark, event_files, fmt):
    qs = [AIR_DIR / "IBMStock.xml", AIR_DIR / "IBM_MSFT_PAIR.xml"]
    expected = offline(qs, event_files)
    assert any(w["stream"] == "IBM_MSFT_PAIR" for w in expected)
    said = []
    res = run_distributed(spark, [STOCK], [str(q) for q in qs], str(event_files[fmt]), fmt,
                          mapping=PARQUET_MAPPING if fmt == "parquet" else None, say=said.append)
    assert [s.key is None for s in res.plan.stages] == [False, True]
    assert "single partition" in said[1]
    assert multiset(res.collect()) == multiset(expected)
    assert res.events == 600  # read once for both stages
    assert [p.stage for p in res.partitions].count(2) == 1
    res.release()


def test_no_key_runs_in_one_partition(spark, event_files, tmp_path):
    q = tmp_path / "rise.cel"
    q.write_text("SELECT * FROM Stock NEXT{$1.Price < $2.Price} Stock PUBLISH Rise")
    said = []
    res = run_distributed(spark, [STOCK], [str(q)], str(event_files["jsonl"]), "jsonl", say=said.append)
    assert res.plan.stages[0].key is None and "single partition" in said[0]
    assert [p.partition for p in res.partitions] == [0]
    assert multiset(res.collect()) == multiset(offline([q], event_files))
    res.release()


def test_bad_records_are_counted_not_fatal(spark, event_files, tmp_path):
    bad = tmp_path / "bad.jsonl"
    good = event_files["jsonl"].read_text().splitlines()
    bad.write_text("\n".join(good[:5] + ['{"stream": "Stock", "Name": "IBM", "Price": "cheap", "Volume": 1, "t1": 9}',
                                         "not json"] + good[5:]) + "\n")
    q = CEL_DIR / "test5.cel"
    res = run_distributed(spark, [STOCK], [str(q)], str(bad), "jsonl")
    assert res.rejected == 2 and res.events == 600
    assert sorted(w for w, _, _ in res.rejected_samples) == ["line 6", "line 7"]
    assert multiset(res.collect()) == multiset(offline([q], event_files))
    res.release()


def test_outputs_jsonl_and_parquet(spark, event_files, tmp_path):
    q = CEL_DIR / "test7.cel"
    expected = offline([q], event_files)
    res = run_distributed(spark, [STOCK], [str(q)], str(event_files["jsonl"]), "jsonl")
    out = tmp_path / "w.jsonl"
    assert write_jsonl(res, out) == len(expected)
    buf = io.StringIO()
    from clients.offline import write_witnesses

    write_witnesses(expected, buf)
    assert sorted(out.read_text().splitlines()) == sorted(buf.getvalue().splitlines())
    written = write_parquet(spark, res, tmp_path / "pq")
    assert written == [str(tmp_path / "pq" / "T7")]
    rows = [r.asDict() for r in spark.read.parquet(written[0]).collect()]
    assert multiset(rows) == multiset(expected)
    res.release()


def test_cli_run_writes_what_cayuga_run_writes(spark, event_files, tmp_path):
    q = CEL_DIR / "test25.cel"
    out = tmp_path / "out.jsonl"
    result = CliRunner().invoke(spark_group, [
        "run", "--query", str(q), "--stream", "Stock(Name string, Price float, Volume int)",
        "--input", str(event_files["parquet"]), "--column", "t0=ts_start", "--column", "t1=ts",
        "--column", "Name=symbol", "--output", str(out)])
    assert result.exit_code == 0, result.output
    assert "hash-partitioned by Stock.Name" in result.output
    assert "600 events" in result.output
    got = [json.loads(line) for line in out.read_text().splitlines()]
    assert multiset(got) == multiset(offline([q], event_files))
    # The shared session was not stopped by the command.
    assert spark.sparkContext.parallelize([1, 2]).count() == 2


def test_cli_run_reports_a_bad_query(spark, event_files, tmp_path):
    q = tmp_path / "bad.cel"
    q.write_text("SELECT * FROM Stok PUBLISH X")
    result = CliRunner().invoke(spark_group, [
        "run", "--query", str(q), "--stream", "Stock(Name string, Price float, Volume int)",
        "--input", str(event_files["jsonl"]), "--output", str(tmp_path / "o.jsonl")])
    assert result.exit_code == 2
    assert "bad.cel" in result.output and "Stok" in result.output


def test_user_functions_are_imported_in_the_executors(spark, event_files, tmp_path, monkeypatch):
    """A configured function (NAME -> module:attribute) runs inside executors;
    its module is shipped the way a cluster job would ship it (addPyFile)."""
    mod = tmp_path / "cayuga_test_udfs.py"
    mod.write_text("def notional(price, volume):\n    return price * volume\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    spark.sparkContext.addPyFile(str(mod))
    q = tmp_path / "big.cel"
    q.write_text("SELECT Name, NOTIONAL(Price_1, Volume_1) AS N1, Price AS P2 "
                 "FROM Stock NEXT{$1.Name = $2.Name AND NOTIONAL($2.Price, $2.Volume) > "
                 "NOTIONAL($1.Price, $1.Volume)} Stock PUBLISH Bigger")
    functions = {"NOTIONAL": ("cayuga_test_udfs:notional", "float")}
    from air.engine.functions import import_functions

    with open(event_files["jsonl"], encoding="utf-8") as fh:
        expected = run_offline([STOCK], [str(q)], fh, "jsonl", functions=import_functions(functions)).witnesses
    assert expected
    res = run_distributed(spark, [STOCK], [str(q)], str(event_files["jsonl"]), "jsonl", functions=functions)
    assert multiset(res.collect()) == multiset(expected)
    res.release()
