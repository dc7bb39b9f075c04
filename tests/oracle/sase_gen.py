"""Random SASE queries and streams, for differential fuzzing of the product's
SASE front end against tests/oracle/sase.py (tests/oracle/test_sase_differential.py).

A query has 2 to 5 components over four streams (the RFID shape of the SASE paper:
a key ``k`` every stream has, small value domains), a negated component in any
gap between positive ones and at the end (then under WITHIN), ANY(...) types,
an equivalence test ``[k]`` or ``[k = c]``, simple and parameterized
predicates (some with OR, some with arithmetic that overflows or divides by
zero: those only where the product accepts them, docs/design/sase.md
#what-is-refused-and-why), a window or none, RETURN or its default.

Streams are totally ordered (the SASE paper's model: distinct ``t1``), or, when the
query has an equivalence test and no negated end, may hold simultaneous events
of different keys (never related by the query). Some events are intervals (``t0 < t1``): SASE
places an event at its ``t1``.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

STREAMS = {
    "A": (("k", "int"), ("v", "int"), ("s", "string")),
    "B": (("k", "int"), ("v", "int"), ("w", "float")),
    "C": (("k", "int"), ("v", "int")),
    "D": (("k", "int"), ("v", "string"), ("w", "float")),
}
#: attribute -> stream -> type
_TYPES = {a: {s: dict(attrs)[a] for s, attrs in STREAMS.items() if a in dict(attrs)}
          for a in ("k", "v", "s", "w")}


@dataclass
class Case:
    seed: int
    text: str
    events: list  # (stream, values, t0, t1)
    equivalence: bool


def _attr_type(types: tuple[str, ...], attr: str) -> str | None:
    """The attribute's type for a component of ``types`` (None: no type has it, or types differ)."""
    found = {_TYPES[attr][t] for t in types if t in _TYPES[attr]}
    return found.pop() if len(found) == 1 else None


def _everyone(types, attr) -> bool:
    return all(t in _TYPES[attr] for t in types) and _attr_type(types, attr) is not None


def _const(rng: random.Random, typ: str) -> str:
    if typ == "int":
        return str(rng.randrange(-1, 6))
    if typ == "float":
        return rng.choice(["0.5", "1.5", "2.5", "1"])
    return rng.choice(["'a'", "'b'", '"a"'])


def query(rng: random.Random) -> tuple[str, bool]:
    n = rng.randint(2, 5)
    negs: set[int] = set()
    for k in range(1, n):
        if k - 1 not in negs and rng.random() < 0.35:
            negs.add(k)
    if len(negs) == n - 1 and n > 1:  # keep at least two positives most of the time
        negs.discard(max(negs))
    window = None if rng.random() < 0.25 and (n - 1) not in negs else rng.choice([3, 6, 10, 15, 15, 40])
    if window is None and (n - 1) in negs:
        window = 8
    comps = []
    for k in range(n):
        if rng.random() < 0.2:
            types = tuple(rng.sample(sorted(STREAMS), 2))
        else:
            types = (rng.choice(sorted(STREAMS)),)
        comps.append((k in negs, types, f"e{k + 1}"))
    pos = [k for k in range(n) if k not in negs]
    parts = []
    equiv = rng.random() < 0.55
    if equiv:
        parts.append(rng.choice(["[k]", "[k]", "[k = 1]"]))

    def ref(k: int, want: str | None = None) -> tuple[str, str] | None:
        cands = [a for a in ("v", "s", "w", "k") if _attr_type(comps[k][1], a) is not None
                 and (want is None or _attr_type(comps[k][1], a) == want)]
        if not cands:
            return None
        a = rng.choice(cands)
        return (f"{comps[k][2]}.{a}" if rng.random() < 0.85 else f"${k + 1}.{a}"), _attr_type(comps[k][1], a)

    for _ in range(rng.randint(0, 3)):  # conditions on positive components
        r = rng.random()
        k = rng.choice(pos)
        x = ref(k)
        if x is None:
            continue
        if r < 0.35:
            op = rng.choice(["=", "!=", "<", ">=", ">"] if x[1] != "string" else ["=", "!="])
            parts.append(f"{x[0]} {op} {_const(rng, x[1])}")
            continue
        j = rng.choice(pos)
        y = ref(j, x[1]) if x[1] != "float" else ref(j, "float") or ref(j, "int")
        if y is None:
            continue
        if r < 0.6 or x[1] == "string":
            parts.append(f"{x[0]} {rng.choice(['<', '=', '!=', '>='])} {y[0]}")
        elif r < 0.75:
            parts.append(f"({x[0]} > {_const(rng, x[1])} OR {y[0]} <= {_const(rng, y[1])})")
        elif r < 0.9:
            parts.append(f"{x[0]} + {y[0]} > {rng.randrange(0, 8)}")
        else:
            parts.append(f"{x[0]} / {y[0]} >= 1")  # y may be 0: the comparison fails, so it is false
    for k in sorted(negs):  # what stops a match
        for _ in range(rng.randint(0, 2)):
            y = ref(k)
            if y is None:
                continue
            before = [p for p in pos if p < k]
            r = rng.random()
            nxt = next((p for p in pos if p > k), None)
            overlap = nxt is not None and set(comps[k][1]) & set(comps[nxt][1])
            if r < 0.5:
                op = rng.choice(["=", "!=", "<", ">"] if y[1] != "string" else ["=", "!="])
                parts.append(f"{y[0]} {op} {_const(rng, y[1])}")
            else:
                x = ref(rng.choice(before), y[1])
                if x is None:
                    continue
                if r < 0.85 or overlap or y[1] == "string":
                    parts.append(f"{y[0]} {rng.choice(['=', '!=', '<'])} {x[0]}")
                else:
                    parts.append(f"{y[0]} - {x[0]} < 2")
    ret = ""
    if rng.random() < 0.6:
        items = []
        for k in rng.sample(pos, min(len(pos), rng.randint(1, 3))):
            attrs = [a for a in ("k", "v", "s", "w") if _everyone(comps[k][1], a)]
            if attrs:
                items.append(f"{comps[k][2]}.{rng.choice(attrs)}")
        nums = [k for k in pos if _everyone(comps[k][1], "v") and _attr_type(comps[k][1], "v") == "int"]
        if len(nums) >= 2 and rng.random() < 0.4:
            a, b = rng.sample(nums, 2)
            items.append(f"{comps[a][2]}.v {rng.choice(['+', '*', '/'])} {comps[b][2]}.v AS calc")
        if items:
            ret = " RETURN " + ", ".join(items)

    def comp_text(neg, types, var):
        body = f"ANY({', '.join(types)}) {var}" if len(types) > 1 else f"{types[0]} {var}"
        return f"!({body})" if neg else body

    text = "EVENT SEQ(" + ", ".join(comp_text(*c) for c in comps) + ")"
    if parts:
        text += " WHERE " + " AND ".join(parts)
    if window is not None:
        text += f" WITHIN {window}"
    # ties only where they can never meet in one partial match: an equivalence test relates
    # every component, and no negated end (its match waits for any later event: docs/design/sase.md)
    return text + ret, equiv and (n - 1) not in negs


def events(rng: random.Random, ties: bool, types: list[str] | None = None) -> list:
    """A stream; most events of ``types`` (the query's), so that matches are common."""
    out = []
    t = rng.randrange(0, 3)
    for _ in range(rng.randint(8, 26)):
        t += rng.choice([1, 1, 2, 3])
        keys = rng.sample([1, 2, 3], rng.choice([1, 1, 2, 3]) if ties else 1)
        for key in keys:
            s = rng.choice(types) if types and rng.random() < 0.8 else rng.choice(sorted(STREAMS))
            vals = []
            for a, typ in STREAMS[s]:
                if a == "k":
                    vals.append(key)
                elif typ == "int":
                    vals.append(rng.randrange(0, 6))
                elif typ == "float":
                    vals.append(rng.choice([0.5, 1.5, 2.5]))
                else:
                    vals.append(rng.choice(["a", "b"]))
            t0 = t - rng.choice([0, 0, 0, 1, 2])
            out.append((s, tuple(vals), t0, t))
    return out


def case(seed: int) -> Case:
    rng = random.Random(seed)
    text, equiv = query(rng)
    types = re.findall(r"\b([ABCD])\b", text.split(" WHERE")[0])
    return Case(seed, text, events(rng, ties=equiv and rng.random() < 0.5, types=types), equiv)


__all__ = ["STREAMS", "Case", "case", "query", "events"]
