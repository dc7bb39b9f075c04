"""The engine's side of the state budget (server/budget.py): what must run
where the engine runs — on the engine thread, or in an engine worker process
(server/workers/) — because it reads the engine's state.

:class:`BudgetCheck` finds, at a check point, what to drop and whom to shed:
it drops expired instances (air/engine/footprint.py), measures the state,
names the runaways and decides the sheddings (``Decision``), which it does
not apply: the main process records each one durably first, then has it
applied (:meth:`BudgetCheck.apply`), so a recovery can apply it again at the
same point. Everything it decides depends only on the engine's state and the
events taken, never on a clock.
"""

from __future__ import annotations

import math
import time
from typing import Callable, Iterable, Mapping, NamedTuple

from air.engine import Engine
from air.engine import footprint

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
#: Instance counts per subscription for the API and /metrics are made at most this many
#: seconds at a time, between events (the engine thread's, server/budget.py, and an engine
#: worker's, server/workers/worker.py).
COUNT_BUDGET_SECONDS = 0.002
#: ... and take at most this share of that thread's time, or that worker's.
COUNT_SHARE = 0.05


class Counting:
    """A pass of instance counts over subscriptions (/health, /metrics, the API), made a slice
    at a time between events: the engine thread's (server/budget.py) and an engine worker's
    (command ``counts``, server/workers/worker.py). Counted at once, 10,000 subscriptions held
    a worker's events 40-60 ms every second; in slices back to back, the pass took the worker's
    core for 50 ms (BENCHMARKS.md, "Engine workers, round 26"). Each count is its
    subscription's when it was counted; one removed meanwhile is left out, one added meanwhile
    waits for the next pass. ``counts``: the table the counts go into (a new one if None)."""

    def __init__(self, owners: Iterable[str], counts: dict[str, int] | None = None) -> None:
        self.todo = list(owners)[::-1]
        self.counts: dict[str, int] = {} if counts is None else counts
        self.cost = 0.0  # seconds of counting so far
        self.top: tuple[str, int] = ("", 0)  # the most instances counted in this pass, and whose (the first of equals)
        #: time.perf_counter() when the next slice is due: the counting's own time over COUNT_SHARE after
        #: the last slice began, so that it takes at most that share of its thread
        self.next_at = 0.0

    def step(self, eng: Engine, budget: float) -> bool:
        """Count for about ``budget`` seconds at most (a subscription at least); True when the pass is done."""
        perf = time.perf_counter
        start = perf()
        deadline, todo, counts = start + budget, self.todo, self.counts
        top = self.top
        while todo:
            owner = todo.pop()
            if eng.has_owner(owner):
                counts[owner] = n = eng.instance_count(owner)
                if n > top[1]:
                    top = (owner, n)
            if perf() > deadline:
                break
        took = perf() - start
        self.top = top
        self.cost += took
        self.next_at = start + took / COUNT_SHARE
        return not todo

    @property
    def heaviest(self) -> tuple[str, int] | None:
        """The subscription with the most instances this pass counted, and how many; None if none had any."""
        return self.top if self.top[1] else None


class Cap(NamedTuple):
    """A subscription's own limits (its registration body), or None for no limit,
    in force from ``since`` events taken on."""

    max_instances: int | None = None
    max_state_bytes: int | None = None
    since: int = 0


class Decision(NamedTuple):
    """Shed ``sid`` down to ``keep`` instances (as it sees them); ``shared``:
    instances identical subscriptions see too may go (the budget), or not (a cap)."""

    sid: str
    keep: int
    reason: str
    shared: bool


class Outcome(NamedTuple):
    """What applying a decision removed: of ``sid`` itself, and from each other
    subscription that shared the instances (``losers``)."""

    sid: str
    removed: int
    before: int
    losers: dict


class CheckResult(NamedTuple):
    """What a check found: the footprint (bytes, instances, nodes), instances
    expired, the runaways (sid -> what it costs) and the decisions."""

    footprint: tuple
    expired: int
    runaways: dict
    decisions: list


class BudgetCheck:
    """See the module's docstring. ``owners()`` gives the subscriptions in
    registration order (ties go to the earlier one)."""

    def __init__(self, engine: Engine, max_bytes: int, default_cap: int,
                 shares: Callable[[str], int] | None = None) -> None:
        self.engine = engine
        self.max_bytes = max_bytes
        self.default_cap = default_cap  # max_instances_per_subscription (0: none)
        #: how many engines hold a subscription's instances (a row-scaled one's key groups: each of N
        #: engine workers holds 1/N of its cap, so that the cap holds for the subscription); None: one
        self.shares = shares
        self.caps: dict[str, Cap] = {}
        self.footprint = footprint.Footprint(0, 0, 0)
        self.runaways: dict[str, dict] = {}
        self._heavy_prev: dict[int, tuple[int, int]] = {}  # id(node) -> (instances, its stream's events)
        self._heavy_nodes: dict[int, tuple] = {}  # id(node) -> (node, its stream's events) of the last check
        self._stream_prev: dict[str, int] = {}

    def set_cap(self, sid: str, cap: Cap) -> None:
        if cap.max_instances is None and cap.max_state_bytes is None:
            self.caps.pop(sid, None)
        else:
            self.caps[sid] = cap

    def forget(self, sid: str) -> None:
        self.caps.pop(sid, None)
        self.runaways.pop(sid, None)

    def capped(self) -> bool:
        return bool(self.caps) or self.default_cap > 0

    def until_check(self, fed: int) -> int:
        """Events the engine may take before the next check (the batch ends there)."""
        n = CHECK_EVENTS - fed % CHECK_EVENTS
        if self.capped():
            n = min(n, CAP_CHECK_EVENTS - fed % CAP_CHECK_EVENTS)
        return n

    def due(self, fed: int) -> tuple[bool, bool]:
        """Whether the full check and the caps' check are due after ``fed`` events."""
        if not fed:
            return False, False
        return fed % CHECK_EVENTS == 0, self.capped() and fed % CAP_CHECK_EVENTS == 0

    def check(self, fed: int, stream_events: Mapping[str, int], owners: Iterable[str]) -> CheckResult | None:
        """The checks due at ``fed`` (None when none is): ``stream_events``, the
        events taken per input stream so far (the runaways' growth is per event
        of their stream)."""
        full, capped = self.due(fed)
        if not (full or capped):
            return None
        # (listed only by a step that needs them: with 10,000 subscriptions the list and its set were
        # two thirds of a check whose survey found nothing to shed; BENCHMARKS.md, round 35)
        listed = _Listed(owners, self.engine)
        decisions: list[Decision] = []
        expired = 0
        if full:
            expired, decisions = self._check_budget(stream_events, listed)
        if capped:
            shed = {d.sid for d in decisions}
            decisions += [d for d in self._check_caps(fed, listed.list()) if d.sid not in shed]
        return CheckResult(tuple(self.footprint), expired, dict(self.runaways), decisions)

    def _check_budget(self, events: Mapping[str, int], owners: "_Listed") -> tuple[int, list[Decision]]:
        eng = self.engine
        weights = {s: n - self._stream_prev.get(s, 0) for s, n in events.items()}
        found = footprint.survey(eng, expire=True, heavy=RUNAWAY_VISITS / 2)  # candidates, to see them grow
        self.footprint = found.footprint
        self._find_runaways(found.heavy, events, weights, owners)
        self._stream_prev = dict(events)
        if found.footprint.bytes <= self.max_bytes:
            return found.expired, []
        need = found.footprint.bytes - int(self.max_bytes * SHED_TO)
        sizes = []
        for i, sid in enumerate(owners.list()):
            n, b = footprint.owner_footprint(eng, sid)
            if n:
                sizes.append((-b, i, sid, n, b))
        sizes.sort()
        out = []
        for _nb, _i, sid, n, b in sizes:
            if need <= 0:
                break
            per = b / n
            lose = min(n, math.ceil(min(b, need) / per))
            need -= lose * per
            out.append(Decision(sid, n - lose, f"the server's state budget (max_state_bytes {self.max_bytes} bytes) "
                                               f"was exceeded ({found.footprint.bytes} bytes estimated); this "
                                               f"subscription held the most ({b} bytes, {n} instances)", True))
        return found.expired, out

    def _check_caps(self, fed: int, owners: list[str]) -> list[Decision]:
        """Subscriptions above their own cap, counted by the instances only they
        see: a cap sheds nothing an identical subscription (a merged state) sees
        too, which would cost that one its results and free no memory."""
        eng, default = self.engine, self.default_cap
        out = []
        for sid in (owners if default > 0 else [o for o in owners if o in self.caps]):
            cap = self.caps.get(sid, Cap())
            if cap.since > fed:  # a replay, before the point the cap came into force
                cap = Cap()
            limit = cap.max_instances if cap.max_instances is not None else (default or None)
            if limit is None and cap.max_state_bytes is None:
                continue
            parts = self.shares(sid) if self.shares is not None else 1
            mine, my_bytes = limit, cap.max_state_bytes
            if parts > 1:  # this engine's share of the cap
                mine = -(-limit // parts) if limit is not None else None
                my_bytes = -(-my_bytes // parts) if my_bytes is not None else None
            n, b = footprint.owner_footprint(eng, sid, exclusive=True)
            keep, why = n, ""
            if mine is not None and n > mine:
                keep = int(mine * SHED_TO)
                why = (f"its max_instances ({limit}{_share(mine, parts)})" if cap.max_instances is not None
                       else f"max_instances_per_subscription ({limit}{_share(mine, parts)})")
            if my_bytes is not None and b > my_bytes and n:
                by_bytes = int(my_bytes * SHED_TO / (b / n))
                if by_bytes < keep:
                    keep, why = by_bytes, f"its max_state_bytes ({cap.max_state_bytes}{_share(my_bytes, parts)})"
            if keep < n:
                seen = eng.instance_count(sid)
                out.append(Decision(sid, seen - (n - keep), f"it held {n} instances ({b} bytes), above {why}", False))
        return out

    def _find_runaways(self, heavy: list, events: Mapping[str, int], weights: Mapping[str, int],
                       owners: "_Listed") -> None:
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
                if owner not in owners.set():
                    continue
                got = found.setdefault(owner, {"instances": 0, "visits_per_event": 0.0, "growth_per_event": 0.0,
                                               "work": 0.0, "stream": node.stream, "state": node.label})
                got["instances"] += cost.instances
                got["visits_per_event"] += cost.visits
                got["growth_per_event"] = max(got["growth_per_event"], growth)
                got["work"] += work
        for _sid, got in found.items():
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

    def apply(self, d: Decision) -> Outcome:
        """``Engine.evict_oldest(sid, keep, shared)``: the instances only ``sid``
        sees go first, oldest first; then, with ``shared``, if it still sees more
        than ``keep``, the oldest it shares with identical subscriptions (merged
        states), which lose them too (``losers``)."""
        eng = self.engine
        if not eng.has_owner(d.sid):
            return Outcome(d.sid, 0, 0, {})
        losers: dict[str, int] = {}
        before = eng.instance_count(d.sid)
        removed = eng.evict_oldest(d.sid, d.keep, shared=d.shared, losers=losers)
        return Outcome(d.sid, removed, before, losers)

    def after_shedding(self) -> None:
        """What is left, as /health and /metrics show it; the runaways grow from here."""
        self.footprint = footprint.measure(self.engine)
        for key, (node, seen) in self._heavy_nodes.items():
            self._heavy_prev[key] = (node.count + len(node.pending), seen)


class _Listed:
    """The subscriptions a check is of (those of ``owners`` the engine holds), listed when a step
    first asks (:meth:`list`, in their order; :meth:`set`), not at every check."""

    __slots__ = ("owners", "engine", "_list", "_set")

    def __init__(self, owners: Iterable[str], engine: Engine) -> None:
        self.owners, self.engine = owners, engine
        self._list: list[str] | None = None
        self._set: set[str] | None = None

    def list(self) -> list[str]:
        if self._list is None:
            has = self.engine.has_owner
            self._list = [o for o in self.owners if has(o)]
        return self._list

    def set(self) -> set[str]:
        if self._set is None:
            self._set = set(self.list())
        return self._set


def _share(share, parts: int) -> str:
    """How a cap is split, in its reason's words ('' when one engine holds it all)."""
    return f"; {share} in each of the {parts} engine workers its key groups run on" if parts > 1 else ""
