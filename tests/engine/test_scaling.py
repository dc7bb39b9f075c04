"""Adding and removing one subscription touches its own part of the
network: structural checks (streams, nodes, instances left behind). How its
cost compares against a network 40 times larger is a wall-clock figure:
``cayuga bench scaling`` (clients/bench/scaling.py), not judged here."""

from __future__ import annotations

from collections.abc import Mapping

from air.cel import compile_cel
from air.engine import Engine
from clients.testing import STOCK, increasing_query, symbols

PAIRS = ("SELECT Name, Price_1 AS First, Price AS Second FROM FILTER{{Name = '{s}'}}(Stock) "
         "NEXT{{$1.Name = $2.Name AND $2.Price > $1.Price}} Stock PUBLISH P{s}")


def _cel_network(n: int) -> Engine:
    eng = Engine()
    eng.declare(STOCK)
    for s in symbols(n):
        eng.add(compile_cel(PAIRS.format(s=s), eng.stream_view, name_prefix=s).automata, owner=s)
    return eng


def test_removal_leaves_only_other_owners_streams_and_instances():
    eng = _cel_network(50)
    s = symbols(50)
    eng.remove(s[7])
    assert f"P{s[7]}" not in eng.stream_view and f"P{s[8]}" in eng.stream_view
    assert len(eng.stream_view) == len(eng.streams) == 2 + 49  # DUAL, Stock, 49 outputs
    assert dict(eng.stream_view) == eng.streams


class _NoIteration(Mapping):
    """A stream catalogue that may be probed but not listed (as a server's
    live view of 100K published streams should never be)."""

    def __init__(self, d):
        self.d = d

    def __getitem__(self, k):
        return self.d[k]

    def __iter__(self):
        raise AssertionError("the compiler listed every stream")

    def __len__(self):
        return len(self.d)


def test_compiling_a_query_only_looks_up_the_streams_it_reads():
    q = compile_cel(PAIRS.format(s="IBM"), _NoIteration({"Stock": STOCK}))
    assert q.outputs == ("PIBM",)


def test_increasing_queries_share_nothing_but_the_start_node():
    eng = Engine()
    eng.declare(STOCK)
    for s in symbols(20):
        eng.add(increasing_query(s), owner=s)
    before = eng.plan_stats()["nodes"]
    eng.remove(symbols(20)[3])
    assert eng.plan_stats()["nodes"] == before - 10  # its M1..M9 and E; the start node stays
