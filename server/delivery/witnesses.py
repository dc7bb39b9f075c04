"""Where a witness gets its number, and how a batch's witnesses reach the log and the clients.

:class:`Witnesses` is the engine's ``on_emit``: it numbers each witness of a
subscription's outputs (``seq``, per subscription), encodes it once, and
collects the batch's witnesses as columns for the witness log and per client.
When the batch ends, :meth:`Witnesses.deliver` appends them to the witness log
(server/durability/witlog.py) in one write and only then offers them to the
clients' channels (hub.py), holding the batch while the log cannot be written.
"""

from __future__ import annotations

import logging
import threading
from typing import Callable, Mapping, NamedTuple

from air.engine import Emission
from air.formats import witness_bytes
from air.model import StreamSchema
from server.delivery.hub import ClientChannel, NotifierHub
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


class ClientColumns(NamedTuple):
    """A batch's witnesses for one client, as columns; seq 0 for a witness of
    an internal (RESUB) stream, which is not numbered."""
    sids: list
    seqs: list
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
        # the current batch's witnesses, as columns (no object per witness for the garbage collector):
        self.outbox: dict[ClientChannel, ClientColumns] = {}  # per client
        self._logged = LogColumns([], [], [], [])  # the witness log's
        self._log_add = tuple(c.append for c in self._logged)  # their append methods, in LogColumns' order
        self._box_add: dict[ClientChannel, tuple] = {}  # the append methods of each client's columns, in order
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
        """Number a witness of a subscription's outputs (``seq``) and
        encode it once, for the witness log and every client it goes to; they
        get it when the batch ends (:meth:`deliver`). Count it for the console.
        Witnesses of internal (RESUB) streams are not numbered nor logged: they
        go only to clients watching that stream, encoded only if there are any."""
        owner = em.owner
        stream = em.stream
        if em.kind == "OUT":  # the subscription's own outputs; RESUB streams link its automata
            self.owner_witnesses[owner] = self.owner_witnesses.get(owner, 0) + 1
            seqs = self.seq
            seq = seqs[owner] = seqs.get(owner, 0) + 1
            payload = witness_bytes(stream, em.event, self._schema(stream))
            add_sid, add_seq, add_stream, add_payload = self._log_add
            add_sid(owner)
            add_seq(seq)
            add_stream(stream)
            add_payload(payload)
            chans = self.hub.route(owner, stream, self._is_output)
            if not chans:
                return
        else:
            chans = self.hub.route(owner, stream, self._is_output)
            if not chans:
                return
            seq = 0
            payload = witness_bytes(stream, em.event, self._schema(stream))
        outbox = self.outbox
        for ch in chans:
            if ch in outbox:
                add_sid, add_seq, add_payload = self._box_add[ch]
            else:
                box = outbox[ch] = ClientColumns([], [], [])
                self._box_add[ch] = add_sid, add_seq, add_payload = (box.sids.append, box.seqs.append,
                                                                     box.payloads.append)
            add_sid(owner)
            add_seq(seq)
            add_payload(payload)

    def deliver(self) -> bool:
        """The batch's witnesses into the witness log (one write), then to the
        clients, under the hub's delivery lock (a lagging client checks it has
        caught up under it). Witnesses the log already held (re-produced after a
        restart: their seq is not above the log's) are neither logged again
        nor offered: clients get them from the log.

        Nothing reaches a client that is not in the log: when the log cannot
        be written (a full disk) the engine thread holds the batch's witnesses,
        delivers none, and tries again (WITLOG_RETRY_FIRST, doubling up to
        WITLOG_RETRY_MAX) until it can; meanwhile it takes no new batch, so the
        queue fills and the receivers stop reading (back-pressure), and
        changes to subscriptions are refused (:attr:`held`, checked by the
        daemon's ``_require_ready``). A stop meanwhile abandons the batch
        (returns False, logged): the journal still holds its events, so the
        next start produces these witnesses again."""
        logged, outbox = self._logged, self.outbox
        if not logged.sids and not outbox:
            return True
        self._logged, self.outbox, self._box_add = LogColumns([], [], [], []), {}, {}
        self._log_add = tuple(c.append for c in self._logged)
        wait = WITLOG_RETRY_FIRST
        while True:
            with self.hub.delivery_lock:
                try:
                    dropped = self.witlog.append_columns(*logged) if logged.sids else []
                except DiskFull as exc:
                    failure = exc
                else:
                    self.held = None
                    self._offer(logged, outbox, dropped)
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

    @staticmethod
    def _offer(logged: LogColumns, outbox: dict, dropped: list[int]) -> None:
        """Hand a logged batch to the clients (under the delivery lock), but
        the witnesses the log already held (``dropped``)."""
        if dropped:
            dup = {(logged.sids[i], logged.seqs[i]) for i in dropped}
            for ch, (sids, seqs, payloads) in list(outbox.items()):
                keep = [i for i, k in enumerate(zip(sids, seqs)) if k not in dup]
                outbox[ch] = ClientColumns([sids[i] for i in keep], [seqs[i] for i in keep],
                                           [payloads[i] for i in keep])
        for ch, (sids, seqs, payloads) in outbox.items():
            if payloads:
                ch.offer_many(sids, seqs, payloads)

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
