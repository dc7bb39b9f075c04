"""Spark as a witness sink: witnesses received from a server over WebSocket
become a DataFrame, or Parquet written by Spark.

:func:`collect_witnesses` watches a subscription (or an output stream) until
it has ``count`` witnesses or nothing arrives for ``idle_timeout`` seconds;
:func:`witnesses_to_dataframe` types them from the stream's schema (asked from
the server, or given); :func:`sink_to_parquet` does both in batches, appending
each batch to a Parquet dataset so a long watch never holds everything in
memory.
"""

from __future__ import annotations

import threading
from typing import Callable, Iterable

from air.model import Attribute, StreamSchema, normalize_type
from clients.client import CayugaClient


def stream_schema(client: CayugaClient, name: str) -> StreamSchema:
    """The schema of a (declared or published) stream, from the server."""
    for s in client.streams():
        if s["name"] == name:
            return StreamSchema(name, tuple(Attribute(a, normalize_type(t)) for a, t in s["schema"].items()))
    raise KeyError(f"the server has no stream {name!r}")


def collect_witnesses(client: CayugaClient, subscription: str | None = None, *, stream: str | None = None,
                      count: int | None = None, idle_timeout: float = 5.0,
                      ready: threading.Event | None = None,
                      on_batch: Callable[[list[dict]], None] | None = None, batch_size: int = 10_000) -> list[dict]:
    """Witnesses from the WebSocket of ``subscription`` (or ``stream``).

    Stops after ``count`` witnesses, or when none came for ``idle_timeout``
    seconds. ``ready`` is set once the WebSocket is open (start sending events
    after it). With ``on_batch`` witnesses are handed over in batches and not
    kept (the return value is then empty)."""
    out: list[dict] = []
    seen = 0
    with client.watch(subscription, stream=stream, timeout=idle_timeout) as matches:
        if ready is not None:
            ready.set()
        try:
            for w in matches:
                out.append(w)
                seen += 1
                if on_batch is not None and len(out) >= batch_size:
                    on_batch(out)
                    out = []
                if count is not None and seen >= count:
                    break
        except TimeoutError:
            pass
    if on_batch is not None and out:
        on_batch(out)
        out = []
    return out


def infer_schema(name: str, witnesses: Iterable[dict]) -> StreamSchema:
    """A schema from witness dicts (used when the server is not asked)."""
    kinds = {bool: "bool", int: "int", float: "float", str: "string"}
    attrs: dict[str, str] = {}
    for w in witnesses:
        for k, v in w.items():
            if k in ("stream", "t0", "t1"):
                continue
            t = kinds.get(type(v), "string")
            if attrs.get(k) == "int" and t == "float":
                attrs[k] = "float"
            else:
                attrs.setdefault(k, t)
    return StreamSchema(name, tuple(Attribute(k, t) for k, t in attrs.items()))


def witnesses_to_dataframe(spark, witnesses: list[dict], schema: StreamSchema | None = None,
                           float_times: bool | None = None):
    """A DataFrame with columns stream, t0, t1 and the stream's attributes.
    Times are longs when every one is a whole number, else doubles, unless
    ``float_times`` decides."""
    from clients.spark.run import witness_struct

    if schema is None:
        if not witnesses:
            raise ValueError("no witnesses and no schema: cannot build a DataFrame")
        schema = infer_schema(witnesses[0]["stream"], witnesses)
    if float_times is None:
        float_times = any(not (type(w["t0"]) is int and type(w["t1"]) is int) for w in witnesses)
    conv = {"float": float, "int": int, "string": str, "bool": bool}
    rows = []
    for w in witnesses:
        t0, t1 = (float(w["t0"]), float(w["t1"])) if float_times else (w["t0"], w["t1"])
        rows.append((w.get("stream", schema.name), t0, t1,
                     *[None if w.get(a.name) is None else conv[a.type](w[a.name]) for a in schema.attributes]))
    return spark.createDataFrame(rows, witness_struct(schema, float_times))


def sink_to_parquet(spark, client: CayugaClient, path: str, subscription: str | None = None, *,
                    stream: str | None = None, count: int | None = None, idle_timeout: float = 5.0,
                    batch_size: int = 10_000, ready: threading.Event | None = None,
                    schema: StreamSchema | None = None) -> int:
    """Watch and append witnesses to the Parquet dataset at ``path``; returns how many."""
    if schema is None:
        name = stream
        if name is None:
            outs = client.subscription(subscription)["outputs"]
            if len(outs) != 1:
                raise ValueError(f"subscription {subscription} has outputs {outs}; name one with stream=")
            name = outs[0]
        schema = stream_schema(client, name)
    written = [0]

    def flush(batch: list[dict]) -> None:
        # Times are always doubles here: batches are appended to one dataset, and a later
        # batch may carry fractional (server-clock) times where an earlier one had whole ones.
        witnesses_to_dataframe(spark, batch, schema, float_times=True).write.mode("append").parquet(path)
        written[0] += len(batch)

    collect_witnesses(client, subscription, stream=stream, count=count, idle_timeout=idle_timeout,
                      ready=ready, on_batch=flush, batch_size=batch_size)
    return written[0]
