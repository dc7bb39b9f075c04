"""Fault injection: ``cayuga serve`` is killed with SIGKILL at chosen points
and restarted on the same data directory and ports, and every witness must
reach its watchers exactly once, with the number it had.

Two settings, both in CI:

- ``defaults``: the shipped ``config.yaml`` as it is (a snapshot every 60 s or
  1M events), so every kill lands before the first snapshot and each restart
  replays the journal from its first record;
- ``fast-snapshots``: a snapshot every 0.3 s or 30K events, so kills land
  between snapshots, while a snapshot child is writing, and during recovery.

While one ``cayuga send`` run sends a file of ≥ 200K ticks (stopped with
SIGSTOP from each kill until the server is back — with the defaults, until
its replay is over — so that the file lasts for every kill), ``cayuga watch``
processes follow a NEXT chain, a FOLD and a resubscription chain. Each kill
asserts the phase it was meant to hit (``stream``: the server up, recovered
and taking events, and with the defaults no snapshot written yet;
``snapshot``: a snapshot child writing; ``recovery``: the restart still
restoring or replaying its journal). After the last restart every watcher's
output equals ``cayuga run`` on the same file, as a multiset: nothing lost,
nothing twice.

``CAYUGA_CRASH_EVENTS`` and ``CAYUGA_CRASH_KILLS`` make it longer (defaults
200,000 and 5; the long profile: ``CAYUGA_CRASH_EVENTS=1000000
CAYUGA_CRASH_KILLS=10``); ``CAYUGA_CRASH_SEED`` picks the kill points (the
seed is printed).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest

from clients.client import CayugaClient
from clients.testing import (
    RISING, UP, ServerProcess, cayuga_command, cayuga_env, logged_witnesses, wait_until, write_ticks,
)
from tests.server.conftest import NUMBERED_OTHERWISE

EVENTS = int(os.environ.get("CAYUGA_CRASH_EVENTS", "200000"))
KILLS = int(os.environ.get("CAYUGA_CRASH_KILLS", "5"))
SEED = int(os.environ.get("CAYUGA_CRASH_SEED", str(random.randrange(1 << 30))))
ROOT = Path(__file__).resolve().parents[2]

BIG = "SELECT Name, Price FROM FILTER{Volume >= 9900}(Stock) PUBLISH Big\n"
BIG_PAIR = "SELECT Name, Price_1 AS First, Price AS Second FROM Big NEXT{$1.Name = $2.Name} Big PUBLISH BigPair\n"
CLIMB = ("SELECT * FROM (SELECT Name, Price FROM FILTER{Volume >= 9000}(Stock))\n"
         "FOLD{$1.Name = $2.Name, $2.Price > $.Price AND DUR < 2000,} "
         "(SELECT Name, Price FROM FILTER{Volume >= 9000}(Stock))\nPUBLISH Climb\n")
#: (query file, stream watched): NEXT, FOLD, and a chain reading another's output (resubscription)
WATCHED = {"rising.cel": "Rising", "climb.cel": "Climb", "big_pair.cel": "BigPair"}
#: The README's first subscription and what its watcher prints for examples/example9.jsonl.
README_QUERY = RISING
README_WITNESSES = [
    {"stream": "Rising", "t0": 33300000, "t1": 33840000, "Name": "IBM", "Before": 85.0, "After": 91.0},
    {"stream": "Rising", "t0": 33660000, "t1": 33840000, "Name": "IBM", "Before": 81.0, "After": 91.0},
]
#: Settings beside the shipped config.yaml, per profile (the ports and data directory are always given).
PROFILES = {"defaults": {}, "fast-snapshots": {"CAYUGA_SNAPSHOT_SECONDS": "0.3", "CAYUGA_SNAPSHOT_EVENTS": "30000"}}


def wait_for(what: str, pred, timeout: float, step: float = 0.02):
    """Poll ``pred`` until it returns something true; fail saying what was awaited."""
    return wait_until(pred, timeout, what=what, interval=step)


class Server(ServerProcess):
    """``cayuga serve`` as a process on fixed ports, killed and started again
    (:class:`clients.testing.ServerProcess`), and what these tests read of it."""

    def received(self) -> int:
        """Events this life of the server has accepted (TCP and HTTP)."""
        return self.http_client.get("/stats", params={"limit": 0}).json()["received"]

    def last_seq(self, sid: str) -> int:
        return self.http_client.get(f"/subscriptions/{sid}").json()["last_seq"]

    def logged(self, sid: str, upto: int) -> list[tuple[int, str]]:
        """The subscription's witnesses 1..upto as the server serves them from
        its witness log (``?from=1``), with their numbers."""
        return logged_witnesses(self.base_url, sid, upto)

    def snapshots(self) -> list[Path]:
        return sorted((self.data_dir / "snapshots").glob("snapshot-*.bin"))


def test_readme_example_kill_9_before_the_first_snapshot(tmp_path):
    """The smallest case, at the shipped defaults: the README's subscription
    and six events, then kill -9 twice before any snapshot exists. Each
    restart replays the journal from its start and re-produces both
    witnesses: they keep numbers 1 and 2 (``last_seq`` stays 2), the log holds
    each once, and a new witness after the restarts is number 3."""
    srv = Server(tmp_path / "data", tmp_path / "server.log", PROFILES["defaults"])
    try:
        srv.start()
        srv.wait_up()
        sid = srv.http_client.post("/subscriptions", json={"cel": README_QUERY}).json()["id"]
        sent = subprocess.run(cayuga_command("send", str(ROOT / "examples" / "example9.jsonl"), "--url",
                                             srv.base_url, "--port", str(srv.tcp_port)),
                              env=srv.env, capture_output=True, text=True, timeout=60)
        assert sent.returncode == 0, sent.stderr
        wait_for("both witnesses in the log", lambda: srv.last_seq(sid) == 2, 30)
        for _ in range(2):
            assert not srv.snapshots(), "the shipped defaults wrote a snapshot: this kill is not before the first"
            srv.kill()
            srv.start()
            health = srv.wait_up()
            assert health["recovered"].get("replayed_events") == 6, health["recovered"]
            assert srv.last_seq(sid) == 2
            assert [(n, json.loads(w)) for n, w in srv.logged(sid, 2)] == list(enumerate(README_WITNESSES, 1))
        # IBM at 96: 5% above the quotes at 90 and 91 still waiting: two new witnesses, numbered 3 and 4
        more = {"stream": "Stock", "t0": 33900000, "t1": 33900000, "Name": "IBM", "Price": 96.0, "Volume": 1}
        r = srv.http_client.post("/events", json=[more])
        assert r.status_code == 202 and not r.json().get("rejected"), r.text
        wait_for("the new witnesses", lambda: srv.last_seq(sid) == 4, 30)
        assert [n for n, _ in srv.logged(sid, 4)] == [1, 2, 3, 4]
    finally:
        srv.stop()
    assert "Traceback" not in srv.log.read_text()


def post_readme_example(srv: Server) -> str:
    """Register the README's first query on ``srv``, post examples/example9.jsonl
    to ``POST /events`` and wait until both its witnesses are logged; the
    subscription's id."""
    sid = srv.http_client.post("/subscriptions", json={"cel": README_QUERY}).json()["id"]
    lines = (ROOT / "examples" / "example9.jsonl").read_text().splitlines()
    r = srv.http_client.post("/events", json=[json.loads(x) for x in lines])
    assert r.status_code == 202, r.text
    wait_for("both witnesses in the log", lambda: srv.last_seq(sid) == 2, 30)
    return sid


def test_a_journal_begun_after_logged_witnesses_numbers_on_from_them(tmp_path):
    """Witnesses logged while ``durability: off`` kept no journal, then a
    restart with the journal on, new witnesses, kill -9 and a restart that
    replays that journal from its first record: the new witnesses keep the
    numbers after the old ones (none taken twice, none dropped as a
    duplicate of an old one)."""
    data, log = tmp_path / "data", tmp_path / "server.log"
    off = Server(data, log, {"CAYUGA_DURABILITY": "off"})
    try:
        off.start()
        off.wait_up()
        sid = post_readme_example(off)
        off.kill()  # no journal, no snapshot: what it had in flight is gone, the log stays
    finally:
        off.stop()
    srv = Server(data, log, PROFILES["defaults"], http_port=off.http_port, tcp_port=off.tcp_port)
    try:
        srv.start()
        srv.wait_up()
        new = [{"stream": "Stock", "t0": t, "t1": t, "Name": "HP", "Price": p, "Volume": 1}
               for t, p in ((34000000, 100.0), (34100000, 106.0))]
        r = srv.http_client.post("/events", json=new)
        assert r.status_code == 202, r.text
        wait_for("the new witness", lambda: srv.last_seq(sid) == 3, 30)
        srv.kill()
        srv.start()
        h = srv.wait_up()
        assert h["recovered"].get("replayed_events") == 2, h["recovered"]
        assert srv.last_seq(sid) == 3
        got = [(n, json.loads(w)) for n, w in srv.logged(sid, 3)]
        assert got[:2] == list(enumerate(README_WITNESSES, 1))
        assert got[2] == (3, {"stream": "Rising", "t0": 34000000, "t1": 34100000, "Name": "HP", "Before": 100.0,
                              "After": 106.0})
    finally:
        srv.stop()
    assert "Traceback" not in log.read_text()


def expected_witnesses(ticks: Path, queries: list[Path]) -> dict[str, Counter]:
    """``cayuga run``'s witnesses per output stream, canonical JSON, as multisets."""
    out = subprocess.run(cayuga_command("run", *[a for q in queries for a in ("--query", str(q))],
                                        "--events", str(ticks)),
                         env=cayuga_env(), capture_output=True, text=True, timeout=600, check=True).stdout
    per: dict[str, Counter] = {}
    for line in out.splitlines():
        w = json.loads(line)
        per.setdefault(w["stream"], Counter())[json.dumps(w, sort_keys=True)] += 1
    return per


def start_watchers(url: str, ids: dict[str, str], expected: dict[str, Counter], watched: dict[str, str],
                   tmp_path: Path, files: list) -> dict[str, subprocess.Popen]:
    """One ``cayuga watch --count N`` per watched (query file, stream), N being
    ``cayuga run``'s count, printing to ``watch-<stream>.jsonl`` (errors to
    ``.err``); their files are added to ``files`` for the caller to close."""
    watchers = {}
    for qname, stream in watched.items():
        out = open(tmp_path / f"watch-{stream}.jsonl", "wb")
        err = open(tmp_path / f"watch-{stream}.err", "wb")
        files += [out, err]
        watchers[stream] = subprocess.Popen(cayuga_command("watch", ids[qname], "--url", url, "--count",
                                                           str(sum(expected[stream].values())), "--retry-for", "300"),
                                            env=cayuga_env(), stdout=out, stderr=err)
    return watchers


def _snapshot_being_written(data_dir: Path) -> bool:
    return any(p.suffix == ".tmp" for p in (data_dir / "snapshots").glob("*.tmp"))


def _kill_in_recovery(srv: Server) -> bool:
    """Right after a start: kill once /health shows the recovery under way
    (restoring, or its replay not over). False when the server had recovered
    before it could be seen doing so (it is then killed mid-stream instead)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        h = srv.health()
        if h is None:
            time.sleep(0.002)
            continue
        if h["status"] == "starting" or h.get("replay_remaining"):
            srv.kill()
            return True
        if h["status"] in UP:
            srv.kill()
            return False
        time.sleep(0.002)
    raise AssertionError("the server did not come up to be killed in its recovery")


@pytest.mark.parametrize("profile", list(PROFILES))
def test_every_witness_exactly_once_across_kill_9(tmp_path, profile):
    rng = random.Random(SEED)
    print(f"profile={profile} CAYUGA_CRASH_SEED={SEED} events={EVENTS} kills={KILLS}")
    ticks = tmp_path / "ticks.jsonl"
    write_ticks(ticks, EVENTS, 40, seed=SEED)
    qdir = tmp_path / "queries"
    qdir.mkdir()
    (qdir / "rising.cel").write_text(RISING + "\n")
    (qdir / "climb.cel").write_text(CLIMB)
    (qdir / "big.cel").write_text(BIG)
    (qdir / "big_pair.cel").write_text(BIG_PAIR)
    order = [qdir / n for n in ("rising.cel", "climb.cel", "big.cel", "big_pair.cel")]
    expected = expected_witnesses(ticks, order)
    assert all(expected.get(s) for s in WATCHED.values()), {s: sum(c.values()) for s, c in expected.items()}

    srv = Server(tmp_path / "data", tmp_path / "server.log", PROFILES[profile])
    procs: list[subprocess.Popen] = []
    files = []
    kinds: list[str] = []
    try:
        srv.start()
        srv.wait_up()
        with CayugaClient(srv.base_url, timeout=60) as c:
            ids = {q.name: c.subscribe(cel=q.read_text())["id"] for q in order}
        watchers = start_watchers(srv.base_url, ids, expected, WATCHED, tmp_path, files)
        procs += watchers.values()
        # the watchers follow from the newest witness on: they must be connected before the first event
        wait_for("the three watchers to connect", lambda: (srv.health() or {}).get("clients", 0) >= len(WATCHED), 60)
        send_err = open(tmp_path / "send.err", "wb")
        files.append(send_err)
        sender = subprocess.Popen(cayuga_command("send", str(ticks), "--url", srv.base_url, "--port",
                                                 str(srv.tcp_port), "--rate", str(max(EVENTS // 30, 1000)),
                                                 "--retry-for", "300"),
                                  env=cayuga_env(), stdout=subprocess.DEVNULL, stderr=send_err)
        procs.append(sender)
        plan = ["stream"] * KILLS
        if profile == "fast-snapshots" and KILLS > 2:
            plan[1] = "snapshot"
        plan[-1] = "recovery"
        recovery_tries = 0
        paused = False

        def pause() -> None:  # the sender waits while the server restarts (with the defaults: and replays)
            nonlocal paused
            sender.send_signal(signal.SIGSTOP)
            paused = True

        def go_on() -> None:
            nonlocal paused
            if paused:
                sender.send_signal(signal.SIGCONT)
                paused = False

        def restart() -> None:
            pause()
            srv.start()
            if profile != "defaults":  # new events arrive during the recovery too
                go_on()

        k = 0
        while k < len(plan):
            phase = plan[k]
            if phase == "stream":
                srv.wait_up()
                go_on()
                wait_for("the sender's events in this life", lambda: srv.received() > 0, 60)
                time.sleep(rng.uniform(0.3, 1.2))  # the kill point, by the seed
                before = srv.received()
                wait_for("more of the sender's events", lambda: srv.received() > before, 30, 0.005)
                assert sender.poll() is None, "the sender had finished: this kill would not be mid-stream"
                if profile == "defaults":
                    assert not srv.snapshots(), "a snapshot exists: this kill is not before the first snapshot"
                srv.kill()
            elif phase == "snapshot":
                wait_for("a snapshot child writing", lambda: _snapshot_being_written(srv.data_dir), 30, 0.001)
                srv.kill()
            else:  # recovery: needs a restart with a replay to kill
                if not _kill_in_recovery(srv):
                    recovery_tries += 1
                    assert recovery_tries < 8, f"no kill landed in a recovery in {recovery_tries} tries"
                    kinds.append("stream")
                    restart()
                    continue
            kinds.append(phase)
            k += 1
            restart()
        srv.wait_up(120)
        go_on()
        print("kills:", kinds)
        assert sender.wait(300) == 0, (tmp_path / "send.err").read_text()
        got = {}
        for stream, p in watchers.items():
            try:
                p.wait(120)
            except subprocess.TimeoutExpired:  # some witness never came: the comparison below says which
                p.kill()
                p.wait(10)
            got[stream] = Counter(json.dumps(json.loads(line), sort_keys=True)
                                  for line in (tmp_path / f"watch-{stream}.jsonl").read_text().splitlines())
        for stream in WATCHED.values():
            assert got[stream] == expected[stream], (stream, kinds, sum(got[stream].values()),
                                                     sum(expected[stream].values()),
                                                     list((got[stream] - expected[stream]).items())[:3],
                                                     list((expected[stream] - got[stream]).items())[:3])
        # the log numbers each witness once: last_seq is the count
        for qname, stream in WATCHED.items():
            assert srv.last_seq(ids[qname]) == sum(expected[stream].values()), (stream, kinds)
        for stream, p in watchers.items():
            assert p.returncode == 0, (stream, (tmp_path / f"watch-{stream}.err").read_text())
        for f in ["send.err"] + [f"watch-{s}.err" for s in WATCHED.values()]:
            assert "Traceback" not in (tmp_path / f).read_text(), f
        assert "Traceback" not in srv.log.read_text() and NUMBERED_OTHERWISE not in srv.log.read_text()
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(10)
        for f in files:
            f.close()
        srv.stop()
