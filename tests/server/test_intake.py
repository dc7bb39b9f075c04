"""What a TCP connection's reader asks of the server (server/ingest/intake.py), each call on
real parts: a DelayQueue, a Journal in a temporary directory, the server's Security with its
tokens. These are the calls a reader in a process of its own will send over a channel
(docs/design/receivers.md): whatever carries them must keep what these tests assert."""

from __future__ import annotations

import json
import threading

import pytest

from air.model import Attribute, StreamSchema
from clients.testing import wait_until
from clients.testing.market import STOCK, stock
from server.config import Settings
from server.durability.journal import Journal
from server.durability.store import Store
from server.ingest.intake import Intake, Lines
from server.ingest.queue import DelayQueue
from server.observability.counters import Count, Counters
from server.security import AuthRefused, Security


@pytest.fixture
def journal(tmp_path):
    j = Journal(tmp_path / "journal", "fsync", 1 << 20, sync_interval=0.005)
    yield j
    j.close()


def _intake(queue: DelayQueue, catalog: dict | None = None, **kwargs) -> Intake:
    catalog = {STOCK.name: STOCK} if catalog is None else catalog
    return Intake(queue, catalog.get, lambda: 1000.0, Counters(), streams=lambda: list(catalog), **kwargs)


def _events(intake: Intake, n: int, t0: int = 1):
    block = "".join(json.dumps(stock(f"S{i}", 1.0, 1, t0 + i)) + "\n" for i in range(n)).encode()
    batch = intake.decoder("jsonl").decode_batch(block, 1)
    assert not batch.errors and len(batch.events) == n
    return batch.events


def test_a_sender_is_one_connections_at_a_time():
    intake = _intake(DelayQueue(10))
    assert intake.claim("a") and not intake.claim("a") and intake.claim("b")
    intake.release("a")
    assert intake.claim("a")


@pytest.mark.parametrize("numbers", [None, [11, 13, 14, 16, 17, 18, 20]], ids=["every-line", "some-refused"])
def test_a_block_split_by_a_full_queue_journals_each_parts_progress(journal, numbers):
    """A block larger than the queue's room goes in as parts, each one journal record with the
    sender's lines done up to it (Lines.done), its last the block's last line; taken out
    meanwhile by a consumer, as the engine thread does."""
    queue = DelayQueue(3)
    queue.journal = journal
    intake = _intake(queue)
    events = _events(intake, 7)
    lines = Lines("s1", 11, 20 if numbers else 17, numbers)
    taken: list = []
    stop = threading.Event()

    def consume():
        while not stop.is_set():
            taken.extend(queue.get_batch(2, timeout=0.05))

    consumer = threading.Thread(target=consume)
    consumer.start()
    try:
        assert intake.put(events, lines) == []
        wait_until(lambda: len(taken) == 7)
    finally:
        stop.set()
        consumer.join(5)
    records = list(journal.replay(0))
    assert len(records) > 1  # (the queue holds 3: the block went in as parts)
    ends = [sum(len(r.events) for r in records[:i + 1]) for i in range(len(records))]
    assert [(r.sender, r.lines_done) for r in records] == [lines.done(end) for end in ends]
    assert records[-1].lines_done == lines.last and ends[-1] == 7
    assert queue.progress("s1") == lines.last
    assert intake.counters.get(Count.RECEIVED_TCP) == 7


def test_what_is_put_is_acknowledged_once_durable(journal):
    queue = DelayQueue(100)
    queue.journal = journal
    intake = _intake(queue)
    assert intake.journaled and intake.position() == 0
    intake.put(_events(intake, 5), Lines("s1", 1, 5))
    position = intake.position()
    assert position == 1  # one record
    intake.wait_durable(position, 10.0)
    assert intake.durable() >= position
    intake.record_progress("s1", 9)  # lines 6-9 refused: the sender's progress, journaled
    assert intake.progress("s1") == 9 and intake.position() == 2


def test_without_a_journal_what_is_queued_is_acknowledged_at_once():
    intake = _intake(DelayQueue(100))
    assert not intake.journaled and intake.position() == 0
    assert intake.put(_events(intake, 3)) == []


def test_a_stop_ends_a_put_waiting_for_room():
    queue = DelayQueue(2)
    intake = _intake(queue)
    intake.put(_events(intake, 2))  # full
    outcome: list = []

    def put():
        try:
            intake.put(_events(intake, 2, t0=10))
            outcome.append("queued")
        except OSError as exc:
            outcome.append(str(exc))

    t = threading.Thread(target=put)
    t.start()
    wait_until(lambda: queue._waiting)  # (it waits for room)
    intake.stop()
    t.join(5)
    assert outcome == ["server stopping"] and len(queue) == 2


def test_a_decoder_knows_a_stream_declared_after_the_intake_was_made():
    catalog = {STOCK.name: STOCK}
    intake = _intake(DelayQueue(10), catalog)
    line = b'{"stream": "Trade", "Sym": "IBM", "t0": 1, "t1": 1}\n'
    assert intake.decoder("jsonl").decode_batch(line, 1).errors
    catalog["Trade"] = StreamSchema("Trade", (Attribute("Sym", "string"),))
    batch = intake.decoder("jsonl").decode_batch(line, 1)
    assert not batch.errors and batch.events[0].stream == "Trade"


def test_the_token_must_have_the_ingest_scope(tmp_path):
    settings = Settings(data_dir=tmp_path, auth_tokens=[
        {"name": "feeder", "token": "f-secret", "scopes": ["ingest"]},
        {"name": "reader", "token": "r-secret", "scopes": ["watch"]}])
    store = Store(tmp_path / "store.sqlite")
    security = Security(settings, store, Counters())
    try:
        _check_tokens(_intake(DelayQueue(10), security=security))
    finally:
        security.close()
        store.close()
    assert not _intake(DelayQueue(10)).auth  # no tokens: anyone may send


def _check_tokens(intake: Intake) -> None:
    assert intake.auth
    intake.authenticate(b"f-secret", "127.0.0.1")
    refused = {}
    for token in (b"r-secret", None, b"nope"):
        with pytest.raises(AuthRefused) as exc:
            intake.authenticate(token, "127.0.0.1")
        refused[token] = exc.value.reason
    assert refused == {b"r-secret": "scope", None: "missing", b"nope": "wrong"}


def test_what_a_reader_counts_is_the_servers_count():
    intake = _intake(DelayQueue(10))
    intake.count(Count.REJECTED_TCP)
    intake.count(Count.DUPLICATES_DROPPED, 4)
    assert intake.counters.get(Count.REJECTED_TCP) == 1 and intake.counters.get(Count.DUPLICATES_DROPPED) == 4
