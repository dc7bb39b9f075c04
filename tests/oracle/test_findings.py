"""Fixed regression cases for what the differential fuzzing found, each run by
the oracle and by both engine builds (the pure-Python one in a child process).

Finding 1 (engine): an expression that failed while evaluating one edge of an
instance (a division by zero in a forward edge's predicate or schema map)
abandoned the instance's remaining forward edges for that event, so a forward
edge that should fire was lost, and the result depended on the order of the
edges in the AIR document. Expected (README: a failing expression makes *that*
predicate false): only the failing edge is not taken.

Finding 1b (a convention both now document, tests/oracle/__init__.py point 5):
a failing *rebind* schema map counts as a false rebind predicate, so no
forward edge fires.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from air.airxml import load_air
from air.engine import Engine
from air.engine import Event as EngineEvent
from air.model import parse_stream_decl
from tests.oracle.test_oracle import STOCK, pairs, schema
from tests.oracle import Event, Oracle, read_air

ROOT = Path(__file__).resolve().parents[2]


def automaton(edges_at_s: str) -> str:
    """START -> S(N, V) whose edges are given; E and F publish Out and Out2."""
    return f"""<NFA>
<Node NodeID="0" NodeType="START" InputStreamName="Stock"><ForwardEdge Destination="S">
 <SchemaMap>{pairs(("EV", "Name", "N"), ("EV", "Volume", "V"))}</SchemaMap></ForwardEdge></Node>
<Node NodeID="S" NodeType="INTERMEDIATE_OR_END" InputStreamName="Stock">{schema(("N", "string"), ("V", "int"))}
 {edges_at_s}</Node>
<Node NodeID="E" NodeType="INTERMEDIATE_OR_END">{schema(("N", "string"), ("P", "float"))}
 <OutputStreamName Name="Out" Type="OUT"/></Node>
<Node NodeID="F" NodeType="INTERMEDIATE_OR_END">{schema(("N", "string"), ("P", "float"))}
 <OutputStreamName Name="Out2" Type="OUT"/></Node></NFA>"""


OK_MAP = f"<SchemaMap>{pairs(('NODE', 'N', 'N'), ('EV', 'Price', 'P'))}</SchemaMap>"
FAILING_MAP = f'<SchemaMap>{pairs(("NODE", "N", "N"))}<UDF Expr="(EV.Price)/(EV.Volume)" Attr="P"/></SchemaMap>'
FAILING_PRED = '<EvalFunc><PredClause><ComplexPred Expr="(EV.Price)/(EV.Volume)&gt;0"/></PredClause></EvalFunc>'
TO_E_FAILING_MAP = f'<ForwardEdge Destination="E">{FAILING_MAP}</ForwardEdge>'
TO_E_FAILING_PRED = f'<ForwardEdge Destination="E">{FAILING_PRED}{OK_MAP}</ForwardEdge>'
TO_F = f'<ForwardEdge Destination="F">{OK_MAP}</ForwardEdge>'
REBIND_FAILING_MAP = (f'<RebindEdge><SchemaMap>{pairs(("NODE", "N", "N"))}'
                      '<UDF Expr="(NODE.V)/(EV.Volume)" Attr="V"/></SchemaMap></RebindEdge>')

# X opens an instance; Y (Volume 0) makes (Price / Volume) fail on the instance's edges
EVENTS = [Event("Stock", ("X", 1.0, 1), 1, 1), Event("Stock", ("Y", 2.0, 0), 2, 2)]

WANT = [("Out2", ("X", 2.0), 1, 2)]
CASES = {
    # the failing edge first or last: either way the other edge fires
    "forward map fails, then an edge that holds": (automaton(TO_E_FAILING_MAP + TO_F), WANT),
    "an edge that holds, then forward map fails": (automaton(TO_F + TO_E_FAILING_MAP), WANT),
    "forward predicate fails, then an edge that holds": (automaton(TO_E_FAILING_PRED + TO_F), WANT),
    "an edge that holds, then forward predicate fails": (automaton(TO_F + TO_E_FAILING_PRED), WANT),
    # finding 1b: a failing rebind map is a false rebind predicate: no forward edge fires
    "rebind map fails": (automaton(REBIND_FAILING_MAP + TO_F), []),
}


def oracle_run(text: str) -> list[tuple]:
    o = Oracle()
    o.declare("Stock", STOCK)
    o.add(read_air(text), owner="q")
    out = [(w.stream, w.values, w.t0, w.t1) for w in o.run(EVENTS)]
    assert o.eval_errors == 1  # Y's failure, counted once
    return out


def engine_run(text: str) -> list[tuple]:
    eng = Engine()
    eng.declare(parse_stream_decl("Stock(Name string, Price float, Volume int)"))
    eng.add(load_air(text), owner="q")
    out = [(em.stream, tuple(em.event.values), em.event.t0, em.event.t1)
           for em in eng.run([EngineEvent(e.stream, e.values, e.t0, e.t1) for e in EVENTS])]
    assert eng.stats.eval_errors == 1
    return out


@pytest.mark.parametrize("name", CASES)
def test_a_failing_edge_costs_only_that_edge(name):
    text, want = CASES[name]
    assert oracle_run(text) == want
    assert engine_run(text) == want


def test_the_pure_python_build_too():
    code = ("import json; from tests.oracle.test_findings import CASES, engine_run; from air.engine import BUILD; "
            "print(json.dumps([BUILD, {n: engine_run(t) for n, (t, _) in CASES.items()}]))")
    env = {k: v for k, v in os.environ.items() if k != "CAYUGA_EXPECT_ENGINE"}
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300,
                       env={**env, "CAYUGA_ENGINE": "python", "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0, r.stderr[-3000:]
    build, got = json.loads(r.stdout)
    assert build == "python"
    assert got == {n: [list(w[:1]) + [list(w[1])] + list(w[2:]) for w in want] for n, (_, want) in CASES.items()}
