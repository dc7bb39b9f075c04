"""A property of recovery, on real ``cayuga serve`` processes: recover, then
continue, equals the uninterrupted run — every subscription's witnesses,
with their numbers.

Each case is drawn from a seed: a stream of Stock ticks (many simultaneous),
subscriptions registered and deleted at points of the stream (NEXT, FOLD, a
filter and a chain reading its output, and duplicates of one another, whose
states are merged), and kill points. The case runs twice on fresh data
directories: once without a kill, once killed with SIGKILL at each kill point
(right after a block of events is sent, so the kill lands while they are
being journaled and processed) and started again, sometimes with the
journal's or the witness log's last record torn, as a kill during a write or
a full disk leaves it. A sender with a ``#sender`` id sends the events; after
a restart it resumes from the server's ``#resume N``, as ``cayuga send``
does. Registrations and deletions happen once the engine has taken every
event before their point (``events_taken`` in /health), in both runs.

Then every live subscription's witnesses as the server serves them from its
witness log (``?from=1``: seq and payload) must be the same in both runs.

Half the cases run at the shipped defaults (no snapshot within a case: every
restart replays the journal from its first record), half with a snapshot
every 200 events. ``CAYUGA_RECOVERY_SEED`` replays a case (the seed of each is
printed); ``CAYUGA_RECOVERY_CASES`` (default 3) draws more (the long profile:
``CAYUGA_RECOVERY_CASES=40``).
"""

from __future__ import annotations

import json
import os
import random
from dataclasses import dataclass
from pathlib import Path

import pytest

from clients.client import TcpSender
from clients.testing import UP
from tests.server.conftest import NUMBERED_OTHERWISE
from tests.server.test_crash import Server, wait_for

CASES = int(os.environ.get("CAYUGA_RECOVERY_CASES", "3"))
FIXED_SEED = os.environ.get("CAYUGA_RECOVERY_SEED")
SEEDS = [int(FIXED_SEED)] if FIXED_SEED else [random.randrange(1 << 30) for _ in range(CASES)]

#: The subscriptions a case draws from; "big_pair" reads "big"'s output (registered after it, deleted with it).
POOL = {
    "rising": "SELECT Name, Price_1 AS Before, Price AS After FROM Stock "
              "NEXT{$1.Name = $2.Name AND $2.Price >= 1.02 * $1.Price} Stock PUBLISH Rising<n>",
    "climb": "SELECT * FROM (SELECT Name, Price FROM FILTER{Volume >= 500}(Stock)) "
             "FOLD{$1.Name = $2.Name, $2.Price > $.Price AND DUR < 40,} "
             "(SELECT Name, Price FROM FILTER{Volume >= 500}(Stock)) PUBLISH Climb<n>",
    "big": "SELECT Name, Price FROM FILTER{Volume >= 800}(Stock) PUBLISH Big<n>",
    "big_pair": "SELECT Name, Price_1 AS First, Price AS Second FROM Big<src> NEXT{$1.Name = $2.Name} Big<src> "
                "PUBLISH BigPair<n>",
}


@dataclass
class Case:
    seed: int
    lines: list[str]
    ops: list[tuple[int, str, str]]  # (event position, "add" | "delete", query kind or "")
    kills: list[tuple[int, str]]  # (event position, "none" | "journal" | "witlog" | "both"): what is torn
    snapshots: bool


def draw(seed: int) -> Case:
    rng = random.Random(seed)
    n = rng.randint(300, 1500)
    t, lines = 1000, []
    for _ in range(n):
        t += rng.choice((0, 0, 1, 1, 2, 5))  # many simultaneous ticks
        lines.append(json.dumps({"stream": "Stock", "t0": t, "t1": t, "Name": rng.choice("ABC"),
                                 "Price": round(rng.uniform(90, 110), 1), "Volume": rng.randint(1, 1000)}))
    ops = [(0, "add", rng.choice(["rising", "climb", "big"]))]
    for _ in range(rng.randint(1, 5)):
        ops.append((rng.randrange(1, n), rng.choice(["add", "add", "delete"]),
                    rng.choice(list(POOL))))
    ops.sort(key=lambda o: o[0])
    kills = sorted((rng.randrange(1, n), rng.choice(["none", "none", "journal", "witlog", "both"]))
                   for _ in range(rng.randint(1, 3)))
    return Case(seed, lines, ops, kills, snapshots=rng.random() < 0.5)


class Life(Server):
    """A data directory, the ``cayuga serve`` process running on it now, and
    the case's sender connected to it."""

    def __init__(self, data_dir: Path, log: Path, snapshots: bool) -> None:
        super().__init__(data_dir, log, {"CAYUGA_SNAPSHOT_EVENTS": "200", "CAYUGA_SNAPSHOT_SECONDS": "0.2"}
                         if snapshots else {})
        self.api = self.http_client
        self.sender: TcpSender | None = None
        self.sent = 0  # the sender's lines the server has (or was sent, since the last connect)

    def start(self) -> None:
        super().start()
        wait_for("the server to come up", lambda: (self.health() or {}).get("status") in UP, 60)
        self.sender = TcpSender("127.0.0.1", self.tcp_port, sender_id="prop", ack=True)
        self.sent = self.sender.resume

    def send_upto(self, lines: list[str], upto: int) -> None:
        if upto > self.sent:
            block = "".join(line + "\n" for line in lines[self.sent:upto]).encode()
            self.sender.send_lines(block, upto - self.sent)
            self.sent = upto

    def taken(self, upto: int) -> None:
        """Until the engine has taken every event before ``upto`` (they are all acknowledged)."""
        if upto > self.sender.resume:  # (the server acknowledges lines sent, not what it had: #resume says that)
            assert self.sender.wait_acked(upto, 60), (upto, self.sender.acked, self.sender.errors)
        wait_for(f"the engine to take {upto} events",
                 lambda: (h := self.health())["events_taken"] >= upto and not h["replay_remaining"], 60)

    def kill(self) -> None:
        super().kill()
        self.sender.sock.close()

    def stop(self) -> None:
        if self.sender is not None:
            self.sender.sock.close()
        super().stop()

    def witnesses(self) -> dict[str, list[tuple[int, str]]]:
        """Every live subscription's witnesses from the log, with their numbers."""
        return {sub["id"]: self.logged(sub["id"], self.last_seq(sub["id"]))
                for sub in self.api.get("/subscriptions").json()}


def _tear_tail(directory: Path, pattern: str, newer_than: float, rng: random.Random) -> int:
    """Cut up to 200 bytes off the newest file's end, as a write cut short
    leaves it — only if it was written after the newest snapshot (what a
    snapshot counts was synced before it was published, so no crash tears it)."""
    files = sorted(directory.glob(pattern))
    if not files or files[-1].stat().st_mtime <= newer_than or files[-1].stat().st_size < 64:
        return 0
    cut = rng.randint(1, min(200, files[-1].stat().st_size // 2))
    with open(files[-1], "r+b") as f:
        f.truncate(files[-1].stat().st_size - cut)
    return cut


def run_case(case: Case, tmp: Path, with_kills: bool) -> dict[str, list[tuple[int, str]]]:
    life = Life(tmp / "data", tmp / "server.log", case.snapshots)
    picks = random.Random(case.seed + 1)  # the same choices of what to delete in both runs
    tears = random.Random(case.seed + 2)  # how much a torn tail loses
    events = len(case.lines)
    kills = list(case.kills) if with_kills else []
    live: list[tuple[str, str]] = []  # (id, kind) in registration order
    n = 0  # output stream names are unique per case
    try:
        life.start()
        points = sorted({p for p, *_ in case.ops} | {p for p, _ in kills} | {events})
        for point in points:
            life.send_upto(case.lines, point)
            for at, tear in [k for k in kills if k[0] == point]:
                life.kill()
                snaps = sorted((life.data_dir / "snapshots").glob("snapshot-*.bin"))
                newest = snaps[-1].stat().st_mtime if snaps else 0.0
                if tear in ("journal", "both"):
                    _tear_tail(life.data_dir / "journal", "*.journal", newest, tears)
                if tear in ("witlog", "both"):
                    _tear_tail(life.data_dir / "witnesses", "*.log", newest, tears)
                life.start()
                life.send_upto(case.lines, point)  # what the torn journal lost, again
            life.taken(point)
            for _at, op, kind in [o for o in case.ops if o[0] == point]:
                if op == "delete":
                    # never the first (it reads Stock only, so no cascade takes it): a case with nothing
                    # left to compare proves nothing
                    if len(live) > 1:
                        sid, _ = live[1 + picks.randrange(len(live) - 1)]
                        r = life.api.delete(f"/subscriptions/{sid}", params={"cascade": "true"})
                        assert r.status_code in (200, 204), r.text
                        gone = {x["id"] for x in life.api.get("/subscriptions").json()}
                        live = [x for x in live if x[0] in gone]
                    continue
                n += 1
                if kind == "big_pair":
                    src = [k for _, k in live if k.startswith("big#")]
                    if not src:
                        continue
                    text = POOL[kind].replace("<n>", str(n)).replace("<src>", src[0].split("#")[1])
                else:
                    text = POOL[kind].replace("<n>", str(n))
                r = life.api.post("/subscriptions", json={"cel": text})
                assert r.status_code == 201, r.text
                live.append((r.json()["id"], f"{kind}#{n}"))
        life.taken(events)
        return life.witnesses()
    finally:
        life.stop()
        text = life.log.read_text()
        assert "Traceback" not in text and NUMBERED_OTHERWISE not in text, text[-3000:]


@pytest.mark.parametrize("seed", SEEDS)
def test_recover_then_continue_equals_the_uninterrupted_run(tmp_path, seed):
    case = draw(seed)
    print(f"CAYUGA_RECOVERY_SEED={seed}: {len(case.lines)} events, ops {case.ops}, kills {case.kills}, "
          f"{'snapshots every 200 events' if case.snapshots else 'defaults'}")
    (tmp_path / "straight").mkdir()
    (tmp_path / "killed").mkdir()
    want = run_case(case, tmp_path / "straight", with_kills=False)
    got = run_case(case, tmp_path / "killed", with_kills=True)
    assert sum(len(w) for w in want.values()), "the case produced no witness: it proves nothing"
    assert set(got) == set(want)
    for sid in want:
        assert got[sid] == want[sid], (f"CAYUGA_RECOVERY_SEED={seed}", sid, len(got[sid]), len(want[sid]),
                                       next(((a, b) for a, b in zip(got[sid], want[sid]) if a != b), None))
