"""Where a witness gets its number, and how a batch's witnesses reach the log and the clients.

:class:`Witnesses` is the engine's ``on_emit``: it keeps each witness of a
batch as a record, per subscription. When the batch ends,
:meth:`Witnesses.deliver` numbers them (``seq``, per subscription), encodes
each subscription's in one call (JSON lines: the witness log's payloads and
the clients' lines are the same bytes), appends them to the witness log
(server/durability/witlog.py) in one write and only then offers them to the
clients' channels (hub.py) as one shared chunk per subscription, holding the
batch while the log cannot be written.
"""

from __future__ import annotations

import logging
import threading
from itertools import repeat
from typing import Callable, Mapping, NamedTuple

from air.engine import Emission
from air.formats import encode_witnesses, witness_record
from air.model import StreamSchema
from server.delivery.hub import Chunk, ClientChannel, NotifierHub
from server.durability.diskfull import DiskFull
from server.durability.witlog import WitnessLog
from server.observability.counters import CLIENT_DROPS, Count

log = logging.getLogger("cayuga.daemon")

#: The engine thread tries a witness-log append that failed again after this
#: long, doubling up to WITLOG_RETRY_MAX (seconds).
WITLOG_RETRY_FIRST = 0.1
WITLOG_RETRY_MAX = 1.0


class LogColumns(NamedTuple):
    """A batch's witnesses for the witness log, as columns (no object per
    witness for the garbage collector to walk): ``WitnessLog.append_columns(*cols)``."""
    sids: list
    seqs: list
    streams: list
    payloads: list


class Witnesses:
    """Numbering and delivery of witnesses (engine thread only, but for the
    read-only views: :attr:`held`, :meth:`activity`'s copy).

    ``schema`` gives a stream's schema (for encoding), ``subscriptions`` the
    registered subscriptions (is a stream one of its owner's outputs?),
    ``stopping`` is set when the server stops (a held batch is then abandoned),
    ``queued`` says how many events wait (for that log line)."""

    def __init__(self, schema: Callable[[str], StreamSchema | None], hub: NotifierHub, counters,
                 subscriptions: Mapping, stopping: threading.Event, queued: Callable[[], int]) -> None:
        self._schema = schema
        self.hub = hub
        self.counters = counters
        self._subscriptions = subscriptions
        self._stopping = stopping
        self._queued = queued
        #: The last seq given per subscription (engine thread only; from the witness log at start-up).
        self.seq: dict[str, int] = {}
        self.witlog: WitnessLog | None = None  # opened by the daemon's start()
        self.held: DiskFull | None = None  # the engine thread holds a batch the witness log refused
        self.unlogged = 0  # witnesses a stop abandoned because the witness log could not take them
        # the current batch's witnesses, per subscription in the order the engine made them: records to
        # encode (all at once when the batch ends) and their streams; no object per witness but the record
        self.outbox: dict[str, tuple[list, list]] = {}  # of its outputs: numbered, logged, offered
        self._internal: dict[str, tuple[list, list]] = {}  # of internal (RESUB) streams with a watcher
        self._schemas: dict[str, StreamSchema | None] = {}  # the batch's schema per stream (looked up once)
        # for the console's rates; written by the engine thread only, read as copies (see activity())
        self.owner_witnesses: dict[str, int] = {}  # subscription -> witnesses on its outputs

    def open(self, witlog: WitnessLog) -> None:
        """Number on from where ``witlog`` stands."""
        self.witlog = witlog
        self.seq = witlog.last_seqs()

    def forget(self, sid: str) -> None:
        """A subscription has gone (engine thread)."""
        self.owner_witnesses.pop(sid, None)

    def activity(self) -> dict[str, int]:
        """A copy of the witnesses per subscription (a dict copy is atomic under the GIL)."""
        return dict(self.owner_witnesses)

    def _is_output(self, owner: str, stream: str) -> bool:
        sub = self._subscriptions.get(owner)
        return sub is not None and stream in sub.outputs

    def on_emit(self, em: Emission) -> None:
        """Keep a witness for the end of the batch (:meth:`deliver`), as a
        record to encode: there the batch's witnesses of each subscription are
        numbered (``seq``) and encoded in one call, for the witness log and
        every client. Witnesses of internal (RESUB) streams are not numbered
        nor logged: they are kept only when a client watches that stream."""
        owner = em.owner
        stream = em.stream
        schemas = self._schemas
        schema = schemas.get(stream)
        if schema is None:
            schema = schemas[stream] = self._schema(stream)
        if em.kind == "OUT":  # the subscription's own outputs; RESUB streams link its automata
            group = self.outbox.get(owner)
            if group is None:
                group = self.outbox[owner] = ([], [])
        else:
            if not self.hub.route(owner, stream, self._is_output):
                return
            group = self._internal.get(owner)
            if group is None:
                group = self._internal[owner] = ([], [])
        group[0].append(witness_record(stream, em.event, schema))
        group[1].append(stream)

    def _number(self) -> tuple[LogColumns, list[tuple[str, range, list, list]]]:
        """The batch's witnesses numbered and encoded (one encoder call per
        subscription): the witness log's columns, and per subscription
        ``(sid, seqs, streams, payloads)``."""
        outbox, self.outbox, self._schemas = self.outbox, {}, {}
        logged = LogColumns([], [], [], [])
        groups = []
        seqs, counts = self.seq, self.owner_witnesses
        for owner, (records, streams) in outbox.items():
            n = len(records)
            first = seqs.get(owner, 0) + 1
            seqs[owner] = first + n - 1
            counts[owner] = counts.get(owner, 0) + n
            payloads = encode_witnesses(records).split(b"\n")
            payloads.pop()  # after the last newline
            numbers = range(first, first + n)
            logged.sids.extend(repeat(owner, n))
            logged.seqs.extend(numbers)
            logged.streams.extend(streams)
            logged.payloads.extend(payloads)
            groups.append((owner, numbers, streams, payloads))
        return logged, groups

    def _chunks(self, groups, dropped: dict[str, int]) -> dict[ClientChannel, list[Chunk]]:
        """Per channel, the chunks of the batch it gets: one per subscription,
        shared by every channel that gets all of it (witnesses the log already
        held, seq up to ``dropped[sid]``, are left out)."""
        route, is_output = self.hub.route, self._is_output
        boxes: dict[ClientChannel, list[Chunk]] = {}
        for owner, seqs, streams, payloads in groups:
            kinds = {streams[0]} if streams.count(streams[0]) == len(streams) else set(streams)
            if len(kinds) == 1:
                chans = route(owner, streams[0], is_output)
                if not chans:
                    continue
                chunk = Chunk(owner, seqs, payloads)
                if owner in dropped:
                    chunk = chunk.after(dropped[owner])
                    if chunk is None:
                        continue
                for ch in chans:
                    boxes.setdefault(ch, []).append(chunk)
                continue
            # several output streams: a channel may watch only some of them
            per: dict[ClientChannel, list[int]] = {}
            for stream in kinds:
                for ch in route(owner, stream, is_output):
                    per.setdefault(ch, []).extend(i for i, s in enumerate(streams) if s == stream)
            for ch, idx in per.items():
                idx.sort()
                chunk = Chunk(owner, None if seqs is None else [seqs[i] for i in idx], [payloads[i] for i in idx])
                if owner in dropped and seqs is not None:
                    chunk = chunk.after(dropped[owner])
                    if chunk is None:
                        continue
                boxes.setdefault(ch, []).append(chunk)
        return boxes

    def _internal_groups(self) -> list[tuple[str, None, list, list]]:
        internal, self._internal = self._internal, {}
        out = []
        for owner, (records, streams) in internal.items():
            payloads = encode_witnesses(records).split(b"\n")
            payloads.pop()
            out.append((owner, None, streams, payloads))
        return out

    def deliver(self) -> bool:
        """Number and encode the batch's witnesses, write them into the
        witness log (one write), then offer them to the clients, under the
        hub's delivery lock (a lagging client checks it has caught up under
        it). Witnesses the log already held (re-produced after a restart: their
        seq is not above the log's) are neither logged again nor offered:
        clients get them from the log.

        Nothing reaches a client that is not in the log: when the log cannot
        be written (a full disk) the engine thread holds the batch's witnesses,
        delivers none, and tries again (WITLOG_RETRY_FIRST, doubling up to
        WITLOG_RETRY_MAX) until it can; meanwhile it takes no new batch, so the
        queue fills and the receivers stop reading (back-pressure), and
        changes to subscriptions are refused (:attr:`held`, checked by the
        daemon's ``_require_ready``). A stop meanwhile abandons the batch
        (returns False, logged): the journal still holds its events, so the
        next start produces these witnesses again."""
        if not self.outbox and not self._internal:
            return True
        logged, groups = self._number()
        internal = self._internal_groups()
        wait = WITLOG_RETRY_FIRST
        while True:
            with self.hub.delivery_lock:
                try:
                    dropped = self.witlog.append_columns(*logged) if logged.sids else []
                except DiskFull as exc:
                    failure = exc
                else:
                    self.held = None
                    cut: dict[str, int] = {}
                    for i in dropped:  # re-produced witnesses: a prefix of each subscription's
                        cut[logged.sids[i]] = max(cut.get(logged.sids[i], 0), logged.seqs[i])
                    boxes = self._chunks(groups + internal, cut)
                    for ch, chunks in boxes.items():
                        ch.offer_many(chunks, sum(map(len, chunks)))
                    return True
            if self.held is None:
                self.counters.add(Count.WITNESS_LOG_HOLDS)
            self.held = failure
            self.counters.add(Count.WITNESS_LOG_ERRORS)
            if self._stopping.wait(wait):
                self.unlogged = len(logged.sids)
                log.error("stopping while the witness log cannot be written (%s): the last batch's %d witnesses "
                          "were neither logged nor delivered, and %d queued events were not processed; the "
                          "journal holds their events, so the next start produces them again (no shutdown "
                          "snapshot is written)", failure, len(logged.sids), self._queued())
                return False
            wait = min(wait * 2, WITLOG_RETRY_MAX)

    def on_client_drop(self, ch: ClientChannel, policy: str, n: int = 1) -> None:
        """A client's buffer overflowed: it lags (``policy`` "lag": served from
        the witness log) or, on an internal stream that is not logged, it is
        disconnected ("disconnect")."""
        if policy == "lag":
            self.counters.add(Count.CLIENT_LAGS, n)
            log.info("WebSocket client %s (%s) fell %d witnesses behind: served from the witness log until it "
                     "catches up", ch.id, ch.label, ch.capacity)
            return
        self.counters.add(CLIENT_DROPS[policy], n)
        if policy == "disconnect":
            log.warning("disconnecting slow WebSocket client %s (%s): buffer of %d full (an internal stream, "
                        "not in the witness log)", ch.id, ch.label, ch.capacity)
