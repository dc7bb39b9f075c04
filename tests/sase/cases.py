"""Fixed SASE cases with their matches worked out by hand: the SASE paper's
examples (docs/design/references.md#sase: shoplifting, misplaced inventory,
medication, its Query 1) and one case per rule of docs/design/sase.md#semantics.
The product (tests/sase/test_semantics.py) and the oracle
(tests/oracle/test_sase_oracle.py) must each give exactly these.

A case: streams ``{name: ((attr, type), ...)}``, the query, the stream time
unit in ms, events ``(stream, values, t0, t1)`` in t1 order, and the matches
``(RETURN values, t0, t1)`` as a sorted list.
"""

from __future__ import annotations

from typing import NamedTuple

H = 3_600_000  # an hour in ms


class Case(NamedTuple):
    name: str
    streams: dict
    text: str
    time_unit_ms: float
    events: list
    matches: list


def _ev(stream: str, values: tuple, t1, t0=None):
    return (stream, values, t1 if t0 is None else t0, t1)


RFID = {"SHELF": (("id", "string"), ("shelf_id", "int")), "COUNTER": (("id", "string"),),
        "EXIT": (("id", "string"),)}

SHOPLIFTING = Case(
    "shoplifting (section 2.2)", RFID,
    "EVENT SEQ(SHELF x, !(COUNTER y), EXIT z) WHERE [id] WITHIN 3 hours RETURN x.id, x.shelf_id",
    1.0,
    [_ev("SHELF", ("a", 1), 0), _ev("SHELF", ("a", 2), H // 2), _ev("COUNTER", ("a",), H),
     _ev("EXIT", ("a",), 3 * H // 2),                                  # paid for: no match for a
     _ev("SHELF", ("b", 1), 2 * H), _ev("EXIT", ("b",), 5 * H // 2),     # b: a match
     _ev("SHELF", ("c", 1), 3 * H), _ev("SHELF", ("d", 4), 4 * H),
     _ev("COUNTER", ("x",), 42 * H // 10),                             # another tag's checkout
     _ev("EXIT", ("d",), 5 * H), _ev("EXIT", ("d",), 11 * H // 2),       # d: two exits, two matches
     _ev("EXIT", ("c",), 13 * H // 2)],                                # c: 3.5 h after its shelf
    sorted([(("b", 1), 2 * H, 5 * H // 2), (("d", 4), 4 * H, 5 * H), (("d", 4), 4 * H, 11 * H // 2)]))

MISPLACED = Case(
    "misplaced inventory (section 2.3): a negated end, ANY, an attribute one type lacks", RFID,
    "EVENT SEQ(SHELF x1, SHELF x2, !(ANY(COUNTER, SHELF) x3)) "
    "WHERE [id] AND x1.shelf_id != x2.shelf_id AND x1.shelf_id = x3.shelf_id WITHIN 1 hour "
    "RETURN x1.id, x1.shelf_id AS from_shelf, x2.shelf_id AS to_shelf",
    60_000.0,  # minutes: WITHIN 1 hour is 60, the match is at t = t_x1 + 59
    [_ev("SHELF", ("a", 1), 0), _ev("SHELF", ("b", 1), 5), _ev("SHELF", ("a", 2), 10),
     _ev("SHELF", ("b", 2), 15), _ev("SHELF", ("c", 1), 20), _ev("SHELF", ("c", 2), 25),
     _ev("COUNTER", ("b",), 30),           # b is paid for
     _ev("SHELF", ("c", 1), 40),           # c back at shelf 1 (x3 = SHELF, same shelf as x1): not misplaced
     _ev("COUNTER", ("z",), 70),           # the first event after a's t = 59: a's match reported
     _ev("COUNTER", ("z",), 90)],          # after c's t = 25 + 59 = 84 (c moved from 2 to 1 at 40)
    sorted([(("a", 1, 2), 0, 70), (("c", 2, 1), 25, 90)]))

MEDICATION = Case(
    "medication overdose (section 2.3): [attr = const] and arithmetic",
    {"MED": (("name", "string"), ("medicine", "string"), ("amount", "int"))},
    "EVENT SEQ(MED x1, MED x2) WHERE [name = \"John\"] AND [medicine = \"Antibiotics\"] "
    "AND x1.amount + x2.amount > 1000 WITHIN 4 hours RETURN x1.amount AS first, x2.amount AS second",
    60_000.0,
    [_ev("MED", ("John", "Antibiotics", 600), 0), _ev("MED", ("John", "Antibiotics", 500), 60),
     _ev("MED", ("John", "Aspirin", 900), 70), _ev("MED", ("John", "Antibiotics", 300), 100),
     _ev("MED", ("Mary", "Antibiotics", 800), 110), _ev("MED", ("Mary", "Antibiotics", 800), 120),
     _ev("MED", ("John", "Antibiotics", 700), 250)],
    sorted([((600, 500), 0, 60), ((500, 700), 60, 250)]))

QUERY1 = Case(
    "the paper's Query 1 (section 3.1): two equivalence tests, a simple and a parameterized predicate",
    {"A": (("attr1", "int"), ("attr2", "int"), ("attr3", "string"), ("attr4", "int")),
     "B": (("attr1", "int"), ("attr2", "int")), "C": (("attr1", "int"), ("attr2", "int")),
     "D": (("attr1", "int"), ("attr2", "int"), ("attr4", "int"))},
    "EVENT SEQ(A x1, B x2, !(C x3), D x4) WHERE [attr1, attr2] AND x1.attr3 = '1' AND x1.attr4 < x4.attr4 "
    "WITHIN 6 RETURN x1.attr4 AS a4, x4.attr4 AS d4",
    1.0,
    [_ev("A", (1, 1, "1", 5), 1), _ev("B", (1, 1), 2), _ev("A", (1, 1, "1", 2), 3), _ev("C", (1, 1), 4),
     _ev("D", (1, 1, 9), 5), _ev("B", (1, 1), 6), _ev("D", (1, 1, 3), 7), _ev("A", (1, 2, "1", 0), 8),
     _ev("A", (1, 2, "0", 0), 8.5), _ev("B", (1, 2), 9), _ev("D", (1, 1, 4), 9.5), _ev("D", (1, 2, 1), 11)],
    sorted([((2, 3), 3, 7), ((0, 1), 8, 11)]))

KEYED = {"A": (("k", "int"), ("v", "int")), "B": (("k", "int"), ("v", "int")), "C": (("k", "int"), ("v", "int"))}

OPEN_INTERVAL = Case(
    "a negative event at the time of the event that made the partial match is not between",
    KEYED, "EVENT SEQ(A x, !(B y), C z) WHERE [k] WITHIN 10 RETURN x.k", 1.0,
    [_ev("A", (1, 0), 1), _ev("B", (1, 0), 1), _ev("C", (1, 0), 5),
     _ev("A", (2, 0), 6), _ev("B", (2, 0), 7), _ev("C", (2, 0), 8)],
    [((1,), 1, 5)])

NEGATED_END = Case(
    "a negated end: the match at t = t_x + T - 1, reported at the first event after it",
    KEYED, "EVENT SEQ(A x, !(B y)) WHERE [k] WITHIN 5 RETURN x.k", 1.0,
    [_ev("A", (1, 0), 0), _ev("B", (1, 0), 4),      # t = 4: B at 4 is in (0, 4]
     _ev("A", (2, 0), 10), _ev("B", (2, 0), 15),    # t = 14: B at 15 comes after; it reports the match
     _ev("A", (3, 0), 20), _ev("B", (9, 0), 30)],   # t = 24: reported at 30 (another key's B)
    sorted([((2,), 10, 15), ((3,), 20, 30)]))

LAST_BEFORE_T = Case(
    "a negated end needs the last positive event before t",
    KEYED, "EVENT SEQ(A x, C z, !(B y)) WHERE [k] WITHIN 5 RETURN x.k, z.v", 1.0,
    [_ev("A", (1, 0), 0), _ev("C", (1, 1), 3), _ev("C", (1, 2), 4), _ev("C", (7, 0), 9)],
    [((1, 1), 0, 9)])                               # t = 4: C at 4 is not before it

ALL_MATCHES = Case(
    "all matches: every combination in order within the window, the window strict",
    KEYED, "EVENT SEQ(A x, B y, C z) WITHIN 4 RETURN x.v, y.v, z.v", 1.0,
    [_ev("A", (0, 1), 1), _ev("A", (0, 2), 2), _ev("B", (0, 3), 3), _ev("B", (0, 4), 4), _ev("C", (0, 5), 5)],
    sorted([((2, 3, 5), 2, 5), ((2, 4, 5), 2, 5)]))  # from A at 1, C at 5 is 4 later: outside WITHIN 4

INTERVALS = Case(
    "an interval event counts at its t1",
    KEYED, "EVENT SEQ(A x, C z) WITHIN 10 RETURN x.v, z.v", 1.0,
    [_ev("A", (0, 1), 4, t0=0), _ev("C", (0, 3), 4), _ev("C", (0, 2), 6, t0=2)],
    [((1, 2), 4, 6)])

ANY_MISSING = Case(
    "ANY: a condition on an attribute the event's type lacks holds",
    {"A": (("k", "int"), ("s", "string")), "C": (("k", "int"),), "D": (("k", "int"), ("s", "string"))},
    "EVENT SEQ(ANY(A, C) x, D z) WHERE x.s = z.s AND [k] WITHIN 10 RETURN x.k, z.s", 1.0,
    [_ev("A", (1, "p"), 1), _ev("C", (1,), 2), _ev("D", (1, "q"), 3), _ev("D", (1, "p"), 4)],
    sorted([((1, "q"), 2, 3), ((1, "p"), 1, 4), ((1, "p"), 2, 4)]))

FAILURES = Case(
    "a condition that fails (division by zero) is false; a RETURN value that fails drops the match",
    KEYED, "EVENT SEQ(A x, C z) WHERE x.v / z.v >= 1 WITHIN 10 RETURN 10 / (z.v - 1) AS r", 1.0,
    [_ev("A", (0, 4), 1), _ev("C", (0, 0), 2), _ev("C", (0, 1), 3), _ev("C", (0, 2), 4)],
    [((10,), 1, 4)])

ALL = [SHOPLIFTING, MISPLACED, MEDICATION, QUERY1, OPEN_INTERVAL, NEGATED_END, LAST_BEFORE_T, ALL_MATCHES,
       INTERVALS, ANY_MISSING, FAILURES]
