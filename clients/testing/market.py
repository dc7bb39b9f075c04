"""A stock market for tests and benchmarks: the ``Stock`` stream's schema,
seeded event generators, and a few ready-made queries over it (as automata
and as CEL).

Events are :class:`air.engine.Event` records (feed them to an
:class:`air.engine.Engine`, or write them with :func:`write_ticks` for
``cayuga send`` and ``cayuga run``); :func:`stock` makes one event as the JSON
object the server takes. All randomness comes from ``random.Random(seed)``:
the same arguments give the same events.
"""

from __future__ import annotations

import random
from pathlib import Path

from air.engine import Event
from air.expr import Binary, Compare, Literal, Ref
from air.model import (
    Attribute, Automaton, Clause, ComplexAtom, Computed, DynamicAtom, Edge, OutputStream, Predicate, Rename, State,
    StaticAtom, StreamSchema,
)

#: ``Stock(Name string, Price float, Volume int)``, the stream of the examples and benchmarks.
STOCK = StreamSchema("Stock", (Attribute("Name", "string"), Attribute("Price", "float"), Attribute("Volume", "int")))
#: The README's first subscription (and ``cayuga bench server``'s ``rising``): a quote, then
#: the next quote of the same symbol at least 5% higher.
RISING = ("SELECT Name, Price_1 AS Before, Price AS After FROM Stock "
          "NEXT{$1.Name = $2.Name AND $2.Price >= 1.05 * $1.Price} Stock PUBLISH Rising")


def stock(name: str, price: float, volume: int, t0: int, t1: int | None = None) -> dict:
    """One Stock event as the JSON object ``POST /events`` and the TCP port take
    (a point event at ``t0`` unless ``t1`` is given)."""
    return {"stream": "Stock", "t0": t0, "t1": t0 if t1 is None else t1, "Name": name, "Price": price,
            "Volume": volume}


def symbols(k: int) -> list[str]:
    """``k`` distinct symbol names: S00000, S00001, ..."""
    return [f"S{i:05d}" for i in range(k)]


def _ticks(n_symbols: int, events: int, seed: int, move) -> list[Event]:
    """Tick ``t`` (at time ``t``) moves one uniformly chosen symbol's price by
    ``move(price, rng)``; starting prices in [10, 100), volumes in [100, 10000)."""
    rng = random.Random(seed)
    names = symbols(n_symbols)
    price = [10.0 + rng.random() * 90 for _ in names]
    out = []
    for t in range(1, events + 1):
        i = rng.randrange(n_symbols)
        price[i] = move(price[i], rng)
        out.append(Event("Stock", (names[i], price[i], rng.randrange(100, 10000)), t, t))
    return out


def random_walk(n_symbols: int, events: int, seed: int = 1, down: float = 0.01, up: float = 0.015
                ) -> list[Event]:
    """Each tick moves one uniformly chosen symbol's price by a factor in
    [1 - down, 1 + up] (a slight upward drift); tick ``t`` is at time ``t``."""
    return _ticks(n_symbols, events, seed, lambda p, rng: p * (1.0 - down + rng.random() * (down + up)))


def increasing_stream(n_symbols: int, events: int, seed: int = 1) -> list[Event]:
    """Prices that only rise, per symbol; symbols drawn uniformly (the stream
    of :func:`increasing_query`)."""
    return _ticks(n_symbols, events, seed, lambda p, rng: p + (0.01 + rng.random()))


def write_ticks(path: str | Path, events: int, symbols: int, seed: int = 1, down: float = 0.01,
                up: float = 0.015) -> None:
    """A :func:`random_walk` as JSON lines at ``path``, the file ``cayuga send``
    and ``cayuga run`` read (``down == up``: a walk without drift)."""
    with open(path, "w", encoding="utf-8") as f:
        for e in random_walk(symbols, events, seed, down, up):
            name, price, volume = e.values
            f.write(f'{{"stream": "Stock", "t0": {e.t0}, "t1": {e.t1}, "Name": "{name}", '
                    f'"Price": {price!r}, "Volume": {volume}}}\n')


# --------------------------------------------------------------------------- automata over Stock

def _clause(*atoms) -> Predicate:
    return Predicate((Clause(tuple(atoms)),))


def _keep(names) -> tuple:
    return tuple(Rename("NODE", n, n) for n in names)


def increasing_query(symbol: str, length: int = 10) -> Automaton:
    """``length`` consecutive increasing prices of one symbol
    (docs/design/workloads.md#increasing-prices), as in CEL::

        SELECT * FROM FILTER{Name = 'SYM'}(Stock)
          NEXT{Name = 'SYM' ; Price > $1.Price} Stock  ... (length - 1 times)

    States M1..M{length-1} store the first and the last price; every event of
    the symbol affects them (static filter ``Name = 'SYM'``, AN-indexed)."""
    attrs = (Attribute("First", "float"), Attribute("Last", "float"))
    name_is = StaticAtom("Name", "=", symbol)
    rising = DynamicAtom("Price", ">", "Last")
    step_map = (Rename("NODE", "First", "First"), Rename("EV", "Price", "Last"))
    states = [State("0", True, "Stock", forwards=(
        Edge("M1", _clause(name_is), (Rename("EV", "Price", "First"), Rename("EV", "Price", "Last"))),))]
    for i in range(1, length):
        dest = f"M{i + 1}" if i < length - 1 else "E"
        states.append(State(f"M{i}", False, "Stock", attrs, filter=_clause(name_is),
                            forwards=(Edge(dest, _clause(rising), step_map),)))
    states.append(State("E", False, None, attrs, outputs=(OutputStream(f"Up_{symbol}", "OUT"),)))
    return Automaton(tuple(states), f"increasing-{symbol}")


def increasing_cel(symbol: str, length: int = 10) -> str:
    """The CEL text of :func:`increasing_query`: one symbol's ``length`` consecutive increasing prices."""
    text = f"SELECT Price AS First, Price AS Last FROM FILTER{{Name = '{symbol}'}}(Stock)"
    for _ in range(1, length):
        text = (f"SELECT First, Price AS Last FROM ({text})\n"
                f"  NEXT{{$2.Name = '{symbol}' AND $2.Price > $1.Last}} Stock")
    return f"{text}\nPUBLISH Up_{symbol}\n"


def write_queries(directory: str | Path, queries: int, length: int = 10) -> list[Path]:
    """One ``<symbol>.cel`` file of :func:`increasing_cel` for each of the first
    ``queries`` :func:`symbols`, in ``directory``; returns their paths."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    out = []
    for s in symbols(queries):
        p = d / f"{s}.cel"
        p.write_text(increasing_cel(s, length), encoding="utf-8")
        out.append(p)
    return out


def rise_query(factor: float = 1.05) -> Automaton:
    """The next quote of the same symbol at least 5% higher::

        SELECT * FROM Stock NEXT{$2.Name = $1.Name AND $2.Price >= 1.05 * $1.Price} Stock
    """
    a = (Attribute("Name", "string"), Attribute("Price", "float"))
    end = a + (Attribute("Price2", "float"),)
    higher = ComplexAtom(Compare(">=", Ref("Price", "EV"), Binary("*", Literal(factor), Ref("Price", "NODE"))))
    states = (
        State("0", True, "Stock", forwards=(Edge("A", Predicate(), (Rename("EV", "Name", "Name"),
                                                                    Rename("EV", "Price", "Price"))),)),
        State("A", False, "Stock", a, filter=_clause(DynamicAtom("Name", "=", "Name"), higher),
              forwards=(Edge("E", Predicate(), _keep(("Name", "Price")) + (Rename("EV", "Price", "Price2"),)),)),
        State("E", False, None, end, outputs=(OutputStream("Rise", "OUT"),)),
    )
    return Automaton(states, "rise")


def runup_query(min_len: int = 5) -> Automaton:
    """A Kleene run-up: at least ``min_len`` consecutive rising quotes of a symbol::

        SELECT * FROM Stock FOLD{$2.Name = $.Name, $2.Price > $.Price, $.Count >= 4} Stock
    """
    a = (Attribute("Name", "string"), Attribute("First", "float"), Attribute("Last", "float"),
         Attribute("Count", "int"))
    rising = DynamicAtom("Price", ">", "Last")
    step = (Rename("NODE", "Name", "Name"), Rename("NODE", "First", "First"), Rename("EV", "Price", "Last"),
            Computed(Binary("+", Ref("Count", "NODE"), Literal(1)), "Count"))
    states = (
        State("0", True, "Stock", forwards=(Edge("A", Predicate(), (
            Rename("EV", "Name", "Name"), Rename("EV", "Price", "First"), Rename("EV", "Price", "Last"),
            Computed(Literal(1), "Count"))),)),
        State("A", False, "Stock", a, filter=_clause(DynamicAtom("Name", "=", "Name")),
              rebind=Edge("A", _clause(rising), step),
              forwards=(Edge("E", _clause(rising, ComplexAtom(Compare(">=", Ref("Count", "NODE"),
                                                                       Literal(min_len - 1)))), step),)),
        State("E", False, None, a, outputs=(OutputStream("RunUp", "OUT"),)),
    )
    return Automaton(states, "runup")
