"""What the differential test against the oracle's CEL found in the compiler
(tests/oracle/test_cel_differential.py), each as a fixed case with the
witnesses written out by hand, and each failing on the compiler before its fix.

1. ``$1.a`` inside FOLD, for an attribute ``a`` only the first input has and an
   aggregate updates, read the running aggregate (``$.a``), not the first
   input's value (docs/design/semantics.md#decorators-and-renaming: ``$1.a``
   is attribute ``a`` of the first input). The original compiler stored no
   other value of such an attribute; no corpus query reads it.
2. A SELECT column that fails on an event (docs/design/semantics.md
   #arithmetic-and-comparison) dropped that event from the SELECT's output
   only where the compiler computed the column: on a right operand the event
   still consumed the instances waiting for the next event, and a column a
   later SELECT did not keep was never computed. So adding ``PUBLISH`` to a
   sub-query (which compiles it apart) changed the witnesses of the query
   around it. Now the event is not in the SELECT's output wherever it is
   compiled.
"""

from __future__ import annotations

from collections import Counter

import pytest

from air.cel import ShapeCache, compile_cel
from air.cel.shapes import same_compiled
from air.engine import Engine, Event
from tests.cel.corpus import STOCK, STREAMS


def run(text: str, events: list[tuple]) -> dict[str, Counter]:
    q = compile_cel(text, STREAMS)
    cache = ShapeCache()  # as a server compiles it: bound from its shape's compiled form
    cache.compile(text, STREAMS, name_prefix="s1")
    assert same_compiled(cache.compile(text, STREAMS, name_prefix="s2"), compile_cel(text, STREAMS, name_prefix="s2"))
    assert cache.hits == 1
    eng = Engine()
    eng.declare(STOCK)
    eng.add(q.automata, owner="q")
    out: dict[str, Counter] = {}
    for em in eng.run([Event("Stock", values, t, t) for values, t in events]):
        out.setdefault(em.stream, Counter())[(em.event.values, em.event.t0, em.event.t1)] += 1
    return out


def test_dollar_one_of_a_fold_aggregate_is_the_first_inputs_value():
    # cnt starts at 1 and counts the iterations; $1.cnt = 1 holds at every step, so every
    # chain goes on (before: $1.cnt was the running count, and every chain stopped at 2)
    text = "SELECT * FROM (SELECT *, 1 AS cnt FROM Stock) FOLD{$1.cnt = 1, , $.cnt + 1 AS cnt} Stock PUBLISH Out"
    events = [(("IBM", 4.0, v), v) for v in (1, 2, 3, 4)]
    row = lambda first, last: (("IBM", 4.0, first, last - first + 1, "IBM", 4.0, last), first, last)  # noqa: E731
    assert run(text, events)["Out"] == Counter([row(1, 2), row(1, 3), row(1, 4), row(2, 3), row(2, 4),
                                                row(3, 4)])
    # the running count is $.cnt, and cnt in the output
    text = "SELECT * FROM (SELECT *, 1 AS cnt FROM Stock) FOLD{$.cnt < 3, , $.cnt + 1 AS cnt} Stock PUBLISH Out"
    assert run(text, events)["Out"] == Counter([row(1, 2), row(1, 3), row(2, 3), row(2, 4), row(3, 4)])


@pytest.mark.parametrize("publish", ["", " PUBLISH P"])
def test_a_right_operands_failing_column_drops_the_event_before_it_meets_an_instance(publish):
    # the event with Volume 0 is not in (SELECT 10 / Volume ...): the quote at t=1 is followed,
    # in that stream, by the one at t=3 (before: it met t=2, whose column failed, and was gone)
    text = f"SELECT * FROM Stock NEXT (SELECT 10 / Volume AS x FROM Stock{publish}) PUBLISH Out"
    events = [(("IBM", 4.0, 1), 1), (("IBM", 4.0, 0), 2), (("IBM", 4.0, 5), 3)]
    assert run(text, events)["Out"] == Counter([(("IBM", 4.0, 1, 2), 1, 3), (("IBM", 4.0, 0, 2), 2, 3)])


@pytest.mark.parametrize("publish", ["", " PUBLISH Inner"])
def test_a_column_a_later_select_drops_still_drops_the_events_it_fails_on(publish):
    # x fails for the pair (A, B) (B's Volume is 0): that pair is not in the inner SELECT's output,
    # so not in the outer one's, though the outer SELECT does not keep x (before: it was never computed)
    text = f"SELECT Name FROM (SELECT *, 10 / Volume AS x FROM Stock NEXT Stock{publish}) PUBLISH Out"
    events = [(("A", 1.0, 1), 1), (("B", 1.0, 0), 2), (("C", 1.0, 2), 3)]
    assert run(text, events)["Out"] == Counter([(("C",), 2, 3)])
    # on the left of a NEXT (this one was right before: the column is stored): B starts no instance
    text = (f"SELECT Name_1 AS first, Name AS then FROM (SELECT Name, 10 / Volume AS x FROM Stock{publish}) "
            "NEXT Stock PUBLISH Out")
    assert run(text, events)["Out"] == Counter([(("A", "B"), 1, 2)])
