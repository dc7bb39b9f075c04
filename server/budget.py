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

What reads the engine's state runs where the engine runs (server/budgetcheck.py:
``BudgetCheck``, on the engine thread or in an engine worker process); this
module is the main process's side: the caps as registered, the records, the
marks and what the API shows. Each shedding is recorded in the store before it
is applied, ``(fed, sid, keep, reason, shared)``, so a recovery replaying the journal applies it again at the
same point (server/durability/recovery.py); the inexact marks travel in the
snapshots. Between checks the engine thread also keeps the instance counts per
subscription the API and /metrics show (:meth:`StateBudget.refresh`, a
background pass on the clock: for display only, it decides nothing).
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass
from typing import Callable, Mapping

from air.engine import Engine
from server.budgetcheck import (CAP_CHECK_EVENTS, CHECK_EVENTS, COUNT_BUDGET_SECONDS, COUNT_SHARE,
                                RUNAWAY_GROWTH, RUNAWAY_VISITS, SHED_TO, BudgetCheck, Cap, CheckResult, Counting,
                                Decision, Outcome)
from server.config import Settings
from server.durability.diskfull import DiskFull
from server.durability.store import Store
from server.observability.counters import Count

log = logging.getLogger("cayuga.daemon")

__all__ = ["CAP_CHECK_EVENTS", "CHECK_EVENTS", "RUNAWAY_GROWTH", "RUNAWAY_VISITS", "SHED_TO", "Cap", "Inexact",
           "StateBudget"]

#: Watchers of an inexact subscription are told again at most this often (seconds).
NOTICE_SECONDS = 10.0
#: Shedding of one subscription is logged at most once per this many seconds.
SHED_LOG_SECONDS = 10.0

#: Instance counts per subscription (API, /metrics): a full pass at most this often ...
COUNT_PASS_SECONDS = 1.0
#: ... taking at most COUNT_BUDGET_SECONDS of engine-thread time per loop iteration ...
#: ... and at most COUNT_SHARE of the engine thread's time overall (with 100K
#: subscriptions a pass costs ~0.2 s, so passes then come every ~4 s).


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


class StateBudget:
    """The main process's side of the state budget (see the module's docstring).

    ``progress`` is the engine thread (``fed``, ``changes``, ``stream_events()``);
    ``recovery`` (wired by the daemon) has the recorded sheddings a replay applies
    again; ``seqs()`` gives each subscription's last witness seq; ``notify(sid,
    message)`` tells a subscription's watchers (wired by the daemon). ``local``
    is the engine's side when the engine runs in this process
    (``engine_workers: 0``); with an engine worker, ``remote`` (wired by the
    engine thread, server/workers/dispatch.py) takes the caps to it, and the
    worker's checks come back through :meth:`on_check`."""

    def __init__(self, engine: Engine, settings: Settings, store: Store, counters, progress,
                 subscriptions: Mapping, storing: Callable, seqs: Callable[[], Mapping[str, int]],
                 local: bool = True) -> None:
        self.engine = engine
        self.settings = settings
        self.store = store
        self.counters = counters
        self.progress = progress
        self.recovery = None  # wired by the daemon
        self.journal = None  # set by the daemon's start() unless durability is off: only then are sheddings recorded
        self.notify: Callable[[str, dict], None] | None = None  # wired by the daemon
        self.remote = None  # an engine worker's link (server/workers/dispatch.py), when the engine runs there
        self._subscriptions = subscriptions
        self._storing = storing
        self._seqs = seqs
        self.max_bytes = settings.max_state_bytes
        self.local = BudgetCheck(engine, self.max_bytes, settings.max_instances_per_subscription) if local else None
        self.caps: dict[str, Cap] = {}  # per subscription, from its registration
        self.footprint: tuple = (0, 0, 0)  # (bytes, instances, nodes) at the last check
        self.inexact: dict[str, Inexact] = {}
        self.runaways: dict[str, dict] = {}  # at the last check: sid -> what it costs
        self._footprints: dict[int, tuple] = {}  # per engine (worker)
        self._runaways: dict[int, dict] = {}
        self.seq = 0  # the last recorded shedding applied (Store.evictions); a snapshot includes those up to it
        self._noticed: dict[str, float] = {}  # sid -> when its watchers were last told
        #: marked since its watchers were last told, their notice held until every engine worker's cut
        #: of the same check is in (:meth:`send_notices`): one notice with all of them, not the first's
        self.unnoticed: dict[str, None] = {}
        self._shed_log: dict[str, tuple[float, int]] = {}  # sid -> (last logged, sheddings not logged since)
        # the display counts (refresh)
        self.instances: dict[str, int] = {}  # per subscription, refreshed by the engine thread
        #: per subscription counted in several engine workers (row-scaled), each one's share at the
        #: last count or cut: a cut in one worker changes its share, and the sum is the count
        self._parts: dict[str, dict[int, int]] = {}
        self._counting: Counting | None = None  # the engine thread's pass under way
        self._asked = False  # an engine worker's counts asked for, not yet answered
        self._count_next_pass = 0.0  # monotonic time
        self.counted_at = time.monotonic()  # when the last full pass of instance counts ended
        self.heaviest: tuple[str, int] | None = None  # the most instances the last full pass found

    # ------------------------------------------------------------------ subscriptions come and go

    def set_cap(self, sid: str, cap: Cap) -> None:
        """A subscription's own limits (None fields: none); on the engine thread."""
        if cap.max_instances is None and cap.max_state_bytes is None:
            self.caps.pop(sid, None)
        else:
            self.caps[sid] = cap
        if self.local is not None:
            self.local.set_cap(sid, cap)
        elif self.remote is not None:
            self.remote.set_cap(sid, cap)

    def forget(self, sid: str) -> None:
        """A subscription has gone (engine thread): its marks go with it."""
        for table in (self.instances, self.caps, self.inexact, self.runaways, self._noticed, self._shed_log,
                      self._parts, self.unnoticed):
            table.pop(sid, None)
        if self.local is not None:
            self.local.forget(sid)

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
        """After a batch, with the engine in this process: the checks due at
        ``fed`` events taken (see the module's docstring)."""
        local = self.local
        if local is None or not any(local.due(fed)):
            return
        recovery = self.recovery
        if recovery is not None and recovery.due:
            recovery.install_due()  # what a replay recorded at this point comes first
        result = local.check(fed, self.progress.stream_events(), self._subscriptions)
        decisions = self.on_check(result, fed)
        for d in decisions:
            self.applied(d, local.apply(d), fed=fed)
        if decisions:
            local.after_shedding()
            self.footprint_of(0, tuple(local.footprint))

    def on_check(self, result: CheckResult, fed: int, worker: int = 0) -> list[Decision]:
        """What a check found (here or in engine worker ``worker``) after ``fed`` events: the
        figures /health shows, and the decisions recorded durably (without a journal there is
        no exact replay, and nothing to record). Returns the decisions to apply:
        none when they could not be recorded (a full disk: the next check
        decides again)."""
        self.footprint_of(worker, tuple(result.footprint))
        self._runaways[worker] = dict(result.runaways)
        self.runaways = {sid: r for part in self._runaways.values() for sid, r in part.items()
                         if sid in self._subscriptions}
        if result.expired:
            self.counters.add(Count.INSTANCES_EXPIRED, result.expired)
        decisions = [Decision(*d) for d in result.decisions]
        if not decisions or self.journal is None:
            return decisions
        try:
            with self._storing("a shedding of state could not be recorded; it is tried again at the next check"):
                seqs = self.store.save_evictions([(fed, *d) for d in decisions])
        except DiskFull:  # not applied unrecorded: a replay could not apply it again
            return []
        self.seq = max(seqs)
        return decisions

    def lost_state(self, sid: str, reason: str, fed: int) -> None:
        """A subscription lost its partial matches other than by shedding (a recovery could
        not load them): marked inexact, as a shedding would (the count unknown: 0)."""
        self._mark(sid, 0, reason, fed)
        self.send_notices()

    def footprint_of(self, worker: int, footprint: tuple) -> None:
        """One engine's (worker's) footprint; :attr:`footprint` is all of them together."""
        self._footprints[worker] = footprint
        self.footprint = tuple(map(sum, zip(*self._footprints.values())))

    def apply(self, sid: str, keep: int, replayed: bool = False, reason: str | None = None,
              shared: bool = True) -> int:
        """Apply a recorded shedding again (a recovery's replay), with the engine in this process."""
        d = Decision(sid, keep, reason or "", shared)
        return self.applied(d, self.local.apply(d), replayed)

    def applied(self, d: Decision, outcome: Outcome, replayed: bool = False, fed: int | None = None,
                worker: int | None = None, notice: bool = True) -> int:
        """A decision was applied (here or in engine worker ``worker``) after ``fed`` events (by
        default, as many as the engine thread has taken): counted, logged and marked. The watchers'
        notice goes now, or with ``notice`` False when :meth:`send_notices` is called (the caller
        waits for the other workers' cuts of the same check)."""
        sid, removed, before, losers = outcome
        if not removed:
            return 0
        parts = self._parts.setdefault(sid, {}) if worker is not None else None
        if parts is not None:  # (``before`` is this worker's share)
            parts[worker] = before - removed
            self.instances[sid] = sum(parts.values())
        else:
            self.instances[sid] = before - removed
        self.progress.changes += 1
        self.counters.add(Count.INSTANCES_EVICTED, removed)
        self.counters.add(Count.INSTANCE_EVICTIONS)
        n_shared = sum(losers.values())
        if n_shared:
            self.counters.add(Count.INSTANCES_EVICTED_SHARED, n_shared)
        why = d.reason or "a shedding recorded before the restart, applied again at the same point"
        fed = self.progress.fed if fed is None else fed
        self._mark(sid, removed, why, fed)
        for other, n in losers.items():
            self._mark(other, n, f"it shares state with {sid}, which was shed ({why})", fed)
        if notice:
            self.send_notices()
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

    def _mark(self, sid: str, lost: int, reason: str, fed: int) -> None:
        now = time.time()
        got = self.inexact.get(sid)
        if got is None:
            got = self.inexact[sid] = Inexact(now, fed, self._seqs().get(sid, 0), 0, reason, now)
        got.instances_lost += lost
        got.reason, got.last = reason, now
        self.unnoticed[sid] = None

    def send_notices(self) -> None:
        """Tell the watchers of each subscription marked since (:meth:`_mark`) what it has lost in
        all, at most once every NOTICE_SECONDS (the mark itself, on /health and the API, is current)."""
        marked, self.unnoticed = self.unnoticed, {}
        if self.notify is None:
            return
        for sid in marked:
            last = self._noticed.get(sid)
            if sid in self.inexact and (last is None or time.monotonic() - last >= NOTICE_SECONDS):
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
        """A snapshot's marks (a replay then adds the sheddings recorded after it); a mark this
        recovery made already (:meth:`lost_state`) stays, its reason the newest."""
        loaded = {sid: Inexact(**m) for sid, m in marks.items()}
        for sid, mine in self.inexact.items():
            if sid in loaded:
                loaded[sid].reason, loaded[sid].last = mine.reason, mine.last
            else:
                loaded[sid] = mine
        self.inexact = loaded

    # ------------------------------------------------------------------ display counts

    def refresh(self, now: float) -> None:
        """Recount instances per subscription for the API and /metrics, a few
        subscriptions per loop iteration: at most COUNT_BUDGET_SECONDS of
        engine-thread time per call, and the next full pass no sooner than
        COUNT_PASS_SECONDS after the last began nor before the engine has had
        (1 - COUNT_SHARE) / COUNT_SHARE times the last pass's cost to itself,
        so that counting 100K subscriptions never stalls the events (nor spins
        while the server is idle). It decides nothing (see :meth:`at_check`)."""
        if self.local is None:
            self._refresh_remote(now)
            return
        counting = self._counting
        if counting is None:
            if now < self._count_next_pass:
                return
            self._count_next_pass = now + COUNT_PASS_SECONDS
            self._counting = counting = Counting(self._subscriptions, self.instances)
        if not counting.step(self.engine, COUNT_BUDGET_SECONDS):
            return
        self._counting = None  # pass done: keep the counting's share of the engine thread small
        self.counted_at = time.monotonic()
        self.heaviest = counting.heaviest
        self._count_next_pass = max(self._count_next_pass,
                                    now + counting.cost * (1 - COUNT_SHARE) / COUNT_SHARE)

    def _refresh_remote(self, now: float) -> None:
        """The counts from an engine worker: one request a pass, its answer taken as it comes."""
        if self.remote is None or now < self._count_next_pass or self._asked:
            return
        self._asked = True  # a request is out

        def got(answer: tuple[dict[str, int], float, dict[str, dict[int, int]]]) -> None:
            counts, cost, parts = answer  # what the counting cost the worker: it keeps to COUNT_SHARE of its time
            self.instances, self._parts = counts, parts
            top = max(counts, key=counts.__getitem__, default=None)  # (C-level: no Python step a subscription)
            self.heaviest = (top, counts[top]) if top is not None and counts[top] else None
            self.counted_at = time.monotonic()
            self._count_next_pass = time.monotonic() + max(COUNT_PASS_SECONDS, cost * (1 - COUNT_SHARE) / COUNT_SHARE)
            self._asked = False

        self._count_next_pass = now + COUNT_PASS_SECONDS
        self.remote.counts(got)

    def idle(self, now: float) -> float:
        """How long the engine thread may wait for events before the next count is due."""
        if self._counting is not None:
            return 0.0
        return min(max(self._count_next_pass - now, 0.001), COUNT_PASS_SECONDS)
