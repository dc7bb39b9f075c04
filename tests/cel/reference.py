"""The reference for CEL queries' witnesses: the oracle's CEL
(tests/oracle/cel.py, tests/oracle/celeval.py), a front end of its own that
shares no code with the product: it reads the query and evaluates the Cayuga
algebra it means directly over the events, without the product's compiler
and without automata.

(Before, this compiled the query with the product's compiler and had the AIR
oracle run the automata: what the compiler got wrong was invisible here.
tests/oracle/test_cel_differential.py compares the two front ends on random
queries and the whole corpus.)
"""

from __future__ import annotations

from collections import Counter

from tests.oracle.celeval import Cel


def witnesses(text: str, events, streams: dict) -> Counter:
    """The witnesses of ``text``'s output stream, as a multiset of
    ``(sorted (attribute, value) pairs, t0, t1)``; ``streams`` maps a name to
    the product's StreamSchema (the declared input streams)."""
    decl = {s.name: tuple((a.name, a.type) for a in s.attributes) for s in streams.values()}
    cel = Cel(text, decl)
    names = [n for n, _ in cel.schema]
    found = Counter()
    for (values, t0, t1), n in cel.run([(e.stream, tuple(e.values), e.t0, e.t1) for e in events])[None].items():
        found[(tuple(sorted(zip(names, values))), t0, t1)] += n
    assert cel.errors == 0, cel.last_error
    return found
