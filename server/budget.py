"""The state budget: memory for automaton state, bounded in bytes, shed
deterministically and never silently.

Every subscription's live instances (partial matches) cost memory; the engine
estimates how much from its own instance layout (air/engine/footprint.py). The
engine thread calls :meth:`StateBudget.at_check` after every batch, and batches
end exactly at every :data:`CHECK_EVENTS`-th event taken (and every
:data:`CAP_CHECK_EVENTS`-th while some subscription has a cap of its own), so
every decision below is taken at the same points of the input on every run:

- instances no event can affect any more (past their filter's ``DUR`` bound,
  air/bounds.py) are dropped; that changes no witness;
- above ``max_state_bytes``, the subscriptions holding the most lose their
  oldest instances (``Engine.evict_oldest``) until the estimate is back at
  :data:`SHED_TO` of it; a subscription above its own cap (``max_instances``,
  ``max_state_bytes`` in its registration body, or the server-wide
  ``max_instances_per_subscription``) is brought back to :data:`SHED_TO` of it;
- a subscription that lost instances is **inexact** until it is deleted:
  :attr:`StateBudget.inexact` (since when, from which of its witnesses on, how
  many instances), which /health, GET /subscriptions/{id}, /metrics, its
  watchers (a ``{"control": "inexact", ...}`` message) and the console show;
- a subscription whose instances every event of its stream visits by the
  thousand, and which grows with those events, is a **runaway**
  (:attr:`StateBudget.runaways`): /health names it with what it costs.

Each shedding is recorded in the store before it is applied, ``(fed, sid,
keep, reason)``, so a recovery replaying the journal applies it again at the
same point (server/durability/recovery.py); the inexact marks travel in the
snapshots. Between checks the engine thread also keeps the instance counts per
subscription the API and /metrics show (:meth:`StateBudget.refresh`, a
background pass on the clock: for display only, it decides nothing).
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import asdict, dataclass
from typing import Callable, Mapping, NamedTuple

from air.engine import Engine
from air.engine import footprint
from server.config import Settings
from server.durability.diskfull import DiskFull
from server.durability.store import Store
from server.observability.counters import Count

log = logging.getLogger("cayuga.daemon")

#: The budget is checked (and expired instances dropped, runaways looked for) after
#: every this many events taken: a pass over the nodes holding instances costs about
#: 45 ns a node, compiled (10,000 subscriptions: ~0.4 ms; BENCHMARKS.md, "Memory of automaton state").
CHECK_EVENTS = 4096
#: Subscriptions with a cap of their own are counted after every this many events.
CAP_CHECK_EVENTS = 256
#: Shedding brings the state back to this share of the budget (or of a cap), so that a
#: subscription still growing is not cut again at the very next check.
SHED_TO = 0.9
#: A node whose every input event visits at least this many of its instances is costly ...
RUNAWAY_VISITS = 1000
#: ... and a runaway when it also grows by at least this many instances per such event.
RUNAWAY_GROWTH = 0.5
#: Watchers of an inexact subscription are told again at most this often (seconds).
NOTICE_SECONDS = 10.0
#: Shedding of one subscription is logged at most once per this many seconds.
SHED_LOG_SECONDS = 10.0

#: Instance counts per subscription (API, /metrics): a full pass at most this often ...
COUNT_PASS_SECONDS = 1.0
#: ... taking at most this much engine-thread time per loop iteration ...
COUNT_BUDGET_SECONDS = 0.002
#: ... and at most this share of the engine thread's time overall (with 100K
#: subscriptions a pass costs ~0.2 s, so passes then come every ~4 s).
COUNT_SHARE = 0.05


@dataclass
class Inexact:
    """What a subscription has lost: its witnesses after ``since_seq`` may lack some."""

    since: float  # wall-clock time of the first loss
    since_fed: int  # events the engine had taken then
    since_seq: int  # the subscription's last witness seq then
    instances_lost: int
    reason: str  # of the latest loss
    last: float  # wall-clock time of the latest loss

    def public(self) -> dict:
        return {"since": self.since, "since_seq": self.since_seq, "since_events": self.since_fed,
                "instances_lost": self.instances_lost, "reason": self.reason, "last": self.last}


class Cap(NamedTuple):
    """A subscription's own limits (its registration body), or None for no limit,
    in force from ``since`` events taken on."""

    max_instances: int | None = None
    max_state_bytes: int | None = None
    since: int = 0


class StateBudget:
    """Instance counts, the state budget, the caps, the inexact marks and the
    runaways (see the module's docstring); engine thread only, but for the
    copies the API reads.

    ``progress`` is the engine thread (``fed``, ``changes``, ``stream_events()``);
    ``recovery`` (wired by the daemon) has the recorded sheddings a replay applies
    again; ``seqs()`` gives each subscription's last witness seq; ``notify(sid,
    message)`` tells a subscription's watchers (wired by the daemon)."""

    def __init__(self, engine: Engine, settings: Settings, store: Store, counters, progress,
                 subscriptions: Mapping, storing: Callable, seqs: Callable[[], Mapping[str, int]]) -> None:
        self.engine = engine
        self.settings = settings
        self.store = store
        self.counters = counters
        self.progress = progress
        self.recovery = None  # wired by the daemon
        self.journal = None  # set by the daemon's start() unless durability is off: only then are sheddings recorded
        self.notify: Callable[[str, dict], None] | None = None  # wired by the daemon
        self._subscriptions = subscriptions
        self._storing = storing
        self._seqs = seqs
        self.max_bytes = settings.max_state_bytes
        self.caps: dict[str, Cap] = {}  # per subscription, from its registration
        self.footprint = footprint.Footprint(0, 0, 0)  # at the last check
        self.inexact: dict[str, Inexact] = {}
        self.runaways: dict[str, dict] = {}  # at the last check: sid -> what it costs
        self.seq = 0  # the last recorded shedding applied (Store.evictions); a snapshot includes those up to it
        self._heavy_prev: dict[int, tuple[int, int]] = {}  # id(node) -> (instances, its stream's events) last check
        self._heavy_nodes: dict[int, tuple] = {}  # id(node) -> (node, its stream's events) of the last check
        self._stream_prev: dict[str, int] = {}
        self._noticed: dict[str, float] = {}  # sid -> when its watchers were last told
        self._shed_log: dict[str, tuple[float, int]] = {}  # sid -> (last logged, sheddings not logged since)
        # the display counts (refresh)
        self.instances: dict[str, int] = {}  # per subscription, refreshed by the engine thread
        self._count_queue: list[str] = []
        self._count_next_pass = 0.0  # monotonic time
        self._count_pass_cost = 0.0
        self.counted_at = time.monotonic()  # when the last full pass of instance counts ended
        self._pass_heaviest: tuple[str, int] = ("", 0)
        self.heaviest: tuple[str, int] | None = None  # the most instances the last full pass found

    # ------------------------------------------------------------------ subscriptions come and go

    def set_cap(self, sid: str, cap: Cap) -> None:
        """A subscription's own limits (None fields: none)."""
        if cap.max_instances is None and cap.max_state_bytes is None:
            self.caps.pop(sid, None)
        else:
            self.caps[sid] = cap

    def forget(self, sid: str) -> None:
        """A subscription has gone (engine thread): its marks go with it."""
        for table in (self.instances, self.caps, self.inexact, self.runaways, self._noticed, self._shed_log):
            table.pop(sid, None)

    # ------------------------------------------------------------------ the checks (engine thread)

    def _capped(self) -> bool:
        return bool(self.caps) or self.settings.max_instances_per_subscription > 0

    def until_check(self, fed: int) -> int:
        """Events the engine may take before the next check (the batch ends there)."""
        n = CHECK_EVENTS - fed % CHECK_EVENTS
        if self._capped():
            n = min(n, CAP_CHECK_EVENTS - fed % CAP_CHECK_EVENTS)
        return n

    def at_check(self, fed: int) -> None:
        """After a batch: the checks due at ``fed`` events taken (see the module's docstring)."""
        full = fed % CHECK_EVENTS == 0
        capped = self._capped() and fed % CAP_CHECK_EVENTS == 0
        if not (full or capped) or not fed:
            return
        recovery = self.recovery
        if recovery is not None and recovery.due:
            recovery.install_due()  # what a replay recorded at this point comes first
        decisions: list[tuple[str, int, str, bool]] = []  # (sid, keep, reason, shared)
        if full:
            decisions += self._check_budget(fed)
        if capped:
            shed = {d[0] for d in decisions}
            decisions += [d for d in self._check_caps(fed) if d[0] not in shed]
        if decisions:
            self._shed(decisions)
            if full:  # what is left, as /health and /metrics show it; the runaways grow from here
                self.footprint = footprint.measure(self.engine)
                for key, (node, seen) in self._heavy_nodes.items():
                    self._heavy_prev[key] = (node.count + len(node.pending), seen)

    def _check_budget(self, fed: int) -> list[tuple[str, int, str, bool]]:
        eng = self.engine
        events = self.progress.stream_events()
        weights = {s: n - self._stream_prev.get(s, 0) for s, n in events.items()}
        found = footprint.survey(eng, expire=True, heavy=RUNAWAY_VISITS / 2)  # candidates, to see them grow
        if found.expired:
            self.counters.add(Count.INSTANCES_EXPIRED, found.expired)
        self.footprint = found.footprint
        self._find_runaways(found.heavy, events, weights)
        self._stream_prev = events
        over = found.footprint.bytes - self.max_bytes
        if over <= 0:
            return []
        need = found.footprint.bytes - int(self.max_bytes * SHED_TO)
        sizes = []
        for sid in self._subscriptions:
            if eng.has_owner(sid):
                n, b = footprint.owner_footprint(eng, sid)
                if n:
                    sizes.append((-b, sid, n, b))
        sizes.sort()
        out = []
        for _nb, sid, n, b in sizes:
            if need <= 0:
                break
            per = b / n
            lose = min(n, math.ceil(min(b, need) / per))
            need -= lose * per
            out.append((sid, n - lose, f"the server's state budget (max_state_bytes {self.max_bytes} bytes) was "
                                       f"exceeded ({found.footprint.bytes} bytes estimated); this subscription "
                                       f"held the most ({b} bytes, {n} instances)", True))
        return out

    def _check_caps(self, fed: int) -> list[tuple[str, int, str, bool]]:
        """Subscriptions above their own cap, counted by the instances only they
        see: a cap sheds nothing an identical subscription (a merged state) sees
        too, which would cost that one its results and free no memory."""
        eng, default = self.engine, self.settings.max_instances_per_subscription
        sids = self._subscriptions if default > 0 else list(self.caps)
        out = []
        for sid in sids:
            if not eng.has_owner(sid):
                continue
            cap = self.caps.get(sid, Cap())
            if cap.since > fed:  # a replay, before the point the cap came into force
                cap = Cap()
            limit = cap.max_instances if cap.max_instances is not None else (default or None)
            if limit is None and cap.max_state_bytes is None:
                continue
            n, b = footprint.owner_footprint(eng, sid, exclusive=True)
            keep, why = n, ""
            if limit is not None and n > limit:
                keep = int(limit * SHED_TO)
                why = (f"its max_instances ({limit})" if cap.max_instances is not None
                       else f"max_instances_per_subscription ({limit})")
            if cap.max_state_bytes is not None and b > cap.max_state_bytes and n:
                by_bytes = int(cap.max_state_bytes * SHED_TO / (b / n))
                if by_bytes < keep:
                    keep, why = by_bytes, f"its max_state_bytes ({cap.max_state_bytes})"
            if keep < n:
                seen = eng.instance_count(sid)
                out.append((sid, seen - (n - keep), f"it held {n} instances ({b} bytes), above {why}", False))
        return out

    def _find_runaways(self, heavy: list, events: Mapping[str, int], weights: Mapping[str, int]) -> None:
        """The subscriptions whose nodes every event of their stream visits by the thousand and
        which grow with those events (``heavy``: the survey's costly nodes)."""
        found: dict[str, dict] = {}
        prev, self._heavy_prev, self._heavy_nodes = self._heavy_prev, {}, {}
        total_work = None
        for cost in heavy:
            node = cost.node
            seen = events.get(node.stream, 0)
            self._heavy_prev[id(node)] = (cost.instances, seen)
            self._heavy_nodes[id(node)] = (node, seen)
            before = prev.get(id(node))
            if cost.visits < RUNAWAY_VISITS or before is None or seen <= before[1]:
                continue
            growth = (cost.instances - before[0]) / (seen - before[1])
            if growth < RUNAWAY_GROWTH:
                continue
            if total_work is None:
                total_work = footprint.survey(self.engine, weights=weights).work + sum(weights.values())
            work = cost.visits * weights.get(node.stream, 0)
            for owner in node.owners:
                if owner not in self._subscriptions:
                    continue
                got = found.setdefault(owner, {"instances": 0, "visits_per_event": 0.0, "growth_per_event": 0.0,
                                               "work": 0.0, "stream": node.stream, "state": node.label})
                got["instances"] += cost.instances
                got["visits_per_event"] += cost.visits
                got["growth_per_event"] = max(got["growth_per_event"], growth)
                got["work"] += work
        for sid, got in found.items():
            share = got.pop("work") / total_work if total_work else 0.0
            got["share"] = round(min(share, 1.0), 3)
            got["visits_per_event"] = round(got["visits_per_event"], 1)
            got["growth_per_event"] = round(got["growth_per_event"], 2)
            got["reason"] = (
                f"every {got['stream']} event visits {got['visits_per_event']:.0f} of its instances (about "
                f"{got['share']:.0%} of the engine's work) and it holds {got['growth_per_event']:.2f} more after "
                f"each: its instances at {got['state']} are never released (e.g. a FOLD whose rebind is always "
                "true, or a NEXT that nothing matches). Bound it in time (AND DUR < 1 HOUR), give it a cap "
                "(max_instances in its registration), or delete it")
        self.runaways = found

    # ------------------------------------------------------------------ shedding

    def _shed(self, decisions: list[tuple[str, int, str, bool]]) -> None:
        """Record each ``(sid, keep, reason, shared)`` durably, then apply it;
        without a journal there is no exact replay, and nothing to record."""
        seqs = [0] * len(decisions)
        if self.journal is not None:
            fed = self.progress.fed
            try:
                with self._storing("a shedding of state could not be recorded; it is tried again at the next check"):
                    seqs = self.store.save_evictions([(fed, *d) for d in decisions])
            except DiskFull:  # not applied unrecorded: a replay could not apply it again
                return
        for (sid, keep, why, shared), seq in zip(decisions, seqs):
            self.apply(sid, keep, reason=why, shared=shared)
            if seq:
                self.seq = seq

    def apply(self, sid: str, keep: int, replayed: bool = False, reason: str | None = None,
              shared: bool = True) -> int:
        """``Engine.evict_oldest(sid, keep, shared)``, counted, logged and
        marked: the instances only ``sid`` sees go first, oldest first; then,
        with ``shared`` (the server's budget, which must free memory), if it
        still sees more than ``keep``, the oldest it shares with identical
        subscriptions (merged states), which lose them too and are marked as well."""
        eng = self.engine
        if not eng.has_owner(sid):
            return 0
        losers: dict[str, int] = {}
        before = eng.instance_count(sid)
        removed = eng.evict_oldest(sid, keep, shared=shared, losers=losers)
        if not removed:
            return 0
        self.instances[sid] = before - removed
        self.progress.changes += 1
        self.counters.add(Count.INSTANCES_EVICTED, removed)
        self.counters.add(Count.INSTANCE_EVICTIONS)
        n_shared = sum(losers.values())
        if n_shared:
            self.counters.add(Count.INSTANCES_EVICTED_SHARED, n_shared)
        why = reason or "a shedding recorded before the restart, applied again at the same point"
        self._mark(sid, removed, why)
        for other, n in losers.items():
            self._mark(other, n, f"it shares state with {sid}, which was shed ({why})")
        now, (logged, quiet) = time.monotonic(), self._shed_log.get(sid, (-SHED_LOG_SECONDS, 0))
        if now - logged < SHED_LOG_SECONDS:
            self._shed_log[sid] = (logged, quiet + 1)
        else:
            self._shed_log[sid] = (now, 0)
            log.warning("subscription %s lost its %d oldest instances (of %d): %s%s%s; its witnesses are inexact "
                        "from now on", sid, removed, before, why,
                        " (again, replaying the journal)" if replayed else "",
                        f"; {quiet} more sheddings of it since the last such line ({now - logged:.0f} s ago)"
                        if quiet else "")
        return removed

    def _mark(self, sid: str, lost: int, reason: str) -> None:
        now = time.time()
        got = self.inexact.get(sid)
        if got is None:
            got = self.inexact[sid] = Inexact(now, self.progress.fed, self._seqs().get(sid, 0), 0, reason, now)
        got.instances_lost += lost
        got.reason, got.last = reason, now
        last = self._noticed.get(sid)
        if self.notify is not None and (last is None or time.monotonic() - last >= NOTICE_SECONDS):
            self._noticed[sid] = time.monotonic()
            self.notify(sid, self.notice(sid))

    def notice(self, sid: str, got: Inexact | None = None) -> dict:
        """The control message an inexact subscription's watchers get (``got``: its mark, read by the caller)."""
        got = got or self.inexact[sid]
        return {"control": "inexact", "subscription": sid, **got.public(),
                "message": (f"subscription {sid} lost {got.instances_lost} partial matches (state shed: "
                            f"{got.reason}); its witnesses after seq {got.since_seq} may lack some")}

    # ------------------------------------------------------------------ snapshots

    def export_marks(self) -> dict:
        """The inexact marks, for a snapshot."""
        return {sid: asdict(m) for sid, m in self.inexact.items()}

    def load_marks(self, marks: Mapping[str, dict]) -> None:
        """A snapshot's marks (a replay then adds the sheddings recorded after it)."""
        self.inexact = {sid: Inexact(**m) for sid, m in marks.items()}

    # ------------------------------------------------------------------ display counts

    def refresh(self, now: float) -> None:
        """Recount instances per subscription for the API and /metrics, a few
        subscriptions per loop iteration: at most COUNT_BUDGET_SECONDS of
        engine-thread time per call, and the next full pass no sooner than
        COUNT_PASS_SECONDS after the last began nor before the engine has had
        (1 - COUNT_SHARE) / COUNT_SHARE times the last pass's cost to itself,
        so that counting 100K subscriptions never stalls the events (nor spins
        while the server is idle). It decides nothing (see :meth:`at_check`)."""
        eng = self.engine
        todo = self._count_queue
        if not todo:
            if now < self._count_next_pass:
                return
            self._count_next_pass = now + COUNT_PASS_SECONDS
            self._count_pass_cost = 0.0
            self._pass_heaviest = ("", 0)
            todo.extend(reversed(list(self._subscriptions)))
        perf = time.perf_counter
        start = perf()
        deadline = start + COUNT_BUDGET_SECONDS
        counts = self.instances
        while todo:
            sid = todo.pop()
            if eng.has_owner(sid):
                counts[sid] = n = eng.instance_count(sid)
                if n > self._pass_heaviest[1]:
                    self._pass_heaviest = (sid, n)
            if perf() > deadline:
                break
        self._count_pass_cost += perf() - start
        if not todo:  # pass done: keep the counting's share of the engine thread small
            self.counted_at = time.monotonic()
            self.heaviest = self._pass_heaviest if self._pass_heaviest[1] else None
            self._count_next_pass = max(self._count_next_pass,
                                        now + self._count_pass_cost * (1 - COUNT_SHARE) / COUNT_SHARE)

    def idle(self, now: float) -> float:
        """How long the engine thread may wait for events before the next count is due."""
        return 0.0 if self._count_queue else min(max(self._count_next_pass - now, 0.001), COUNT_PASS_SECONDS)
