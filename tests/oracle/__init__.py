"""An independent oracle for Cayuga automata: a small, slow interpreter of AIR
that shares nothing with the product (it imports nothing from ``air``,
``server``, ``clients`` or ``bench``; tests/oracle/test_independence.py checks).

Written from the papers (docs/design/references.md) and the design notes
(docs/design/semantics.md, docs/design/air-format.md):

- ``air.py`` reads AIR XML with the standard library into plain automata;
- ``expr.py`` reads and evaluates AIR's expression text (ComplexPred, UDF) and
  holds the built-in functions CONTAINS and SIMILARITY as docs/design/semantics.md#cel defines them;
- ``machine.py`` runs automata over events: epochs, pending instances,
  affected instances deleted at the epoch's end, resubscription in the epoch;
- ``gen.py`` makes random valid AIR automata and streams for differential fuzzing;
- ``cel.py`` and ``celeval.py`` are its own CEL: a reader of the query and a
  direct evaluation of the Cayuga algebra it means (no automaton), so that the
  product's compiler is checked by something that shares neither its code nor
  its construction; ``cel_gen.py`` makes random valid CEL;
- ``sase.py`` is its own SASE, ``sase_gen.py`` random SASE;
- ``regen.py`` writes ``tests/golden/witnesses`` from the oracle
  (``python -m tests.oracle.regen``).

The semantics, literally (docs/design/semantics.md#automata). For each event ``e`` of an epoch (all events
with one ``t1``, plus the witnesses produced in it) and each state reading
``e``'s stream:

- a START state fires each forward edge whose predicate holds;
- at any other state, for each instance ``I`` installed when the epoch began:
  ``e.t0 <= I.t1`` leaves ``I`` alone (overlap); a false filter predicate leaves
  ``I`` alone; otherwise ``I`` is affected (deleted when the epoch ends), the
  rebind edge makes a new instance if its predicate holds — and if it fails no
  forward edge fires — and each forward edge whose predicate holds makes one.
- A new instance takes ``t0`` from ``I`` (from ``e`` on a START edge, and
  ``e.t1`` on a ``Type="DEL"`` edge) and ``t1 = e.t1``; it waits on a pending
  list until the epoch ends. If its state has output streams, one witness per
  stream is emitted at once and queued as an event of the same epoch.

Conventions this oracle follows where the papers and docs/design/semantics.md leave a choice (each
re-derived here from docs/design/semantics.md or the README, not copied from the engine):

1. A non-START state without a ``<FilterEdge>`` has filter predicate TRUE (docs/design/semantics.md#automata
   "TRUE if absent"; the algebra paper, docs/design/references.md#cayugas-algebra-and-indexes,
   would draw FALSE — docs/design/semantics.md is the contract).
2. ``DurationPred Type="EVENT"`` is ``e.t1 - e.t0``; ``Type="COMPOSITE"`` is
   ``e.t1 - I.t0`` (θ4 of the system paper's example, ``e.t1 - A.t0``:
   docs/design/semantics.md#the-running-example), also on a DEL edge (the
   predicate is evaluated before the new instance exists). Durations are
   ``t1 - t0`` (docs/design/semantics.md#data-model), not the algebra paper's
   ``t1 - t0 + 1`` (docs/design/references.md#cayugas-algebra-and-indexes).
3. A StaticPred's ``Const`` is read as the type of the event attribute it is
   compared with (string as is; int as an int if it reads as one, else float).
4. Arithmetic (docs/design/semantics.md#arithmetic-and-comparison): ``int op
   int`` stays int and is exact; ``/`` truncates toward zero; ``%`` takes the
   dividend's sign (C, the original's language); ``^`` of ints with a
   non-negative exponent is an int, otherwise a float (``math.pow``); anything
   with a float is a float (Python's floats are IEEE doubles). An int result
   outside 64 bits, a float result that is not finite, a zero divisor and a
   string or bool operand make the operation fail; comparisons are exact
   between numbers and a type clash otherwise. Unary minus binds tighter than
   ``^``; ``^`` and ``%`` share one level above ``*`` and ``/``. A number
   literal (with its minus sign) or a StaticPred ``Const`` outside 64 bits or
   not finite is refused when the automaton is read or added.
5. An expression that fails (division by zero, a type clash) makes the whole
   edge predicate false for that event (README "Semantics in one paragraph"),
   and only that edge's: the instance's other edges are still evaluated. A
   schema map whose expression fails counts the same way: its edge is not
   taken (no instance), so a failing rebind map, like a false rebind
   predicate, lets no forward edge fire. Both are counted in
   ``Oracle.eval_errors``. A filter predicate that fails leaves the instance
   unaffected. Clauses and atoms are evaluated in document order, stopping at
   the first clause that holds; the engine may order them otherwise (and
   treats an empty clause as TRUE without evaluating the others), so for a
   predicate of several clauses in which an expression fails the result is not
   fixed by docs/design/semantics.md; the fuzzer puts failing expressions only in one-clause
   predicates and in schema maps, where every order gives the same result.
   (Provenance: the README gives only the predicate rule. The schema-map part
   was settled after fuzzing found the engine disagreeing — see
   tests/oracle/test_findings.py — by extending that rule to the edge a map
   belongs to; the engine's code was read then to locate its defect, not to
   copy a convention.)
6. A value stored into a ``float`` attribute from an int becomes a float.
7. A bare name in an expression is the event's attribute if the event has it,
   else the instance's (docs/design/air-format.md).
8. An instance that reaches an end node (no input stream) is not kept: no event
   can ever reach it. A state with output streams and outgoing edges (a
   "partial output", e.g. a nested ``PUBLISH``) emits and keeps its instance.
9. The built-in stream ``DUAL`` (no attributes) is declared from the start
   (README/tests: T15 reads it).
10. Within an epoch the order in which events and resubscribed witnesses are
    processed cannot change the result (every one sees the instances installed
    when the epoch began), so the oracle processes them first-in, first-out.
    Only the epoch order of witnesses is fixed; within an epoch, the witnesses
    of one stream are a multiset.
"""

from tests.oracle.air import Automaton, OracleAirError, read_air
from tests.oracle.machine import Event, Oracle, OracleRunError, Witness

__all__ = ["Automaton", "Event", "Oracle", "OracleAirError", "OracleRunError", "Witness", "read_air"]
