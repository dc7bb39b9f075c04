"""The main process's half of each event on its way to an engine worker, timed
step by step (issue 32): ``cayuga bench ingest-path``.

What a TCP receiver thread and the engine thread of ``cayuga serve`` do with
each block of ``cayuga send``'s ticks, in this process, with the shipped
settings: the bound on its values' length (:func:`server.ingest.connection.value_bound`),
its lines decoded (:class:`air.formats.JsonDecoder`, the receiver's decoder),
the client limits applied (:func:`server.ingest.limits.refusals`, with the
``max_future`` horizon), the block queued (:meth:`DelayQueue.put_batch`: one
journal record, appended to a real journal in a temporary directory at
``durability: fsync``, its flusher syncing behind), then taken out in batches
of ``batch_size`` (:meth:`DelayQueue.get_batch`), counted per stream and
encoded as a worker's ``B`` message (:func:`server.workers.codec.encode_batch`).
At the end the journal is read back as a recovery reads it
(:meth:`Journal.replay`: ``replay_us_per_event``, ``journal_bytes_per_event``).
Sockets, the acknowledgements and the witnesses' way back are not in it
(``cayuga bench worker-path`` times the results' half).

Each step's CPU is this thread's (``time.thread_time``: not the journal's
flusher), per event; ``events_per_core_s`` is what one core doing only this
half would let through: a ceiling on the events a second the main process can
hand to any number of workers, whatever they do with them.

``--crossed`` times stage 1 of the receivers' plan (docs/design/receivers.md):
each block's events, decoded and limited as a reader in a process of its own
would, cross as a put's request does (:func:`server.ingest.remote.put_request`:
the journal's columns; ``reader_encode``: that process's CPU, not the main
process's), and the main process makes them again (``crossed_decode``) and
queues those, its journal record the columns' bytes as they came.
``main_us_per_event`` is then the main process's part: the crossing's decode in
place of the lines' decode and the limits.
"""

from __future__ import annotations

import gc
import tempfile
import time
from collections import Counter
from pathlib import Path

from air.engine.convert import stream_counts
from air.engine.memory import raise_young_threshold
from air.formats import make_decoder
from clients.testing.market import STOCK, write_ticks
from server.config import Settings
from server.durability.journal import Journal
from server.ingest.connection import RECV_BYTES, value_bound
from server.ingest.intake import Lines
from server.ingest.limits import refusals
from server.ingest.queue import DelayQueue
from server.ingest.remote import put_of, put_request
from server.workers import codec

STEPS = ("decode", "limits", "queue_and_journal", "take", "encode")
#: The steps of ``--crossed``: a reader process's encoding of each block, the main process's decoding of it.
CROSSED = ("reader_encode", "crossed_decode")
#: What stays in the main process once a reader in its own process decodes and limits the lines.
MAIN_CROSSED = ("crossed_decode", "queue_and_journal", "take", "encode")



def blocks_of(data: bytes, size: int = RECV_BYTES) -> list[bytes]:
    """``data`` cut after a newline at most every ``size`` bytes, as one read of
    ``cayuga send``'s writes brings its lines to a receiver."""
    out, i = [], 0
    while i < len(data):
        j = data.rfind(b"\n", i, i + size) + 1 or len(data)
        out.append(data[i:j])
        i = j
    return out


def run(events: int = 500_000, n_symbols: int = 1000, seed: int = 1, crossed: bool = False) -> dict:
    st = Settings()
    with tempfile.TemporaryDirectory(prefix="cayuga-bench-ingest-path-") as tmp:
        path = Path(tmp) / "ticks.jsonl"
        write_ticks(path, events, n_symbols, seed)
        blocks = blocks_of(path.read_bytes())
        old = gc.get_threshold()
        raise_young_threshold()  # as cayuga serve runs
        journal = Journal(Path(tmp) / "journal", st.durability, st.journal_segment_bytes,
                          sync_interval=st.journal_sync_ms / 1000)
        try:
            spent, taken, sent_bytes = _through(blocks, st, journal, crossed)
            records, journal_bytes = journal.records, journal.bytes
            start = time.thread_time()
            replayed = sum(len(r.events) for r in journal.replay(0))  # as a recovery reads it back
            replay = time.thread_time() - start
            if replayed != events:
                raise RuntimeError(f"the journal gave back {replayed} of {events} ticks")
        finally:
            journal.close()
            gc.set_threshold(*old)
    total = sum(spent[k] for k in STEPS)
    out = {"benchmark": "ingest_path", "events": events, "blocks": len(blocks), "journal_records": records,
           "journal_bytes_per_event": round(journal_bytes / events, 1),
           "replay_us_per_event": round(replay / max(replayed, 1) * 1e6, 3), "batch_size": st.batch_size,
           "events_taken": taken, "batch_bytes": sent_bytes,
           "cpu_s": round(total, 3),
           "us_per_event": {k: round(spent[k] / events * 1e6, 3) for k in STEPS} | {
               "all": round(total / events * 1e6, 3)},
           "events_per_core_s": round(events / max(total, 1e-9))}
    if crossed:
        main = sum(spent[k] for k in MAIN_CROSSED)
        out["crossed_us_per_event"] = {k: round(spent[k] / events * 1e6, 3) for k in CROSSED}
        out["main_us_per_event"] = round(main / events * 1e6, 3)
        out["main_events_per_core_s"] = round(events / max(main, 1e-9))
    return out


def _through(blocks: list[bytes], st: Settings, journal: Journal, crossed: bool = False) -> tuple[Counter, int, int]:
    """Every block received, queued and taken out as the server does; the CPU of each step
    (``crossed``: each block's events cross as columns first, and those made again are queued)."""
    decoder = make_decoder("jsonl", {STOCK.name: STOCK}.get, time_unit_ms=st.time_unit_ms, streams=[STOCK.name])
    queue = DelayQueue(st.queue_capacity, st.delay, st.time_unit_ms)
    queue.journal = journal
    clock = time.thread_time
    spent: Counter = Counter()
    taken = sent_bytes = 0
    line = 1
    for block in blocks:
        t0 = clock()
        size = value_bound(block, st.max_value_bytes)
        batch = decoder.decode_batch(block, line)
        t1 = clock()
        horizon = time.time() * 1000.0 / st.time_unit_ms + st.max_future * 1000.0 / st.time_unit_ms
        refused = refusals(batch.events, size, horizon=horizon, max_value=st.max_value_bytes)
        t2 = clock()
        if refused or batch.errors:
            raise RuntimeError(f"a generated tick was refused: {refused or batch.errors}")
        last = line + len(batch.events) - 1
        queued, packed, crossing = batch.events, None, 0.0
        if crossed:
            t3 = clock()
            message = put_request(queued, Lines("bench", line, last))
            t4 = clock()
            queued, _lines, packed = put_of(message)
            t5 = clock()
            spent["reader_encode"] += t4 - t3
            spent["crossed_decode"] += t5 - t4
            crossing = t5 - t3
        queue.put_batch(queued, meta=lambda end, last=last: ("bench", last), packed=packed)
        t3 = clock()
        spent["decode"] += t1 - t0
        spent["limits"] += t2 - t1
        spent["queue_and_journal"] += t3 - t2 - crossing
        line = last + 1
        while len(queue):
            t4 = clock()
            out = queue.get_batch(st.batch_size, timeout=0)
            t5 = clock()
            counted = stream_counts(out)
            sent_bytes += len(codec.encode_batch(taken + len(out), [], out, counted))
            taken += len(out)
            spent["take"] += t5 - t4
            spent["encode"] += clock() - t5
    return spent, taken, sent_bytes
