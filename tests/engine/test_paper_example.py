"""The worked example of the Cayuga system paper (its Figures 2-4; docs/design/semantics.md#the-running-example).

The automaton of Figure 2 is ``examples/example9.xml``; the six events are
Figure 3; after each event we compare every state's instance set with the
row of Figure 4, and check the single witness.

Figure 4 prints I2 as <Dell, 40, IBM, 40>; Name_n is a copy of e3's Name
(mapping F1 copies e.Name into both Name_1 and Name_n), so the correct value
is Dell: the figure has a typo there.
"""

from __future__ import annotations

from air.airxml import load_air
from air.engine import Engine, Event
from tests.conftest import ROOT, STOCK


def hm(text: str) -> int:
    h, m = map(int, text.split(":"))
    return (h * 60 + m) * 60_000


EVENTS = [
    ("IBM", 90.0, 15000, "9:10"),
    ("IBM", 85.0, 7000, "9:15"),
    ("Dell", 40.0, 11000, "9:17"),
    ("IBM", 81.0, 8000, "9:21"),
    ("MSFT", 25.0, 6000, "9:23"),
    ("IBM", 91.0, 9000, "9:24"),
]

I1_a = (("IBM", 90.0, "IBM", 90.0), hm("9:10"), hm("9:10"))
I1_b = (("IBM", 90.0, "IBM", 85.0), hm("9:10"), hm("9:15"))
I1_c = (("IBM", 90.0, "IBM", 81.0), hm("9:10"), hm("9:21"))
I2 = (("Dell", 40.0, "Dell", 40.0), hm("9:17"), hm("9:17"))
I3 = (("IBM", 90.0, 81.0), hm("9:10"), hm("9:21"))

# Figure 4, one row per event: instances at A and at B after the event.
FIGURE_4 = [
    ([I1_a], []),
    ([I1_b], []),
    ([I1_b, I2], []),
    ([I2, I1_c], [I3]),
    ([I2, I1_c], [I3]),
    ([I2], []),
]


def test_figure_4_every_intermediate_instance_set_and_the_witness():
    auto = load_air((ROOT / "examples" / "example9.xml").read_text())
    witnesses = []
    eng = Engine(on_emit=witnesses.append)
    eng.declare(STOCK)
    eng.add(auto, owner="ex9")
    for (name, price, vol, t), (want_a, want_b) in zip(EVENTS, FIGURE_4):
        eng.feed(Event("Stock", (name, price, vol), hm(t), hm(t)))
        eng.close_epoch()
        inst = eng.instances("ex9")
        assert sorted(inst["0/A"]) == sorted(want_a), f"state A after the event at {t}"
        assert inst["0/B"] == want_b, f"state B after the event at {t}"
        if t != "9:24":
            assert witnesses == [], f"no witness before e6 (at {t})"
    assert [(w.stream, w.kind, w.event.values, w.event.t0, w.event.t1) for w in witnesses] == [
        ("RisingAfterDecline", "OUT", ("IBM", 90.0, 81.0, 91.0), hm("9:10"), hm("9:24"))
    ]


def test_simultaneous_e6_prime_does_not_change_the_result():
    """The paper's simultaneous-event subtlety (docs/design/semantics.md#simultaneity): a
    simultaneous e6' = <IBM, 80, 8000> processed before e6 must not make I3 disappear: both see the same instances."""
    auto = load_air((ROOT / "examples" / "example9.xml").read_text())
    for order in ([("IBM", 80.0, 8000), ("IBM", 91.0, 9000)], [("IBM", 91.0, 9000), ("IBM", 80.0, 8000)]):
        eng = Engine()
        eng.declare(STOCK)
        eng.add(auto, owner="ex9")
        events = [Event("Stock", (n, p, v), hm(t), hm(t)) for n, p, v, t in EVENTS[:5]]
        events += [Event("Stock", vals, hm("9:24"), hm("9:24")) for vals in order]
        got = [(w.event.values, w.event.t0, w.event.t1) for w in eng.run(events)]
        # e6' continues the decline from I1 (80 < 81) and is >= 10 min: a new B
        # instance, which e6 cannot see in the same epoch.
        assert got == [(("IBM", 90.0, 81.0, 91.0), hm("9:10"), hm("9:24"))]
