"""The two halves of an engine worker's batches, timed apart (issue 32):
``cayuga bench worker-path``.

The ``increasing`` workload of ``cayuga bench workers`` (``--queries``
per-symbol queries of 10 rising quotes over 1,000 symbols) on one engine worker
(server/workers/worker.py's ``Worker``, run in this process: what it would send
down its results channel is kept), fed batches of ``batch_size`` events as the engine
thread sends them. Then what the main process does with each result: decode
it, number, log and offer its witnesses (server/delivery/witnesses.py, a real
witness log in a temporary directory, no client watching). Prints the CPU
seconds of each half (``time.process_time``; the worker's under the collector
settings its process runs with), the witnesses, and the bytes that crossed.
"""

from __future__ import annotations

import gc
import tempfile
import threading
import time
from collections import Counter

from air.engine.memory import raise_young_threshold
from clients.testing.market import STOCK, increasing_query, increasing_stream, symbols
from server.config import Settings
from server.delivery.hub import NotifierHub
from server.delivery.encoding import EncodedBatch
from server.delivery.witnesses import NumberMap, Witnesses
from server.durability.witlog import WitnessLog
from server.observability.counters import Counters
from server.workers import codec
from server.workers.link import worker_settings
from server.workers.worker import Worker


class _Pipe:
    """What the worker sends, kept (its end of the socket pair and of the results
    channel, in this process)."""

    def __init__(self) -> None:
        self.sent: list[bytes] = []

    def send_bytes(self, data: bytes) -> None:
        self.sent.append(data)

    send = send_bytes  # (server/workers/channel.py's ResultWriter)


def run(queries: int, events: int, n_symbols: int = 1000, batch: int = 1024, seed: int = 1) -> dict:
    names = symbols(n_symbols)
    old = gc.get_threshold()
    raise_young_threshold()  # as the worker's process and cayuga serve run
    try:
        pipe = _Pipe()
        worker = Worker(pipe, worker_settings(Settings(engine_workers=1)), pipe)
        worker.cmd_declare(STOCK)
        for i in range(queries):
            worker.cmd_add(f"s{i}", (increasing_query(names[i % n_symbols]),))
        worker.loaded = True  # (as the commands that add mark it: frozen before the first batch)
        ticks = increasing_stream(n_symbols, events, seed)
        # (with their events per stream, as the engine thread sends one worker's batches)
        parts = [ticks[k:k + batch] for k in range(0, events, batch)]
        sent = [codec.encode_batch(k + batch, [], part, Counter(e.stream for e in part))[1:]
                for k, part in zip(range(0, events, batch), parts)]
        start = time.process_time()
        for body in sent:
            worker._batch(body)
        worker_s = time.process_time() - start
        results = [r[1:] for r in pipe.sent]
        main_s, witnesses = _main_side(queries, names, results)
    finally:
        gc.set_threshold(*old)
        gc.unfreeze()
    return {"benchmark": "worker_path", "queries": queries, "events": events, "batch": batch,
            "witnesses": witnesses, "result_bytes": sum(map(len, results)),
            "worker_cpu_s": round(worker_s, 3), "main_cpu_s": round(main_s, 3),
            "worker_events_per_cpu_s": round(events / max(worker_s, 1e-9)),
            "main_events_per_cpu_s": round(events / max(main_s, 1e-9))}


def _main_side(queries: int, names: list[str], results: list[bytes]) -> tuple[float, int]:
    """The main process's CPU for the results: decoded, numbered, logged (no client watches)."""

    class Sub:  # what Witnesses asks of a subscription: its output streams
        def __init__(self, outputs: set[str]) -> None:
            self.outputs = outputs

    subs = {f"s{i}": Sub({f"Up_{names[i % len(names)]}"}) for i in range(queries)}
    with tempfile.TemporaryDirectory(prefix="cayuga-bench-worker-path-") as tmp:
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
