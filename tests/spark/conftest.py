"""One local SparkSession for all Spark tests, and event files to run on.

Spark starts slowly, so the session is session-scoped, with the UI off, few
shuffle partitions and a driver JVM tuned for start-up. Event files are
written once per test session in every input format the connector reads.
"""

from __future__ import annotations

import collections
import csv
import json
import random

import pytest

from air.engine import Event
from air.formats import encode_json, witness_dict
from tests.conftest import STOCK


@pytest.fixture(scope="session")
def spark():
    from clients.spark.session import get_session

    session = get_session("local[2]", "cayuga-tests", shuffle_partitions=2, fast_jvm=True,
                          extra={"spark.default.parallelism": "2"})
    yield session
    session.stop()


def runs_stream(seed: int, n: int = 600, names=("IBM", "MSFT", "Dell", "AAPL", "GOOG", "ORCL", "SAP")) -> list[Event]:
    """Stock events with long rising runs (so FOLD queries such as test206 match),
    simultaneous events (gap 0), interval events, and high volumes."""
    rng = random.Random(seed)
    price = {n_: 100.0 for n_ in names}
    t = 1000
    out = []
    for _ in range(n):
        t += rng.choice((0, 0, 1, 2))
        name = rng.choice(names)
        price[name] = round(max(1.0, price[name] + rng.choice((-3.0, 1.0, 1.5, 2.0, 0.5, 0.0))), 1)
        vol = rng.choice((100, 500, 12000, 15000, 20000))
        dur = rng.choice((0, 0, 0, 1, 3))
        out.append(Event("Stock", (name, price[name], vol), t - dur, t))
    return out


def multiset(witnesses) -> collections.Counter:
    """Witnesses as a multiset of canonical JSON texts (numbers compared by value and type)."""
    return collections.Counter(json.dumps(w, sort_keys=True) for w in witnesses)


@pytest.fixture(scope="session")
def events() -> list[Event]:
    return runs_stream(11)


@pytest.fixture(scope="session")
def event_files(tmp_path_factory, events):
    """The same events as JSON lines, CSV (shuffled columns) and Parquet."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    d = tmp_path_factory.mktemp("events")
    jsonl = d / "events.jsonl"
    jsonl.write_text("".join(encode_json(witness_dict("Stock", e, STOCK)) + "\n" for e in events))
    csv_path = d / "events.csv"
    with open(csv_path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["Volume", "t1", "Name", "stream", "t0", "Price"])
        for e in events:
            w.writerow([e.values[2], e.t1, e.values[0], "Stock", e.t0, e.values[1]])
    parquet = d / "events.parquet"
    pq.write_table(pa.table({
        "ts_start": [e.t0 for e in events], "ts": [e.t1 for e in events],
        "symbol": [e.values[0] for e in events], "Price": [e.values[1] for e in events],
        "Volume": [e.values[2] for e in events]}), parquet)
    return {"jsonl": jsonl, "csv": csv_path, "parquet": parquet}
