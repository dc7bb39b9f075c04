"""SASE queries through the Spark connector: a query with an equivalence test is
hash-partitioned by that attribute (the key is found through the union stream's
automata); with a negated end the main automaton runs in one partition (its match
waits for any later event), after its republishers; both give what ``cayuga run``
gives, as multisets."""

from __future__ import annotations

import pytest

from clients.offline import run_offline
from clients.spark.run import run_distributed
from tests.conftest import STOCK
from tests.spark.conftest import multiset

QUERIES = {
    "keyed": ("EVENT SEQ(Stock a, !(Stock d), Stock b) WHERE [Name] AND d.Price < a.Price "
              "AND b.Price > a.Price WITHIN 20 RETURN a.Name, a.Price AS lo, b.Price AS hi",
              ["stage 1/1 [keyed] reads Stock: hash-partitioned by Stock.Name"]),
    "negated_end": ("EVENT SEQ(Stock a, Stock b, !(Stock d)) WHERE [Name] AND b.Price > a.Price "
                    "AND d.Price > b.Price WITHIN 6 RETURN a.Name, b.Price AS top",
                    ["stage 1/2 [negated_end] reads Stock: hash-partitioned by Stock.Name",
               "stage 2/2 [negated_end] reads negated_end__u: single partition (no attribute is required equal "
               "to the first event's value at every state)"]),
}


@pytest.mark.parametrize("name", sorted(QUERIES))
def test_sase_in_spark_equals_cayuga_run(spark, event_files, tmp_path, name):
    text, how = QUERIES[name]
    q = tmp_path / f"{name}.sase"
    q.write_text(text)
    with open(event_files["jsonl"], encoding="utf-8") as fh:
        expected = run_offline([STOCK], [str(q)], fh, "jsonl").witnesses
    assert expected
    said = []
    res = run_distributed(spark, [STOCK], [str(q)], str(event_files["jsonl"]), "jsonl", say=said.append)
    assert multiset(res.collect()) == multiset(expected)
    assert said == how
    res.release()
