"""Partition-key inference and stage planning (pure: no Spark)."""

from __future__ import annotations


import pytest

from air.cel import compile_cel
from air.model import parse_stream_decl
from air.partitioning import Owned, check_key, constant_route, infer_key, plan_stages
from tests.conftest import CEL_DIR, STOCK, air

TRADE = parse_stream_decl("Trade(Sym string, Qty int)")
SCHEMAS = {"Stock": STOCK, "Trade": TRADE}


def cel(text: str):
    return list(compile_cel(text, SCHEMAS, name_prefix="q").automata)


def conformance(name: str):
    return list(compile_cel((CEL_DIR / f"{name}.cel").read_text(), SCHEMAS, name_prefix=name).automata)


@pytest.mark.parametrize("name", ["test5", "test7", "test25", "test206", "test1000"])
def test_key_found_for_conformance_queries(name):
    key = infer_key(conformance(name), SCHEMAS)
    assert key is not None and key.as_dict() == {"Stock": "Name"}


def test_stateless_query_takes_any_attribute():
    # test4 is a pure filter: every partitioning is correct; the first attribute is chosen.
    assert infer_key(conformance("test4"), SCHEMAS).as_dict() == {"Stock": "Name"}


def test_key_across_two_streams():
    autos = cel("SELECT * FROM Stock NEXT{$1.Name = $2.Sym} Trade PUBLISH Filled")
    assert infer_key(autos, SCHEMAS).as_dict() == {"Stock": "Name", "Trade": "Sym"}


def test_key_carried_through_renames_and_fold():
    # Name -> Name_1 at the start edge; the FOLD filter compares the running $.Name.
    autos = cel("SELECT * FROM (SELECT Name AS N, Price AS P FROM Stock) NEXT{$1.N = $2.Name} Stock "
                "FOLD{$2.Name = $.Name, $2.Price > $.Price, } Stock PUBLISH X")
    assert infer_key(autos, SCHEMAS).as_dict() == {"Stock": "Name"}


@pytest.mark.parametrize("query", [
    "SELECT * FROM Stock NEXT{$1.Price < $2.Price} Stock PUBLISH X",            # no equality
    "SELECT * FROM Stock NEXT{$1.Name = $2.Name OR $2.Price > 100} Stock PUBLISH X",  # one clause lacks it
    "SELECT * FROM Stock NEXT{$1.Name = $2.Name} Stock NEXT{$1.Price = $2.Price} Stock PUBLISH X",  # not the same key
    "SELECT * FROM Stock NEXT{$1.Name != $2.Name} Stock PUBLISH X",             # inequality
    "SELECT * FROM Stock NEXT{$1.Volume = $2.Qty} Trade NEXT{$1.Name = $2.Name} Stock PUBLISH X",  # key changes
])
def test_key_not_found(query):
    assert infer_key(cel(query), SCHEMAS) is None


def test_equality_with_a_later_value_is_not_a_key():
    # The third state compares with Price_1 of the *second* event: Name holds, Price does not.
    autos = cel("SELECT * FROM Stock NEXT{$1.Name = $2.Name} Stock NEXT{$1.Price = $2.Price} Stock PUBLISH X")
    assert not check_key(autos, {"Stock": "Name"})
    assert not check_key(autos, {"Stock": "Price"})


def test_resubscription_chain_carrying_the_key_is_one_keyed_stage():
    queries = [Owned("94", (air("94.xml"),)), Owned("LONG_MONOTONIC_INC", (air("LONG_MONOTONIC_INC.xml"),))]
    plan = plan_stages(queries, {"Stock": STOCK})
    assert len(plan.stages) == 1
    assert plan.stages[0].key.as_dict() == {"Stock": "Name"}
    assert plan.stages[0].inputs == ("Stock",)


def test_chain_without_key_runs_as_successive_stages():
    queries = [Owned("IBMStock", (air("IBMStock.xml"),)), Owned("IBM_MSFT_PAIR", (air("IBM_MSFT_PAIR.xml"),))]
    plan = plan_stages(queries, {"Stock": STOCK})
    assert [s.inputs for s in plan.stages] == [("Stock",), ("IBMStock", "Stock")]
    assert plan.stages[0].key is not None  # the stateless filter partitions freely
    assert plan.stages[1].key is None and "node 3" in plan.stages[1].reason
    assert "single partition" in plan.describe()


def test_nested_publish_in_one_cel_query():
    autos = cel("SELECT * FROM (SELECT Name, Price FROM FILTER{Price > 10}(Stock) PUBLISH Cheap) "
                "NEXT{$1.Name = $2.Name} Stock PUBLISH Pair")
    plan = plan_stages([Owned("q", tuple(autos))], SCHEMAS)
    assert len(plan.stages) == 1 and plan.stages[0].key.as_dict() == {"Stock": "Name"}


@pytest.mark.parametrize("name", ["test3", "test201", "test207"])
def test_constant_route_of_one_symbol_queries(name):
    route = constant_route(conformance(name), SCHEMAS)
    assert route is not None and route.as_dict() == {"Stock": "Name"} and route.value == "IBM"


@pytest.mark.parametrize("text", [
    "SELECT * FROM Stock NEXT{$1.Name = $2.Name} Stock PUBLISH A",  # a key, no constant
    # the second state reads every event, not only IBM's
    "SELECT * FROM FILTER{Name = 'IBM'}(Stock) NEXT{$2.Price > $1.Price} Stock PUBLISH B",
    # two constants: no single group holds the query
    "SELECT * FROM FILTER{Name = 'IBM'}(Stock) NEXT{$2.Price > $1.Price} FILTER{Name = 'MSFT'}(Stock) PUBLISH C",
    "SELECT * FROM FILTER{Name = 'IBM' OR Price > 5}(Stock) PUBLISH D",  # a clause without the constant
])
def test_no_constant_route(text):
    assert constant_route(cel(text), SCHEMAS) is None
