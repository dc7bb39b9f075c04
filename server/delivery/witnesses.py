"""Where a witness gets its number, and how a batch's witnesses reach the log and the clients.

:class:`Witnesses` keeps a batch's emissions as the engine makes them (its
``on_emit`` is a list's ``append``: no Python call per witness). When the
batch ends, :meth:`Witnesses.deliver` encodes the batch's witness records in
one call, the compiled batch encoder ``cayuga run`` uses, splits them per
subscription and numbers them (``seq``, per subscription)
(:func:`air.formats.encode_emissions`; JSON lines: the witness log's payloads
and the clients' lines are the same bytes), appends them to the witness log
(server/durability/witlog.py) in one write and only then offers them to the
clients' channels (hub.py) as one shared chunk per subscription, holding the
batch while the log cannot be written.

An engine worker (server/workers/) encodes its witnesses itself and sends them
as the witness log's batch record's columns, packed (:class:`Columns`):
:meth:`Witnesses.deliver_columns` numbers them per subscription, not per
witness, writes the record with the seqs put in, and unpacks only what a
client watches: thousands of subscriptions with a few witnesses each in every
batch cost this process a few C-level passes, not a loop per witness.
"""

from __future__ import annotations

import logging
import sys
import threading
from itertools import repeat
from typing import Callable, Mapping, MutableMapping, NamedTuple

import numpy as np

from air.engine import Emission
from air.model import StreamSchema
from server.delivery.encoding import Columns, EncodedBatch, WitnessEncoder, check_places
from server.delivery.hub import Chunk, ClientChannel, NotifierHub
from server.durability.diskfull import DiskFull
from server.durability.framing import FRAME, BadRecord
from server.durability.seqmap import Numbers, SeqMap, grown
from server.durability.witlog import WitnessLog
from server.durability.witrecords import pack_batch as _pack, pack_seqs
from server.durability.witside import SideReader
from server.observability.counters import CLIENT_DROPS, Count

log = logging.getLogger("cayuga.daemon")

#: The engine thread tries a witness-log append that failed again after this
#: long, doubling up to WITLOG_RETRY_MAX (seconds).
WITLOG_RETRY_FIRST = 0.1
WITLOG_RETRY_MAX = 1.0
#: A batch's watched witnesses are read alone from an engine worker's payload file while they
#: are at most this share of its witnesses (a read each subscription, against reading, checking
#: and unpacking the whole batch: BENCHMARKS.md, "Engine workers, round 13").
SPAN_SHARE = 1 / 16


class LogColumns(NamedTuple):
    """A batch's witnesses for the witness log, as columns (no object per
    witness for the garbage collector to walk): ``WitnessLog.append_columns(*cols)``."""
    sids: list
    seqs: list
    streams: list
    payloads: list


class NumberMap:
    """The main process's side of one engine worker's :class:`LocalNumbers`: its
    numbers -> the witness log's (server/durability/seqmap.py), learnt from
    :attr:`Columns.fresh` of each of its results (:meth:`learn`, by whoever takes
    one). A number told again replaces the old. Checked against the names at a few
    places of every batch: one that does not hold is learnt again from the names."""

    def __init__(self) -> None:
        self.subs = np.full(0, -1, np.intp)
        self.streams = np.full(0, -1, np.intp)

    @staticmethod
    def _told(known: np.ndarray, pairs, numbers: Numbers) -> np.ndarray:
        if pairs:
            known = grown(known, max(pairs[0::2]) + 1, -1)
            for k, name in zip(pairs[0::2], pairs[1::2]):
                known[k] = numbers.number(name)
        return known

    def learn(self, cols: Columns, wlog: WitnessLog) -> None:
        """Take the numbers ``cols`` tells."""
        self.subs = self._told(self.subs, cols.fresh, wlog.numbers)
        self.streams = self._told(self.streams, cols.fresh_streams, wlog.stream_numbers)

    def take(self, cols: Columns, wlog: WitnessLog) -> tuple | None:
        """The owners' numbers and their streams' (-1: several), learning what ``cols``
        tells; None when it has none (the caller numbers by the names)."""
        self.learn(cols, wlog)
        if not cols.nums:
            return None
        local, local_streams = np.frombuffer(cols.nums, np.int32), np.frombuffer(cols.stream_nums, np.int32)
        try:
            nums, kinds = self.subs[local], self._kinds(local_streams)
        except IndexError:  # a number above any told
            pass
        else:
            if self._hold(cols, nums, kinds, wlog):
                return nums, kinds
        # a number never told, or told for another (its telling did not come here): learnt again from the names
        pairs = [x for k, sid in zip(local.tolist(), cols.owners) for x in (k, sid)]
        kinds_told = [x for t, kind in zip(local_streams.tolist(), cols.streams) if t >= 0 for x in (t, kind)]
        self.subs = self._told(self.subs, pairs, wlog.numbers)
        self.streams = self._told(self.streams, kinds_told, wlog.stream_numbers)
        return self.subs[local], self._kinds(local_streams)

    def _kinds(self, local_streams: np.ndarray) -> np.ndarray:
        """The streams' numbers, -1 where an owner published on several."""
        if len(self.streams) and local_streams.min() >= 0:
            return self.streams[local_streams]
        kinds = np.full(len(local_streams), -1, np.intp)
        single = local_streams >= 0
        kinds[single] = self.streams[local_streams[single]]
        return kinds

    def _hold(self, cols: Columns, nums: np.ndarray, kinds: np.ndarray, wlog: WitnessLog) -> bool:
        if int(nums.min()) < 0:  # (a stream never told is -1 here: it fails the names below)
            return False
        names, stream_names = wlog.numbers.names, wlog.stream_numbers.names
        places = check_places(len(nums))
        told = cols.checks  # (the names at those places, sent apart: the lists of all stay packed)
        if len(told) != 2 * len(places):
            told = [x for i in places for x in (cols.owners[i], cols.streams[i])]
        for i, owner, kind in zip(places, told[0::2], told[1::2]):
            if names[nums[i]] != owner or (type(kind) is str and stream_names[kinds[i]] != kind):
                return False
        return True


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
        self.numbers = Numbers()  # the subscriptions' (the witness log's, once open: seqmap.py)
        #: The last seq given per subscription (engine thread only; from the witness log at start-up).
        self.seq: MutableMapping[str, int] = {}
        self.witlog: WitnessLog | None = None  # opened by the daemon's start()
        self._side: SideReader | None = None
        self.held: DiskFull | None = None  # the engine thread holds a batch the witness log refused
        self.unlogged = 0  # witnesses a stop abandoned because the witness log could not take them
        #: The current batch's emissions, as the engine made them (its ``on_emit`` is this list's
        #: ``append``: no Python call per witness); numbered, encoded and delivered by deliver().
        self.outbox: list[Emission] = []
        self.on_emit: Callable[[Emission], None] = self.outbox.append
        # internal (RESUB) witnesses are encoded only where a client watches their stream
        self.encoder = WitnessEncoder(schema, lambda owner, stream: bool(hub.route(owner, stream, self._is_output)))
        # for the console's rates; written by the engine thread only, read as copies (see activity())
        self.owner_witnesses = SeqMap(self.numbers)  # subscription -> witnesses on its outputs
        #: (the hub's version, by the witness log's numbers whether a client watches that subscription,
        #: and that stream): see :meth:`_watched_masks`
        self._watch: tuple[int, np.ndarray, np.ndarray] = (-1, np.zeros(0, np.bool_), np.zeros(0, np.bool_))
        #: Where engine workers number their subscriptions' witnesses (server/workers/dispatch.py sets it to a
        #: set; None: nothing numbers but this): the subscriptions whose numbering they must be told again,
        #: set here other than by numbering their results (:meth:`set_seq`), or told wrong by one; and
        #: whether all of them must be (:attr:`seq` replaced whole)
        self.reseed: set[str] | None = None
        self.reseed_all = False
        self._said_wrong = 0  # batches whose told wrong numbers were logged (the first few)

    @property
    def seq(self) -> SeqMap:
        return self._seq

    @seq.setter
    def seq(self, value: Mapping[str, int]) -> None:
        same = isinstance(value, SeqMap) and value.numbers is self.numbers
        self._seq = value if same else SeqMap(self.numbers, value)
        self.reseed_all = True

    def set_seq(self, sid: str, last: int) -> None:
        """Number ``sid``'s next witness ``last + 1`` (an engine worker that numbers it is told so)."""
        self._seq[sid] = last
        if self.reseed is not None:
            self.reseed.add(sid)

    def open(self, witlog: WitnessLog) -> None:
        """Number on from where ``witlog`` stands."""
        self.witlog = witlog
        if self._side is not None:
            self._side.close()
        self._side = witlog.side_reader()  # the payloads engine workers wrote beside it (engine thread)
        self.numbers = witlog.numbers
        self.owner_witnesses = SeqMap(self.numbers, self.owner_witnesses.copy())
        self.seq = witlog.last_seqs()

    def forget(self, sid: str) -> None:
        """A subscription has gone (engine thread)."""
        self.owner_witnesses.pop(sid, None)

    def activity(self) -> dict[str, int]:
        """A copy of the witnesses per subscription."""
        return self.owner_witnesses.copy()

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
        given = [g for g in encoded.groups if g[2]]
        nums = self.numbers.array([g[0] for g in given])  # (each subscription once a batch)
        ns = np.array([len(g[2]) for g in given], np.int64)
        befores = self.seq.take(nums)
        self.seq.put(nums, befores + ns)
        self.owner_witnesses.add(nums, ns)
        for (owner, streams, payloads), before in zip(given, befores.tolist()):
            n = len(payloads)
            numbers = range(before + 1, before + n + 1)
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

        def append() -> dict[str, int]:
            dropped = self.witlog.append_columns(*logged) if logged.sids else []
            cut: dict[str, int] = {}
            for i in dropped:  # re-produced witnesses: a prefix of each subscription's
                cut[logged.sids[i]] = max(cut.get(logged.sids[i], 0), logged.seqs[i])
            return cut

        return self._log_and_offer(append, lambda cut: groups + internal, len(logged.sids))

    def deliver_columns(self, cols: Columns, known: NumberMap | None = None) -> bool:
        """:meth:`deliver_encoded` for the witnesses an engine worker sent as the
        witness log's columns (server/workers/codec.py): numbered per subscription
        (not per witness), written as the record the worker packed with their seqs
        put in, and unpacked only for the subscriptions a client watches. A batch
        made again after a restart (the log holds some of its seqs) goes the
        general way, which drops what the log holds. ``known``: the numbers of the
        worker that packed ``cols`` (:class:`NumberMap`), to number by. Payloads the
        worker wrote itself (``cols.ref``) are read only where a client watches some."""
        owners = cols.owner_count()
        if not owners:
            return True
        if cols.ref is not None:
            cols.reader = self._side.payloads
        if owners == 1 and type(cols.streams[0]) is str:  # (a server of few subscriptions: most batches)
            return self._deliver_one(cols, known)
        # array operations over the batch's subscriptions (thousands a batch, a few witnesses each)
        wlog = self.witlog
        told = known.take(cols, wlog) if known is not None else None
        nums, kinds = told if told is not None else (self.numbers.array(cols.owners), None)
        ns = np.frombuffer(cols.counts_packed(), np.int32).astype(np.int64)  # (no list of thousands of ints)
        befores = self.seq.take(nums)
        starts = befores + 1
        if cols.befores:
            self._check_told(cols.befores, befores, nums)
        if wlog.holds_any(nums, starts):
            return self.deliver_encoded(EncodedBatch(cols.groups(), []))
        ends = befores + ns
        self.seq.put(nums, ends)
        self.owner_witnesses.add(nums, ns)
        if kinds is not None and int(kinds.min()) >= 0:
            pair_nums, pair_streams = nums, kinds
        else:  # by the names; some may publish on several streams: a pair each
            pairs = [(n, s) for n, st in zip(nums.tolist(), cols.streams)
                     for s in ((st,) if type(st) is str else st)]
            pair_nums = np.array([p[0] for p in pairs], np.intp)
            pair_streams = wlog.stream_numbers.array([p[1] for p in pairs])
        return self._log_columns(cols, nums, kinds, starts, ends, pair_nums, pair_streams)

    def _log_columns(self, cols: Columns, nums: np.ndarray, kinds: np.ndarray | None, starts: np.ndarray,
                     ends: np.ndarray, pair_nums: np.ndarray, pair_streams: np.ndarray, one: int = 0) -> bool:
        """Write ``cols``, each owner's numbered ``starts[i]`` to ``ends[i]``, as the record the worker
        packed, with the index's numbers (:meth:`WitnessLog.append_packed`), then offer the watched
        subscriptions' groups (``nums``, ``kinds``: the owners' numbers and their streams', -1 or None:
        by the names). Where the worker wrote the payloads, the record is told per subscription (its
        first seq and count): nothing of it a witness; else each witness's seq is packed from an array
        (witrecords.py's ``pack_seqs``), not made a list first. ``one``: the number of witnesses where
        they are of one subscription (:meth:`_deliver_one`: its seqs one range, no sum nor pass over the counts)."""
        wlog, side = self.witlog, cols.ref
        counts = ends - starts + 1
        n = one or int(counts.sum())
        if side is None:  # ([sids, seqs, streams, payloads])
            if one:
                first, last = int(starts[0]), int(ends[0])
                packed = pack_seqs(np.arange(first, last + 1), (first, last))
            else:
                packed = pack_seqs(np.arange(n) + np.repeat(starts - (np.cumsum(counts) - counts), counts))
            body = (b"\x94", cols.sids, packed, memoryview(cols.rest)[1:])
        else:  # ([owners, firsts, counts, streams, where the worker wrote the payloads]: witrecords.py's kind 4)
            body = (b"\x95", cols.owners_packed(), pack_seqs(starts), pack_seqs(counts), cols.streams_packed(),
                    _pack(side))

        def append() -> dict[str, int]:
            wlog.append_packed(body, n, nums, starts, ends, pair_nums, pair_streams, side)
            return {}

        def groups(_cut) -> list:
            if self.hub.idle:
                return []
            return self._watched_groups(cols, nums, kinds, starts, ends)

        return self._log_and_offer(append, groups, n)

    def _deliver_one(self, cols: Columns, known: NumberMap | None) -> bool:
        """:meth:`deliver_columns` of one subscription's witnesses on one stream, by scalar
        steps (an array operation's fixed cost is most of such a batch's)."""
        wlog, sid, n = self.witlog, cols.owners[0], cols.counts[0]
        if known is not None:
            known.learn(cols, wlog)
        before = self.seq.get(sid, 0)
        told = cols.befores  # (int32 or int64, the machine's order: compared as one int, no array made)
        if told and (len(told) not in (4, 8) or int.from_bytes(told, sys.byteorder, signed=True) != before):
            self._check_told(told, np.array([before]), None, sid)
        if wlog.last_seq(sid) > before:
            return self.deliver_encoded(EncodedBatch(cols.groups(), []))
        first, last = before + 1, before + n
        self.seq[sid] = last
        self.owner_witnesses[sid] = self.owner_witnesses.get(sid, 0) + n
        num, kind = np.array([self.numbers.number(sid)]), np.array([wlog.stream_numbers.number(cols.streams[0])])
        return self._log_columns(cols, num, kind, np.array([first]), np.array([last]), num, kind, n)

    def _check_told(self, told: bytes, befores: np.ndarray, nums: np.ndarray | None, sid: str = "") -> None:
        """Check where an engine worker's numbering of its subscriptions stood before this batch
        (``told``: :attr:`Columns.befores`) against this numbering's (``befores``, of the owners
        numbered ``nums`` in the witness log, or of ``sid`` alone). This numbering stands; one
        told otherwise is counted, logged, and the worker is told where it stands (:attr:`reseed`)."""
        n = len(befores)
        theirs = np.frombuffer(told, np.int32 if len(told) == 4 * n else np.int64)
        if len(theirs) == n and np.array_equal(theirs, befores):
            return
        wrong = np.flatnonzero(theirs != befores) if len(theirs) == n else np.arange(n)
        names = [sid] if nums is None else [self.witlog.numbers.names[k] for k in nums[wrong].tolist()]
        self.counters.add(Count.WORKER_SEQS_TOLD_WRONG, len(names))
        if self.reseed is not None:
            self.reseed.update(names)
        self._said_wrong += 1
        if self._said_wrong <= 10:  # (a fault would say it every batch: counted in /stats after these)
            at = int(wrong[0])
            log.warning("an engine worker numbered %d subscriptions' witnesses otherwise than the main process "
                        "(%s: from %s, not %d); the main process's numbers stand, and the worker is told them "
                        "(/stats' worker_seqs_told_wrong counts each)", len(names), names[0],
                        int(theirs[at]) + 1 if len(theirs) == n else "?", int(befores[at]) + 1)

    def _watched_masks(self) -> tuple[np.ndarray, np.ndarray]:
        """By the witness log's numbers, whether a client watches that subscription, and that
        stream: made again when a client comes or goes (a watched name is numbered then, so a
        number given later is of one nobody watches)."""
        hub, wlog = self.hub, self.witlog
        version = hub.version  # (read first: a change meanwhile makes them again at the next batch)
        if self._watch[0] != version:
            owners = wlog.numbers.array(sorted(hub.watched_owners()))
            streams = wlog.stream_numbers.array(sorted(hub.watched_streams()))
            by_owner, by_stream = np.zeros(len(wlog.numbers), np.bool_), np.zeros(len(wlog.stream_numbers), np.bool_)
            by_owner[owners] = True
            by_stream[streams] = True
            self._watch = (version, by_owner, by_stream)
        return self._watch[1], self._watch[2]

    def _watched_groups(self, cols: Columns, nums: np.ndarray, kinds: np.ndarray | None, starts: np.ndarray,
                        ends: np.ndarray) -> list:
        """The numbered groups of ``cols`` some client gets: the owners whose subscription or
        stream a client watches found by their numbers (an array pass over thousands, not a
        route lookup each), and only theirs unpacked."""
        by_owner, by_stream = self._watched_masks()
        if kinds is None:  # (the streams not numbered: each owner's by its names)
            kinds = np.full(len(nums), -1, np.intp)
        if len(nums) == 1:  # (one subscription's batch: scalars, no array pass)
            k, kind = int(nums[0]), int(kinds[0])
            places = [0] if (kind < 0 or k < len(by_owner) and by_owner[k]
                             or kind < len(by_stream) and by_stream[kind]) else []
        else:
            maybe = kinds < 0  # (several streams, or not numbered)
            mine = nums < len(by_owner)
            maybe[mine] |= by_owner[nums[mine]]
            single = ~maybe & (kinds < len(by_stream))
            maybe[single] |= by_stream[kinds[single]]
            places = np.flatnonzero(maybe).tolist()
        if not places:
            return []
        route, is_output = self.hub.route, self._is_output
        names, stream_names = self.witlog.numbers.names, self.witlog.stream_numbers.names
        wanted, their_streams = [], []
        for i in places:
            sid, kind = names[nums[i]], int(kinds[i])
            st = cols.streams[i] if kind < 0 else stream_names[kind]
            if any(route(sid, s, is_output) for s in ((st,) if type(st) is str else set(st))):
                wanted.append(i)
                their_streams.append(st)
        parts = None
        if wanted and cols.sizes and self._side is not None:  # (the payloads in a worker's file)
            parts = read_parts(cols, wanted, their_streams, np.cumsum(ends - starts + 1), self._side)
        return [(names[nums[i]], range(int(starts[i]), int(ends[i]) + 1), streams, payloads)
                for i, (streams, payloads) in zip(wanted, cols.parts_at(wanted) if parts is None else parts)]

    def _log_and_offer(self, append: Callable[[], dict[str, int]], groups: Callable[[dict[str, int]], list],
                       n: int) -> bool:
        """Write a batch into the witness log (``append``: the subscriptions whose witnesses
        up to a seq the log held already), then offer ``groups(cut)`` to the clients
        (see :meth:`deliver_encoded`), holding it while the log cannot be written."""
        wait = WITLOG_RETRY_FIRST
        while True:
            with self.hub.delivery_lock:
                try:
                    cut = append()
                except DiskFull as exc:
                    failure = exc
                else:
                    self.held = None
                    boxes = self._chunks(groups(cut), cut)
                    for ch, chunks in boxes.items():
                        ch.offer_many(chunks, sum(map(len, chunks)))
                    return True
            if self.held is None:
                self.counters.add(Count.WITNESS_LOG_HOLDS)
            self.held = failure
            self.counters.add(Count.WITNESS_LOG_ERRORS)
            if self._stopping.wait(wait):
                self.unlogged = n
                log.error("stopping while the witness log cannot be written (%s): the last batch's %d witnesses "
                          "were neither logged nor delivered, and %d queued events were not processed; the "
                          "journal holds their events, so the next start produces them again (no shutdown "
                          "snapshot is written)", failure, n, self._queued())
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


def read_parts(cols: Columns, wanted: list[int], streams: list, owner_ends: np.ndarray,
               reader: SideReader) -> list[tuple[list[str], list[bytes]]] | None:
    """:meth:`Columns.parts_at` of the owners at ``wanted`` whose payloads an engine worker wrote
    to its file, each owner's read alone there by :attr:`Columns.sizes` (a client watching a few
    of a batch's thousands of subscriptions: not the batch's megabyte read, checked and unpacked
    for them). ``streams``: each wanted owner's stream, or its witnesses' list; ``owner_ends``:
    where each owner's witnesses end among the batch's. None where that is not the way: more
    than :data:`SPAN_SHARE` of the witnesses wanted, sizes that do not add up to the record, or
    the file not readable (then read whole, which says why)."""
    sizes = np.frombuffer(cols.sizes, np.uint32).astype(np.int64)
    n = len(sizes)
    counts = cols.counts
    if sum(counts[i] for i in wanted) > n * SPAN_SHARE:
        return None
    # the packed array: its header, then each payload as a MessagePack bin (a header of 2, 3 or 5 bytes)
    ends = np.cumsum(sizes + np.where(sizes < 256, 2, np.where(sizes < 65536, 3, 5))) + (
        1 if n < 16 else 3 if n < 65536 else 5)
    ref = cols.ref
    if int(ends[-1]) != ref[2] - FRAME.size:
        log.warning("an engine worker's payload sizes do not add up to its record in %s: read whole", ref[0])
        return None
    firsts = ends - sizes
    out = []
    try:
        for i, st in zip(wanted, streams):
            b = int(owner_ends[i])
            a = b - counts[i]
            begin = int(firsts[a])
            data = reader.span(ref, begin, int(ends[b - 1]))
            payloads = [data[x - begin:y - begin] for x, y in zip(firsts[a:b].tolist(), ends[a:b].tolist())]
            out.append(([st] * len(payloads) if type(st) is str else st, payloads))
    except (OSError, BadRecord):
        return None
    return out
