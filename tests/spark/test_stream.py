"""``cayuga spark stream`` on a real local Spark: the witnesses equal
``cayuga run``'s (clients/offline.py, which shares no code with the streaming
path) as multisets, over files that arrive in several batches; late events
are written out with their reason; the plan is the one printed."""

from __future__ import annotations

import io
import json

import pytest

from air.formats import encode_json, witness_dict
from clients.offline import run_offline
from clients.spark.stream import StreamError, file_source, read_output, start_stream
from tests.conftest import AIR_DIR, CEL_DIR, STOCK
from tests.spark.conftest import multiset


def _lines(events) -> str:
    return "".join(encode_json(witness_dict("Stock", e, STOCK)) + "\n" for e in events)


def offline(queries, events) -> list[dict]:
    return run_offline([STOCK], [str(q) for q in queries], io.StringIO(_lines(events)), "jsonl").witnesses


def run_in_batches(spark, tmp_path, queries, chunks, *, lateness=1000.0, key_groups=4, column_groups=None,
                   fmt="jsonl", flush=True, output_format="jsonl"):
    """Drop ``chunks`` into an input directory one file at a time, each followed
    by an ``--available-now`` run on the same checkpoint (the last one with
    ``--flush-at-end``); returns (witness dicts, late dicts, plan lines)."""
    inp, out, ck = tmp_path / "in", tmp_path / "out", tmp_path / "ck"
    inp.mkdir()
    said: list[str] = []
    for i, chunk in enumerate(chunks):
        tmp = tmp_path / f"part-{i:03d}.{fmt}"
        if fmt == "jsonl":
            tmp.write_text(_lines(chunk))
        else:
            import pyarrow as pa
            import pyarrow.parquet as pq

            pq.write_table(pa.table({"ts": [e.t1 for e in chunk], "ts_start": [e.t0 for e in chunk],
                                     "symbol": [e.values[0] for e in chunk], "Price": [e.values[1] for e in chunk],
                                     "Volume": [e.values[2] for e in chunk]}), tmp)
        tmp.rename(inp / tmp.name)  # whole files only: the source must never see half a file
        df, lines = file_source(spark, str(inp), fmt)
        from clients.spark.io import ColumnMapping

        mapping = None if fmt == "jsonl" else ColumnMapping(t0="ts_start", t1="ts", attributes={"Name": "symbol"})
        job = start_stream(df, [STOCK], [str(q) for q in queries], output=str(out), checkpoint=str(ck),
                           output_format=output_format, lines_format=lines, mapping=mapping,
                           lateness=lateness, available_now=True,
                           flush_at_end=flush and i == len(chunks) - 1, key_groups=key_groups,
                           column_groups=column_groups, say=said.append)
        job.query.awaitTermination(timeout=240)
        assert not job.query.isActive, "an --available-now run did not end"
        assert job.query.exception() is None
    if output_format == "parquet":
        got = [r.asDict() for d in sorted(out.iterdir()) if not d.name.startswith("_")
               for r in spark.read.parquet(str(d)).drop("batch").collect()]
        late_dir = out / "_late"
        late = [json.loads(r.value) for r in spark.read.text(str(late_dir)).collect()] if late_dir.exists() else []
        return got, late, said
    got = [json.loads(x) for x in read_output(spark, str(out))]
    late = [json.loads(x) for x in read_output(spark, str(out), kind="late")]
    return got, late, said


def thirds(events):
    n = len(events)
    return [events[: n // 3], events[n // 3: 2 * n // 3], events[2 * n // 3:]]


def test_keyed_query_over_three_arrivals_of_parquet_files_to_parquet(spark, events, tmp_path):
    """Parquet in (renamed columns), Parquet out: OUTPUT/T5/batch=<id>, times as doubles."""
    q = CEL_DIR / "test5.cel"
    expected = [{**w, "t0": float(w["t0"]), "t1": float(w["t1"])} for w in offline([q], events)]
    got, late, said = run_in_batches(spark, tmp_path, [q], thirds(events), fmt="parquet", output_format="parquet")
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["T5"]
    assert said[1] == "[test5] row scaling: hash-partitioned by Stock.Name into groups 0-3"
    assert late == []
    assert len(got) == len(expected) and multiset(got) == multiset(expected)


def test_constant_routes_column_groups_and_resubscription_chains(spark, events, tmp_path):
    """One job with every kind of unit: a keyed resubscription chain (row
    scaling), queries routed by their constant, two unkeyed queries and a
    chain that spark run needs two stages for (column groups)."""
    qs = [AIR_DIR / "94.xml", AIR_DIR / "LONG_MONOTONIC_INC.xml"]
    for sym in ("IBM", "MSFT", "Dell"):
        q = tmp_path / f"pair_{sym}.cel"
        q.write_text(f"SELECT Price_1 AS P1, Price AS P2 FROM (FILTER{{Name='{sym}'}}(Stock)) "
                     f"NEXT{{$2.Price > $1.Price}} (FILTER{{Name='{sym}'}}(Stock)) PUBLISH Pair_{sym}")
        qs.append(q)
    rise = tmp_path / "rise.cel"
    rise.write_text("SELECT * FROM Stock NEXT{$1.Price < $2.Price} Stock PUBLISH Rise")
    vol = tmp_path / "vol.cel"
    vol.write_text("SELECT Name, Volume FROM Stock NEXT{$2.Volume > 2 * $1.Volume} Stock PUBLISH Vol")
    qs += [rise, vol, AIR_DIR / "IBMStock.xml", AIR_DIR / "IBM_MSFT_PAIR.xml"]
    expected = offline(qs, events)
    streams = {w["stream"] for w in expected}
    assert {"Pair_IBM", "Pair_MSFT", "Pair_Dell", "Rise", "Vol", "IBM_MSFT_PAIR"} <= streams
    assert len(streams) == 8  # and IBMStock, and the keyed chain's output
    got, late, said = run_in_batches(spark, tmp_path, qs, thirds(events), key_groups=8)
    assert said[0].startswith("5 unit(s), 19 group(s) in the state store; 8 key group(s) and 3 column group(s)")
    assert said[1] == "[94, LONG_MONOTONIC_INC] row scaling: hash-partitioned by Stock.Name into groups 0-7"
    assert said[2].startswith("[pair_IBM, pair_MSFT, pair_Dell] routed by the constant of Stock.Name (pair_IBM: "
                              "'IBM' -> group ")
    assert said[3].startswith("[rise] column group 1/3, group 16: every event (no key: ")
    assert said[4].startswith("[vol] column group 2/3, group 17")
    assert said[5].startswith("[IBMStock, IBM_MSFT_PAIR] column group 3/3, group 18: every event (no key: "
                              "resubscription needs 2 stages in spark run")
    assert late == []
    for name in sorted(streams):
        assert multiset(w for w in got if w["stream"] == name) == multiset(w for w in expected if w["stream"] == name)
    assert len(got) == len(expected)


def test_late_events_are_written_with_the_reason(spark, events, tmp_path):
    """With no lateness, an event older than what its group already ran is late:
    it goes to OUTPUT/kind=late with the reason, and the witnesses are those of
    `cayuga run` over the events that were on time."""
    q = CEL_DIR / "test5.cel"
    first, second = events[:300], events[300:]
    stale = [e for e in first[:150] if e.values[0] == "IBM"][:3]
    assert len(stale) == 3
    got, late, _ = run_in_batches(spark, tmp_path, [q], [first, second + stale], lateness=0.0)
    assert sorted(x["event"]["t1"] for x in late) == sorted(e.t1 for e in stale)
    assert all("before" in x["reason"] and "raise --lateness" in x["reason"] for x in late)
    assert multiset(got) == multiset(offline([q], first + second))


def test_key_groups_are_fixed_at_the_first_start(spark, tmp_path):
    """Another --key-groups on a restart is refused with the reason, not silently used
    (the groups' state is where the first start's hashing put it)."""
    (tmp_path / "in").mkdir()
    q = [str(CEL_DIR / "test5.cel")]
    df, lines = file_source(spark, str(tmp_path / "in"), "jsonl")
    job = start_stream(df, [STOCK], q, output=str(tmp_path / "out"), checkpoint=str(tmp_path / "ck"),
                       lines_format=lines, available_now=True, key_groups=4)
    job.query.awaitTermination(timeout=240)
    assert not job.query.isActive
    with pytest.raises(StreamError, match="key groups are fixed at the first start: the checkpoint .* has 4, not 8"):
        start_stream(df, [STOCK], q, output=str(tmp_path / "out"), checkpoint=str(tmp_path / "ck"),
                     lines_format=lines, available_now=True, key_groups=8)
    other = tmp_path / "other.cel"
    other.write_text((CEL_DIR / "test5.cel").read_text())
    with pytest.raises(StreamError, match="belongs to a job with the queries"):
        start_stream(df, [STOCK], [str(other)], output=str(tmp_path / "out"), checkpoint=str(tmp_path / "ck"),
                     lines_format=lines, available_now=True)
