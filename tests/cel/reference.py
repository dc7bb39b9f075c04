"""The reference for CEL queries' witnesses: the product compiles the query
and writes it out as AIR text; the independent oracle (tests/oracle), which
shares no code with the product, reads that text and runs it.

This replaces an interpreter of the algebra that evaluated the product's own
analysed plan (``air.cel.semantics.analyze``) with the product's own
functions (``FunctionRegistry``): a mistake shared by the analysis and the
engine was invisible to it. What the oracle cannot check from here is the
compiler's translation itself; tests/oracle/test_differential.py checks that
against the original Cayuga compiler's AIR for the whole conformance corpus
(both run by the oracle).
"""

from __future__ import annotations

from collections import Counter

from air.airxml import dump_air
from air.cel import compile_cel
from tests.oracle import Oracle, read_air


def witnesses(text: str, events, streams: dict) -> Counter:
    """The witnesses of ``text``'s last output stream, as a multiset of
    ``(sorted (attribute, value) pairs, t0, t1)``; ``streams`` maps a name to
    the product's StreamSchema (the declared input streams)."""
    q = compile_cel(text, streams)
    o = Oracle()
    for s in streams.values():
        o.declare(s.name, tuple((a.name, a.type) for a in s.attributes))
    for auto in q.automata:
        o.add(read_air(dump_air(auto)), owner="q")
    out = q.outputs[-1]
    found = Counter()
    for w in o.run(events):
        if w.stream == out:
            found[(tuple(sorted(zip((a for a, _ in o.streams[out]), w.values))), w.t0, w.t1)] += 1
    assert o.eval_errors == 0, o.last_eval_error
    return found
