"""The two halves of an engine worker's batches, timed apart (issue 32):
``cayuga bench worker-path``.

The ``increasing`` workload of ``cayuga bench workers`` (``--queries``
per-symbol queries of 10 rising quotes over 1,000 symbols) on one engine worker
(server/workers/worker.py's ``Worker``, run in this process: what it would send
down its results channel is kept), fed batches of ``batch_size`` events as the engine
thread sends them, writing the payloads of its batches of several subscriptions
beside the witness log itself as a server's workers do (server/durability/witside.py).
Then what the main process does with each result: decode it, number, log and
offer its witnesses (server/delivery/witnesses.py, a real witness log in a
temporary directory, no client watching). Prints the CPU seconds of each half
(``time.process_time``; the worker's under the collector settings its process
runs with), the witnesses, the bytes that crossed and the bytes written beside
the log.
"""

from __future__ import annotations

import gc
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

from air.engine.memory import raise_young_threshold
from clients.testing.market import STOCK, increasing_query, increasing_stream, random_walk, symbols
from server.config import Settings
from server.delivery.hub import NotifierHub
from server.delivery.encoding import EncodedBatch
from server.delivery.witnesses import NumberMap, Witnesses
from server.durability.witlog import WitnessLog
from server.observability.counters import Counters
from server.workers import codec
from server.workers.link import worker_settings
from server.workers.worker import Worker

QUERIES = Path(__file__).resolve().parent / "queries"


class _Pipe:
    """What the worker sends, kept (its end of the socket pair and of the results
    channel, in this process)."""

    def __init__(self) -> None:
        self.sent: list[bytes] = []

    def send_bytes(self, data: bytes) -> None:
        self.sent.append(data)

    send = send_bytes  # (server/workers/channel.py's ResultWriter)


def run(queries: int, events: int, n_symbols: int = 1000, batch: int = 1024, seed: int = 1,
        workload: str = "increasing") -> dict:
    """``workload``: ``increasing`` (``queries`` per-symbol queries), or ``rising`` (the README's
    Rising once, over the random walk ``cayuga bench server`` sends; ``queries`` is then 1), which
    also times the loop ``cayuga run`` feeds the same events with (air/engine's feed, witnesses
    encoded a block at a time: clients/offline.py), for the worker's loop beside it."""
    names = symbols(n_symbols)
    old = gc.get_threshold()
    raise_young_threshold()  # as the worker's process and cayuga serve run
    try:
        pipe = _Pipe()
        worker = Worker(pipe, worker_settings(Settings(engine_workers=1)), pipe)
        worker.cmd_declare(STOCK)
        offline = None
        if workload == "rising":
            queries, ticks, outputs = 1, list(random_walk(n_symbols, events, seed)), _rising(worker)
            offline = _offline_loop(ticks)
        else:
            for i in range(queries):
                worker.cmd_add(f"s{i}", (increasing_query(names[i % n_symbols]),))
            outputs = {f"s{i}": {f"Up_{names[i % n_symbols]}"} for i in range(queries)}
            ticks = increasing_stream(n_symbols, events, seed)
        worker.loaded = True  # (as the commands that add mark it: frozen before the first batch)
        # (with their events per stream, as the engine thread sends one worker's batches)
        parts = [ticks[k:k + batch] for k in range(0, events, batch)]
        sent = [codec.encode_batch(k + batch, [], part, Counter(e.stream for e in part))[1:]
                for k, part in zip(range(0, events, batch), parts)]
        with tempfile.TemporaryDirectory(prefix="cayuga-bench-worker-path-") as tmp:
            # the witness log's directory: the worker writes its payloads beside it, as a server's
            # workers do (server/workers/dispatch.py's tell_side_files), then the main half logs them
            worker.cmd_side_files(tmp, 0)
            start = time.process_time()
            for body in sent:
                worker._batch(body)
            worker_s = time.process_time() - start
            worker.side.close()
            side_bytes = sum(f.stat().st_size for f in Path(tmp).glob("side-*.dat"))
            results = [r[1:] for r in pipe.sent]
            main_s, witnesses = _main_side(outputs, results, tmp)
            log_bytes = sum(f.stat().st_size for f in Path(tmp).glob("wit-*.log"))
    finally:
        gc.set_threshold(*old)
        gc.unfreeze()
    return {"benchmark": "worker_path", "workload": workload, "queries": queries, "events": events, "batch": batch,
            "witnesses": witnesses, "result_bytes": sum(map(len, results)), "side_bytes": side_bytes,
            "log_bytes": log_bytes,
            "worker_cpu_s": round(worker_s, 3), "main_cpu_s": round(main_s, 3),
            # the worker's batches by part (Worker.cpu_parts: what /metrics gives of a running one)
            "worker_cpu_parts_s": dict(zip(codec.CPU_PARTS, (round(x, 3) for x in worker.cpu_parts))),
            **({"offline_loop_cpu_s": round(offline[0], 3),
                "offline_loop_parts_s": {k: round(v, 3) for k, v in offline[1].items()}} if offline is not None else {}),
            "worker_events_per_cpu_s": round(events / max(worker_s, 1e-9)),
            "main_events_per_cpu_s": round(events / max(main_s, 1e-9))}


def _rising(worker: Worker) -> dict[str, set[str]]:
    """The README's Rising (clients/bench/queries/rising.cel) on ``worker`` as ``s1``; its outputs."""
    from air.cel import compile_cel

    text = (QUERIES / "rising.cel").read_text(encoding="utf-8")
    compiled = compile_cel(text, {STOCK.name: STOCK}, name_prefix="s1")
    worker.cmd_add("s1", tuple(compiled.automata))
    return {"s1": set(compiled.outputs)}


def _offline_loop(ticks: list) -> tuple[float, dict[str, float]]:
    """CPU seconds of ``cayuga run``'s loop over ``ticks`` (clients/offline.py, ``out`` given): a
    fresh engine with Rising, fed, its witnesses encoded WITNESS_BLOCK at a time; and by part
    (the encoding, timed around each block, and the rest: the engine)."""
    from air.engine import Engine
    from air.formats import encode_emissions
    from clients.offline import WITNESS_BLOCK, fewer_collections, load_engine

    engine: Engine = load_engine([STOCK], [QUERIES / "rising.cel"], freeze=True)[0]
    pending: list = []
    engine.on_emit = pending.append
    feed, schema, clock = engine.feed, engine.schema, time.process_time
    encoding = 0.0
    start = clock()
    with fewer_collections():
        for ev in ticks:
            feed(ev)
            if len(pending) >= WITNESS_BLOCK:
                at = clock()
                encode_emissions(pending, schema, False)
                pending.clear()
                encoding += clock() - at
        engine.flush()
        at = clock()
        encode_emissions(pending, schema, False)
        encoding += clock() - at
    whole = clock() - start
    return whole, {"engine": whole - encoding, "witnesses": encoding}


def _main_side(outputs: dict[str, set[str]], results: list[bytes], tmp: str) -> tuple[float, int]:
    """The main process's CPU for the results: decoded, numbered, logged (no client watches), the
    witness log in ``tmp`` (where the worker wrote its payloads)."""

    class Sub:  # what Witnesses asks of a subscription: its output streams
        def __init__(self, outputs: set[str]) -> None:
            self.outputs = outputs

    subs = {sid: Sub(out) for sid, out in outputs.items()}
    log = WitnessLog(tmp)
    wit = Witnesses(lambda _s: None, NotifierHub(), Counters(), subs, threading.Event(), lambda: 0)
    wit.open(log)
    known = NumberMap()  # (the worker's numbers, as the engine thread keeps them: server/workers/dispatch.py)
    try:
        start = time.process_time()
        for body in results:
            out = codec.decode_result(body)
            wit.deliver_columns(out[9], known)
            wit.deliver_encoded(EncodedBatch(out[1], out[2]))
        return time.process_time() - start, log.appended
    finally:
        log.close()
