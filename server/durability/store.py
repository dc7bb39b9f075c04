"""Persistence of stream declarations and subscriptions in SQLite under the data
directory, so that a restarted server comes back with the same ids; and of
compiled CEL query shapes, so that it comes back without compiling them again."""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

SCHEMA = """
CREATE TABLE IF NOT EXISTS streams (
    name TEXT PRIMARY KEY,
    attributes TEXT NOT NULL,          -- JSON list of [name, type]
    created REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS subscriptions (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT UNIQUE NOT NULL,
    kind TEXT NOT NULL CHECK (kind IN ('cel', 'air', 'sase')),
    text TEXT NOT NULL,
    name TEXT,
    created REAL NOT NULL,
    shape TEXT,                        -- CEL of a cached shape: the shape's id (air/cel/shapes.py:shape_id) ...
    constants TEXT,                    -- ... and the query's constants and PUBLISH names, JSON (its binding)
    installed_at INTEGER,              -- events the engine had taken when it was installed (see daemon)
    fresh INTEGER NOT NULL DEFAULT 0,  -- 1: installed afresh once the next recovery's replay is over
    seq_base INTEGER                   -- its last witness seq when it was installed afresh at installed_at
);
CREATE TABLE IF NOT EXISTS shapes (    -- compiled CEL query shapes (air/cel/shapes.py), JSON
    key TEXT PRIMARY KEY,               -- includes the compiler's version
    form TEXT NOT NULL,
    saved REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS evictions (  -- sheddings of state (server/budget.py), for an exact replay
    seq INTEGER PRIMARY KEY AUTOINCREMENT,  -- never reused: snapshots name the last one they include
    fed INTEGER NOT NULL,              -- events the engine had taken when it was applied (see daemon)
    sid TEXT NOT NULL,
    keep INTEGER NOT NULL,             -- Engine.evict_oldest(sid, keep, shared=True)
    created REAL NOT NULL,
    reason TEXT,                       -- why (the budget, a cap); NULL in older rows
    shared INTEGER NOT NULL DEFAULT 1  -- 0: a cap (Engine.evict_oldest(..., shared=False))
);
CREATE TABLE IF NOT EXISTS placement (  -- the engine worker each subscription runs on (server/workers/placement.py)
    sid TEXT PRIMARY KEY,
    worker INTEGER NOT NULL,
    workers INTEGER NOT NULL           -- engine_workers when it was placed (another count places afresh)
);
CREATE TABLE IF NOT EXISTS caps (      -- a subscription's own limits on its state (its registration body)
    sid TEXT PRIMARY KEY,
    max_instances INTEGER,
    max_state_bytes INTEGER,
    since INTEGER NOT NULL DEFAULT 0   -- events the engine had taken when they came into force (exact replays)
);
CREATE TABLE IF NOT EXISTS counters (
    key TEXT PRIMARY KEY,
    value INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS owners (    -- the auth token (its name, never its secret) that registered each
    sid TEXT PRIMARY KEY,              -- subscription (server/security: tokens limited to their own)
    token TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS config_streams (  -- the configuration's streams at the last start (schema changes)
    name TEXT PRIMARY KEY,
    attributes TEXT NOT NULL           -- JSON list of [name, type]
);
CREATE TABLE IF NOT EXISTS broken (    -- stored subscriptions that no longer compile: kept, not run
    sid TEXT PRIMARY KEY,
    reason TEXT NOT NULL,
    since REAL NOT NULL,
    upstream TEXT,                     -- the broken subscription whose outputs it reads, if that is why
    schemas TEXT                       -- JSON: what it read and published when it last ran (schemacheck.py)
);
CREATE TABLE IF NOT EXISTS backfills (  -- a subscription registered with "from" (docs/design/backfill.md)
    sid TEXT PRIMARY KEY,
    record TEXT NOT NULL               -- JSON: from, to, state ("running" ... "live"), cut, ...
);
CREATE TABLE IF NOT EXISTS witness_base (  -- each subscription's last witness seq when the journal began
    sid TEXT PRIMARY KEY,
    seq INTEGER NOT NULL
);
"""


#: Columns added to a table since its first version: (table, column, declaration).
#: A store made before them gets them (empty) when opened.
ADDED_COLUMNS = [
    ("subscriptions", "shape", "TEXT"),
    ("subscriptions", "constants", "TEXT"),
    ("subscriptions", "installed_at", "INTEGER"),
    ("evictions", "reason", "TEXT"),
    ("evictions", "shared", "INTEGER NOT NULL DEFAULT 1"),
    ("subscriptions", "fresh", "INTEGER NOT NULL DEFAULT 0"),
    ("subscriptions", "seq_base", "INTEGER"),
]


@dataclass(frozen=True)
class StoredSubscription:
    id: str
    kind: str
    text: str
    name: str | None
    created: float
    #: the binding of a CEL query of a cached shape (ShapeCache.compile_keyed): a restore binds
    #: it without reading the text when the stored shape is still valid; None in older rows
    shape: str | None = None
    constants: str | None = None
    #: how many events the engine had taken when the subscription was installed: a
    #: recovery that replays the journal installs it again at that point (None: before any)
    installed_at: int | None = None
    #: to be installed afresh once the next recovery's replay is over (its streams' schemas changed)
    fresh: bool = False
    #: its last witness seq when it was last installed afresh (at installed_at): numbered on from there
    seq_base: int | None = None
    #: registered with "from": its backfill's record (server/backfill/manager.py), else None
    backfill: dict | None = None


@dataclass(frozen=True)
class BrokenRow:
    """A stored subscription that no longer compiles (server/subscriptions/broken.py)."""

    sid: str
    reason: str
    since: float
    upstream: str | None = None
    schemas: str | None = None

class Store:
    """A small thread-safe SQLite store (one connection, one lock)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(str(self.path), check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.executescript(SCHEMA)
        self._migrate()

    def _migrate(self) -> None:
        for table, column, decl in ADDED_COLUMNS:
            have = {r[1] for r in self._db.execute(f"PRAGMA table_info({table})").fetchall()}
            if column not in have:
                self._db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {decl}")
        self._widen_kinds()

    def _widen_kinds(self) -> None:
        """A store made before SASE subscriptions checks ``kind IN ('cel', 'air')``,
        which SQLite cannot alter: the table is copied into one with the current
        check (rows, their order and the ids counter unchanged), in one transaction."""
        sql = self._db.execute("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'subscriptions'"
                               ).fetchone()[0]
        if "'sase'" in sql:
            return
        create = SCHEMA[SCHEMA.index("CREATE TABLE IF NOT EXISTS subscriptions ("):]
        create = create[:create.index(");") + 2].replace("IF NOT EXISTS subscriptions (", "subscriptions_new (")
        columns = "seq, id, kind, text, name, created, shape, constants, installed_at, fresh, seq_base"
        with self._tx() as db:
            db.execute(create)
            db.execute(f"INSERT INTO subscriptions_new ({columns}) SELECT {columns} FROM subscriptions")
            db.execute("DROP TABLE subscriptions")
            db.execute("ALTER TABLE subscriptions_new RENAME TO subscriptions")

    def close(self) -> None:
        with self._lock:
            self._db.close()

    @contextmanager
    def _tx(self):
        """One write transaction under the lock; rolled back when anything in
        it fails, the COMMIT included (SQLite may leave a transaction open
        after "database or disk is full")."""
        with self._lock:
            self._db.execute("BEGIN")
            try:
                yield self._db
                self._db.execute("COMMIT")
            except BaseException:
                if self._db.in_transaction:
                    try:
                        self._db.execute("ROLLBACK")
                    except sqlite3.Error:
                        pass
                raise

    def probe(self) -> bool:
        """Whether a small write to the store works now (False: it failed,
        or the store was busy for a moment)."""
        if not self._lock.acquire(timeout=0.2):
            return False
        try:
            self._db.execute("INSERT INTO counters VALUES ('write_probe', 1) "
                             "ON CONFLICT(key) DO UPDATE SET value = value + 1")
            return True
        except sqlite3.Error:
            return False
        finally:
            self._lock.release()

    # -- witness numbering
    def set_witness_base(self, seqs: dict[str, int]) -> None:
        """Record each subscription's last witness seq as the journal begins
        (replacing what was recorded): a replay from the journal's first record
        numbers the witnesses it gives from there."""
        with self._tx():
            self._db.execute("DELETE FROM witness_base")
            self._db.executemany("INSERT INTO witness_base VALUES (?, ?)", list(seqs.items()))

    def witness_base(self) -> dict[str, int]:
        with self._lock:
            return dict(self._db.execute("SELECT sid, seq FROM witness_base").fetchall())

    # -- streams
    def save_stream(self, name: str, attributes: list[tuple[str, str]]) -> None:
        with self._lock:
            self._db.execute("INSERT OR REPLACE INTO streams VALUES (?, ?, ?)",
                             (name, json.dumps(attributes), time.time()))

    def streams(self) -> list[tuple[str, list[tuple[str, str]]]]:
        with self._lock:
            rows = self._db.execute("SELECT name, attributes FROM streams ORDER BY created, name").fetchall()
        return [(n, [tuple(a) for a in json.loads(attrs)]) for n, attrs in rows]

    # -- subscriptions
    def next_id(self) -> str:
        """A new subscription id, never reused, even across restarts."""
        with self._lock:
            self._db.execute("INSERT INTO counters VALUES ('subscription', 1) "
                             "ON CONFLICT(key) DO UPDATE SET value = value + 1")
            (n,) = self._db.execute("SELECT value FROM counters WHERE key = 'subscription'").fetchone()
        return f"s{n}"

    def peek_ids(self, n: int) -> list[str]:
        """The next ``n`` subscription ids, not yet taken: :meth:`save_subscriptions`
        takes them. The caller makes sure no one else takes ids meanwhile."""
        with self._lock:
            row = self._db.execute("SELECT value FROM counters WHERE key = 'subscription'").fetchone()
        last = row[0] if row else 0
        return [f"s{last + i}" for i in range(1, n + 1)]

    def save_subscription(self, sub: StoredSubscription) -> None:
        self.save_subscriptions([sub])

    def save_subscriptions(self, subs: list[StoredSubscription]) -> None:
        """Store ``subs`` in one transaction, and take their ids (``sN``) for good."""
        taken = _last_number(s.id for s in subs)
        with self._tx():
            self._db.executemany("INSERT INTO subscriptions (id, kind, text, name, created, shape, constants, "
                                 "installed_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                                 [(s.id, s.kind, s.text, s.name, s.created, s.shape, s.constants, s.installed_at)
                                  for s in subs])
            if taken:
                self._take_ids(taken)

    def retire_ids(self, ids: list[str]) -> None:
        """Take ``ids`` for good without storing a subscription under them: those of a refused
        batch that events had already reached (their witnesses are in the log under them), so that
        no later subscription is given one of them and its witnesses."""
        taken = _last_number(ids)
        if taken:
            with self._tx():
                self._take_ids(taken)

    def _take_ids(self, last: int) -> None:
        """(In a transaction) the ids up to ``sN``, ``N`` = ``last``, are taken."""
        self._db.execute("INSERT INTO counters VALUES ('subscription', ?) "
                         "ON CONFLICT(key) DO UPDATE SET value = max(value, excluded.value)", (last,))

    def save_bindings(self, rows: list[tuple[tuple[str | None, str | None], str]]) -> None:
        """Store ``((shape, constants), id)`` of subscriptions restored from their text."""
        if not rows:
            return
        with self._tx():
            self._db.executemany("UPDATE subscriptions SET shape = ?, constants = ? WHERE id = ?",
                                 [(sh, c, sid) for (sh, c), sid in rows])

    def delete_subscription(self, sid: str) -> None:
        self.delete_subscriptions([sid])

    def delete_subscriptions(self, sids: list[str]) -> None:
        """Delete the rows of ``sids`` (and their caps) in one transaction (all or none)."""
        with self._tx():
            self._db.executemany("DELETE FROM subscriptions WHERE id = ?", [(sid,) for sid in sids])
            self._db.executemany("DELETE FROM caps WHERE sid = ?", [(sid,) for sid in sids])
            self._db.executemany("DELETE FROM placement WHERE sid = ?", [(sid,) for sid in sids])
            self._db.executemany("DELETE FROM owners WHERE sid = ?", [(sid,) for sid in sids])
            self._db.executemany("DELETE FROM broken WHERE sid = ?", [(sid,) for sid in sids])
            self._db.executemany("DELETE FROM backfills WHERE sid = ?", [(sid,) for sid in sids])

    def subscriptions(self) -> list[StoredSubscription]:
        with self._lock:
            rows = self._db.execute("SELECT id, kind, text, name, created, shape, constants, installed_at, fresh, "
                                    "seq_base, b.record FROM subscriptions LEFT JOIN backfills b ON b.sid = id "
                                    "ORDER BY seq").fetchall()
        return [StoredSubscription(*r[:8], bool(r[8]), r[9], json.loads(r[10]) if r[10] else None) for r in rows]

    def save_backfilled(self, sub: StoredSubscription, record: dict) -> None:
        """Store a subscription registered with "from" and its backfill's record, in one transaction."""
        with self._tx():
            self._db.execute("INSERT INTO subscriptions (id, kind, text, name, created) VALUES (?, ?, ?, ?, ?)",
                             (sub.id, sub.kind, sub.text, sub.name, sub.created))
            self._db.execute("INSERT OR REPLACE INTO backfills VALUES (?, ?)", (sub.id, json.dumps(record)))
            if sub.id[:1] == "s" and sub.id[1:].isdigit():
                self._db.execute("INSERT INTO counters VALUES ('subscription', ?) "
                                 "ON CONFLICT(key) DO UPDATE SET value = max(value, excluded.value)",
                                 (int(sub.id[1:]),))

    def save_backfill(self, sid: str, record: dict, installed_at: int | None = None) -> None:
        """A backfill's record changed (and, at its hand-over, where it joined the live engine)."""
        with self._tx():
            self._db.execute("UPDATE backfills SET record = ? WHERE sid = ?", (json.dumps(record), sid))
            if installed_at is not None:
                self._db.execute("UPDATE subscriptions SET installed_at = ? WHERE id = ?", (installed_at, sid))

    def installed_fresh(self, sid: str, installed_at: int, seq_base: int) -> None:
        """``sid`` was installed afresh at ``installed_at`` (events taken) with its last witness
        seq ``seq_base``: no longer fresh, nor broken."""
        with self._tx():
            self._db.execute("UPDATE subscriptions SET fresh = 0, installed_at = ?, seq_base = ? WHERE id = ?",
                             (installed_at, seq_base, sid))
            self._db.execute("DELETE FROM broken WHERE sid = ?", (sid,))

    # -- what the server last started with, and what no longer compiles (server/subscriptions/schemacheck.py)
    def config_streams(self) -> dict[str, list[tuple[str, str]]] | None:
        """The configuration's streams at the last start (None: not recorded yet)."""
        with self._lock:
            if self._db.execute("SELECT 1 FROM counters WHERE key = 'config_streams'").fetchone() is None:
                return None
            rows = self._db.execute("SELECT name, attributes FROM config_streams").fetchall()
        return {n: [tuple(a) for a in json.loads(attrs)] for n, attrs in rows}

    def started_with(self, streams: dict[str, list[tuple[str, str]]], fresh: list[str],
                     broken: list[BrokenRow]) -> None:
        """Record the configuration's streams of this start, with the subscriptions
        it installs afresh and those it finds broken, in one transaction."""
        with self._tx() as db:
            db.execute("DELETE FROM config_streams")
            db.executemany("INSERT INTO config_streams VALUES (?, ?)",
                           [(n, json.dumps(attrs)) for n, attrs in streams.items()])
            db.execute("INSERT INTO counters VALUES ('config_streams', 1) ON CONFLICT(key) DO NOTHING")
            db.executemany("UPDATE subscriptions SET fresh = 1 WHERE id = ?", [(sid,) for sid in fresh])
            db.executemany("INSERT OR REPLACE INTO broken VALUES (?, ?, ?, ?, ?)",
                           [(b.sid, b.reason, b.since, b.upstream, b.schemas) for b in broken])

    def broken(self) -> dict[str, BrokenRow]:
        with self._lock:
            rows = self._db.execute("SELECT sid, reason, since, upstream, schemas FROM broken").fetchall()
        return {r[0]: BrokenRow(*r) for r in rows}

    def save_broken(self, rows: list[BrokenRow]) -> None:
        with self._tx() as db:
            db.executemany("INSERT OR REPLACE INTO broken VALUES (?, ?, ?, ?, ?)",
                           [(b.sid, b.reason, b.since, b.upstream, b.schemas) for b in rows])

    # -- sheddings of state (server/budget.py)
    def save_evictions(self, rows: list[tuple]) -> list[int]:
        """Store ``(fed, sid, keep[, reason[, shared]])`` sheddings in one
        transaction (durable before they are applied); returns their sequence
        numbers, in order."""
        now = time.time()
        seqs = []
        with self._tx():
            for fed, sid, keep, *rest in rows:
                why, shared = (list(rest) + [None, True])[:2]
                cur = self._db.execute("INSERT INTO evictions (fed, sid, keep, created, reason, shared) "
                                       "VALUES (?, ?, ?, ?, ?, ?)", (fed, sid, keep, now, why, int(bool(shared))))
                seqs.append(cur.lastrowid)
        return seqs

    def evictions(self, after: int = 0) -> list[tuple[int, int, str, int, str | None, int]]:
        """``(seq, fed, sid, keep, reason, shared)`` of the sheddings after sequence number ``after``, in order."""
        with self._lock:
            return self._db.execute("SELECT seq, fed, sid, keep, reason, shared FROM evictions WHERE seq > ? "
                                    "ORDER BY seq", (after,)).fetchall()

    # -- where each subscription runs (engine workers)
    def save_placements(self, placed: list[tuple[str, int]], workers: int) -> None:
        """Where each ``(sid, worker)`` of ``placed`` runs, with ``workers`` engine workers: one transaction."""
        with self._tx():
            self._db.executemany("INSERT OR REPLACE INTO placement (sid, worker, workers) VALUES (?, ?, ?)",
                                 [(sid, worker, workers) for sid, worker in placed])

    def placements(self, workers: int) -> dict[str, int]:
        """sid -> worker of the subscriptions placed when there were ``workers`` engine workers."""
        with self._lock:
            return {sid: w for sid, w in self._db.execute("SELECT sid, worker FROM placement WHERE workers = ?",
                                                          (workers,))}

    # -- a subscription's own caps
    def save_cap(self, sid: str, max_instances: int | None, max_state_bytes: int | None, since: int) -> None:
        with self._tx():
            self._db.execute("INSERT OR REPLACE INTO caps (sid, max_instances, max_state_bytes, since) "
                             "VALUES (?, ?, ?, ?)", (sid, max_instances, max_state_bytes, since))

    def caps(self) -> dict[str, tuple[int | None, int | None, int]]:
        """sid -> (max_instances, max_state_bytes, since) of the subscriptions that set them."""
        with self._lock:
            return {sid: (a, b, c) for sid, a, b, c in self._db.execute(
                "SELECT sid, max_instances, max_state_bytes, since FROM caps")}

    # -- who registered each subscription (server/security/owners.py)
    def save_owners(self, rows: list[tuple[str, str]]) -> None:
        """Store ``(sid, token name)`` rows in one transaction."""
        with self._tx():
            self._db.executemany("INSERT OR REPLACE INTO owners (sid, token) VALUES (?, ?)", rows)

    def owners(self) -> dict[str, str]:
        """sid -> the name of the token that registered it (subscriptions registered with a token)."""
        with self._lock:
            return dict(self._db.execute("SELECT sid, token FROM owners"))

    def last_eviction(self) -> int:
        """The sequence number of the last eviction ever stored (0: none)."""
        with self._lock:
            row = self._db.execute("SELECT seq FROM sqlite_sequence WHERE name = 'evictions'").fetchone()
        return row[0] if row else 0

    def prune_evictions(self, upto: int) -> None:
        """Forget the evictions every kept snapshot includes (sequence numbers up to ``upto``)."""
        with self._lock:
            self._db.execute("DELETE FROM evictions WHERE seq <= ?", (upto,))

    # -- compiled query shapes
    def save_shapes(self, rows: list[tuple[str, str]]) -> None:
        if not rows:
            return
        now = time.time()
        with self._tx():
            self._db.executemany("INSERT OR REPLACE INTO shapes VALUES (?, ?, ?)", [(k, f, now) for k, f in rows])

    def shapes(self) -> list[tuple[str, str]]:
        """(key, form) of the stored shapes, oldest first."""
        with self._lock:
            return self._db.execute("SELECT key, form FROM shapes ORDER BY saved").fetchall()

    def keep_shapes(self, keys: set[str]) -> None:
        """Forget every stored shape but ``keys`` (those of another compiler
        version, or beyond what the cache holds)."""
        with self._lock:
            stored = [k for (k,) in self._db.execute("SELECT key FROM shapes").fetchall()]
        gone = [(k,) for k in stored if k not in keys]
        if gone:
            with self._tx():
                self._db.executemany("DELETE FROM shapes WHERE key = ?", gone)


def _last_number(ids) -> int:
    """The largest ``N`` of the ids ``sN`` among ``ids`` (0: none)."""
    return max((int(sid[1:]) for sid in ids if sid[:1] == "s" and sid[1:].isdigit()), default=0)
