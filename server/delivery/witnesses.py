"""Where a witness gets its number, and how a batch's witnesses reach the log and the clients.

:class:`Witnesses` keeps a batch's emissions as the engine makes them (its
``on_emit`` is a list's ``append``: no Python call per witness). When the
batch ends, :meth:`Witnesses.deliver` splits them per subscription, numbers
them (``seq``, per subscription), makes and encodes each subscription's
witness records in one call, the compiled batch encoder ``cayuga run`` uses
(:func:`air.formats.encode_emissions`; JSON lines: the witness log's payloads
and the clients' lines are the same bytes), appends them to the witness log
(server/durability/witlog.py) in one write and only then offers them to the
clients' channels (hub.py) as one shared chunk per subscription, holding the
batch while the log cannot be written.
"""

from __future__ import annotations

import logging
import threading
from itertools import groupby, repeat
from operator import itemgetter
from typing import Callable, Mapping, NamedTuple

from air.engine import Emission
from air.formats import encode_emissions
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

_STREAM, _KIND, _OWNER = itemgetter(0), itemgetter(2), itemgetter(3)  # of an Emission


class LogColumns(NamedTuple):
    """A batch's witnesses for the witness log, as columns (no object per
    witness for the garbage collector to walk): ``WitnessLog.append_columns(*cols)``."""
    sids: list
    seqs: list
    streams: list
    payloads: list


class EncodedBatch(NamedTuple):
    """A batch's witnesses, encoded: per subscription (in the order they first
    emitted) ``(sid, streams, payloads)`` of its output witnesses, in the
    order the engine made them, and the same for the internal (RESUB) streams'
    witnesses a client watches (not numbered nor logged)."""
    groups: list
    internal: list


class WitnessEncoder:
    """Turns a batch's emissions into an :class:`EncodedBatch`: one call of the
    batch encoder ``cayuga run`` uses per subscription. It needs only the
    streams' schemas, so it runs where the engine runs: on the engine thread,
    or in an engine worker process (server/workers/). ``watched(owner,
    stream)``: whether a client watches that internal stream."""

    def __init__(self, schema: Callable[[str], StreamSchema | None], watched: Callable[[str, str], bool]) -> None:
        self._schema = schema
        self.watched = watched

    def encode(self, ems: list) -> EncodedBatch:
        """Per subscription, its emissions in the order the engine made them
        (C-level passes: ``set``/``sorted``/``groupby`` over item getters; a
        Python loop runs only over RESUB emissions, and only in a batch that has some)."""
        if not ems:
            return EncodedBatch([], [])
        owners = dict.fromkeys(map(_OWNER, ems))
        if len(owners) == 1:
            groups = {next(iter(owners)): ems}
        else:
            by = {o: list(g) for o, g in groupby(sorted(ems, key=_OWNER), _OWNER)}  # stable: engine order kept
            groups = {o: by[o] for o in owners}
        out = []
        for owner, emissions in groups.items():
            payloads, streams = self._encode(emissions, False)
            if payloads:
                out.append((owner, streams, payloads))
        internal = []
        if set(map(_KIND, ems)) - {"OUT"}:  # RESUB emissions: kept only where a client watches their stream
            watched = self.watched
            for owner, group in groups.items():
                mine = [em for em in group if em[2] != "OUT" and watched(owner, em[0])]
                if mine:
                    payloads, streams = self._encode(mine, True)
                    internal.append((owner, streams, payloads))
        return EncodedBatch(out, internal)

    def _encode(self, emissions: list, include_resub: bool) -> tuple[list[bytes], list[str]]:
        """The witnesses of ``emissions`` (kind OUT, or all) as one JSON line
        each, by the batch encoder ``cayuga run`` uses (one call), and their streams."""
        data, n = encode_emissions(emissions, self._schema, include_resub)
        payloads = data.split(b"\n")
        payloads.pop()  # after the last newline
        if include_resub or n == len(emissions):
            streams = list(map(_STREAM, emissions))
        else:
            streams = [em[0] for em in emissions if em[2] == "OUT"]
        return payloads, streams


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
        #: The current batch's emissions, as the engine made them (its ``on_emit`` is this list's
        #: ``append``: no Python call per witness); numbered, encoded and delivered by deliver().
        self.outbox: list[Emission] = []
        self.on_emit: Callable[[Emission], None] = self.outbox.append
        # internal (RESUB) witnesses are encoded only where a client watches their stream
        self.encoder = WitnessEncoder(schema, lambda owner, stream: bool(hub.route(owner, stream, self._is_output)))
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

    def _number(self, encoded: "EncodedBatch") -> tuple[LogColumns, list[tuple[str, range, list, list]],
                                                         list[tuple[str, None, list, list]]]:
        """A batch's encoded witnesses numbered: the witness log's columns, per
        subscription ``(sid, seqs, streams, payloads)``, and the same for
        watched internal streams' witnesses (``seqs`` None: not numbered)."""
        logged = LogColumns([], [], [], [])
        groups = []
        seqs, counts = self.seq, self.owner_witnesses
        for owner, streams, payloads in encoded.groups:
            n = len(payloads)
            if not n:
                continue
            first = seqs.get(owner, 0) + 1
            seqs[owner] = first + n - 1
            counts[owner] = counts.get(owner, 0) + n
            numbers = range(first, first + n)
            logged.sids.extend(repeat(owner, n))
            logged.seqs.extend(numbers)
            logged.streams.extend(streams)
            logged.payloads.extend(payloads)
            groups.append((owner, numbers, streams, payloads))
        unnumbered = [(owner, None, streams, payloads) for owner, streams, payloads in encoded.internal]
        return logged, groups, unnumbered

    def _chunks(self, groups, dropped: dict[str, int]) -> dict[ClientChannel, list[Chunk]]:
        """Per channel, the chunks of the batch it gets: one per subscription,
        shared by every channel that gets all of it (witnesses the log already
        held, seq up to ``dropped[sid]``, are left out)."""
        route, is_output = self.hub.route, self._is_output
        boxes: dict[ClientChannel, list[Chunk]] = {}
        for owner, seqs, streams, payloads in groups:
            kinds = {streams[0]} if streams.count(streams[0]) == len(streams) else set(streams)
            if len(kinds) == 1:  # one chunk, shared by every channel of the stream
                shares = [(route(owner, streams[0], is_output), Chunk(owner, seqs, payloads))]
            else:  # several output streams: a channel may watch only some of them
                per: dict[ClientChannel, list[int]] = {}
                for stream in kinds:
                    for ch in route(owner, stream, is_output):
                        per.setdefault(ch, []).extend(i for i, s in enumerate(streams) if s == stream)
                shares = []
                for ch, idx in per.items():
                    idx.sort()
                    shares.append(((ch,), Chunk(owner, None if seqs is None else [seqs[i] for i in idx],
                                                [payloads[i] for i in idx])))
            for chans, chunk in shares:
                if not chans:
                    continue
                if owner in dropped:  # (a chunk without seqs, of an internal stream, is kept whole)
                    chunk = chunk.after(dropped[owner])
                    if chunk is None:
                        continue
                for ch in chans:
                    boxes.setdefault(ch, []).append(chunk)
        return boxes

    def deliver(self) -> bool:
        """Encode the batch's emissions (:class:`WitnessEncoder`) and deliver
        them (:meth:`deliver_encoded`)."""
        if not self.outbox:
            return True
        ems = self.outbox[:]
        del self.outbox[:]  # the engine keeps appending to this very list
        return self.deliver_encoded(self.encoder.encode(ems))

    def deliver_encoded(self, encoded: "EncodedBatch") -> bool:
        """Number the batch's encoded witnesses, write them into the
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
        if not encoded.groups and not encoded.internal:
            return True
        logged, groups, internal = self._number(encoded)
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
