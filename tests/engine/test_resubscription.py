"""Resubscription: 94.xml publishes the internal stream "94" (a FOLD counting a
rising run after a large trade); LONG_MONOTONIC_INC.xml reads it and keeps runs
longer than 10 quotes. Expected witnesses are worked out by hand below."""

from __future__ import annotations

from air.engine import Event
from tests.conftest import engine_with


def S(name, price, vol, t):
    return Event("Stock", (name, float(price), vol), t, t)


def events():
    evs = [S("IBM", 10, 20000, 1)]                        # large trade: run starts, cnt_n = 1
    evs += [S("IBM", 10 + k, 5, 1 + k) for k in range(1, 11)]  # t=2..11: prices 11..20, cnt = 2..11
    evs.insert(3, S("MSFT", 50, 20000, 3))                # a second run on MSFT, same t as IBM 12
    evs.insert(5, S("MSFT", 51, 5, 4))                    # MSFT run reaches cnt 2 at t=4
    evs += [S("IBM", 19, 5, 12)]                          # the IBM run breaks (19 < 20)
    evs += [S("IBM", 30, 5, 13)]                          # nothing left to extend
    return evs


def test_long_monotonic_run_is_found_through_the_internal_stream():
    eng = engine_with("94.xml", "LONG_MONOTONIC_INC.xml")
    seen = []
    eng.on_emit = seen.append
    emitted_at = {}
    for ev in events():
        eng.feed(ev)
        for em in seen:
            emitted_at.setdefault(id(em), ev.t1)
    eng.flush()
    resub = [(e.event.values[3], e.event.values[4], e.event.t0, e.event.t1) for e in seen if e.stream == "94"]
    # the IBM run emits cnt 2..11 at t=2..11; the MSFT run emits cnt 2 at t=4
    assert sorted(resub) == sorted([(k, "IBM", 1, k) for k in range(2, 12)] + [(2, "MSFT", 3, 4)])
    assert all(e.kind == "RESUB" for e in seen if e.stream == "94")
    final = [e for e in seen if e.stream == "LONG_MONOTONIC_INC"]
    assert [(e.kind, e.event.values, e.event.t0, e.event.t1) for e in final] == [
        ("OUT", ("IBM", 10.0, 20000, 11, "IBM", 20.0, 5), 1, 11)
    ]
    # processed in the same epoch as the event that completed it (t1 = 11)
    assert emitted_at[id(final[0])] == 11
    assert eng.stats.resubscribed == 11


def test_reader_without_publisher_is_refused():
    import pytest

    from air.engine import EngineError

    with pytest.raises(EngineError, match="reads stream '94'"):
        engine_with("LONG_MONOTONIC_INC.xml")


def test_removing_the_publisher_stops_the_chain():
    eng = engine_with("94.xml", "LONG_MONOTONIC_INC.xml")
    eng.remove("94")
    assert [e for e in eng.run(events()) if e.stream == "LONG_MONOTONIC_INC"] == []


def test_the_running_totals_read_after_each_event_or_once_at_the_end_are_the_same():
    """The event loop counts its events, epochs and witnesses in fields of its own and adds them
    to ``stats`` when the totals are read: read after every event, or once at the end, they are
    the same; the resubscribed events count as events, every emission as a witness; totals set
    anew (a restore) go on from what they were given."""
    from air.engine import EngineStats

    every, once = engine_with("94.xml", "LONG_MONOTONIC_INC.xml"), engine_with("94.xml", "LONG_MONOTONIC_INC.xml")
    emitted: list = []
    every.on_emit = emitted.append
    read = []
    for ev in events():
        every.feed(ev)
        once.feed(ev)
        st = every.stats
        read.append((st.events, st.epochs, st.witnesses))
    every.flush()
    once.flush()
    a, b = every.stats, once.stats
    assert (a.events, a.epochs, a.witnesses, a.resubscribed) == (b.events, b.epochs, b.witnesses, b.resubscribed)
    assert a.events == len(events()) + a.resubscribed and a.witnesses == len(emitted) > 0
    assert a.epochs == len({ev.t1 for ev in events()})
    assert read == sorted(read) and read[-1][0] == a.events  # (the flush feeds nothing)
    once.stats = EngineStats(events=5, witnesses=7)
    once.feed(S("IBM", 40, 5, 14))
    assert (once.stats.events, once.stats.witnesses) == (6, 7)
