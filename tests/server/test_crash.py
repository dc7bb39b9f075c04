"""Fault injection (issue 12): ``cayuga serve`` is killed with SIGKILL at
random points — while events stream in (journal writes), while a snapshot
child is writing, while the last life is still replaying — and restarted on
the same data directory and ports, while one ``cayuga send`` run sends a
file of ≥ 200K ticks and ``cayuga watch`` processes follow a NEXT chain, a
FOLD and a resubscription chain. After the last restart every watcher's
output equals ``cayuga run`` on the same file, as a multiset: nothing lost,
nothing twice.

``CAYUGA_CRASH_EVENTS`` and ``CAYUGA_CRASH_KILLS`` make it longer (defaults
200,000 and 5); ``CAYUGA_CRASH_SEED`` picks the kill points.
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

from bench.server_e2e import QUERIES, _cayuga, _env, _free_port, write_ticks
from clients.client import CayugaClient

EVENTS = int(os.environ.get("CAYUGA_CRASH_EVENTS", "200000"))
KILLS = int(os.environ.get("CAYUGA_CRASH_KILLS", "5"))
SEED = int(os.environ.get("CAYUGA_CRASH_SEED", "12"))

BIG = "SELECT Name, Price FROM FILTER{Volume >= 9900}(Stock) PUBLISH Big\n"
BIG_PAIR = "SELECT Name, Price_1 AS First, Price AS Second FROM Big NEXT{$1.Name = $2.Name} Big PUBLISH BigPair\n"
CLIMB = ("SELECT * FROM (SELECT Name, Price FROM FILTER{Volume >= 9000}(Stock))\n"
         "FOLD{$1.Name = $2.Name, $2.Price > $.Price AND DUR < 2000,} "
         "(SELECT Name, Price FROM FILTER{Volume >= 9000}(Stock))\nPUBLISH Climb\n")
#: (query file, stream watched): NEXT, FOLD, and a chain reading another's output (resubscription)
WATCHED = {"rising.cel": "Rising", "climb.cel": "Climb", "big_pair.cel": "BigPair"}


class Server:
    """``cayuga serve`` as a process on fixed ports, killed and started again."""

    def __init__(self, data_dir: Path, log: Path) -> None:
        self.data_dir, self.log = data_dir, log
        self.http, self.tcp = _free_port(), _free_port()
        self.url = f"http://127.0.0.1:{self.http}"
        self.proc: subprocess.Popen | None = None
        # the witnesses are compared with `cayuga run`'s, which evicts nothing: no instance limit here
        # (Rising holds ~1,065 instances at its peak on these ticks, above the default 1,000)
        self.env = {**_env(), "CAYUGA_LOG_LEVEL": "info", "CAYUGA_SNAPSHOT_SECONDS": "0.3",
                    "CAYUGA_SNAPSHOT_EVENTS": "30000", "CAYUGA_MAX_INSTANCES_PER_SUBSCRIPTION": "1000000"}

    def start(self) -> None:
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                _cayuga("serve", "--http-port", str(self.http), "--tcp-port", str(self.tcp), "--data-dir",
                        str(self.data_dir)), env=self.env, stdout=log, stderr=subprocess.STDOUT)

    def wait_up(self, client: CayugaClient, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                if client.health().get("status") in ("ok", "warning"):  # up (a warning is about load)
                    return
            except Exception:  # noqa: BLE001 - not up yet
                pass
            assert self.proc.poll() is None, self.log.read_text()[-3000:]
            assert time.monotonic() < deadline, "the server did not come up"
            time.sleep(0.05)

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def _expected(tmp_path: Path, ticks: Path, queries: list[Path]) -> dict[str, Counter]:
    out = subprocess.run(_cayuga("run", *[a for q in queries for a in ("--query", str(q))], "--events", str(ticks)),
                         env=_env(), capture_output=True, text=True, timeout=600, check=True).stdout
    per: dict[str, Counter] = {}
    for line in out.splitlines():
        w = json.loads(line)
        per.setdefault(w["stream"], Counter())[json.dumps(w, sort_keys=True)] += 1
    return per


def _snapshot_being_written(data_dir: Path) -> bool:
    return any(p.suffix == ".tmp" for p in (data_dir / "snapshots").glob("*.tmp"))


def test_every_witness_exactly_once_across_kill_9(tmp_path):
    rng = random.Random(SEED)
    ticks = tmp_path / "ticks.jsonl"
    write_ticks(ticks, EVENTS, 40, seed=SEED)
    qdir = tmp_path / "queries"
    qdir.mkdir()
    (qdir / "rising.cel").write_text((QUERIES / "rising.cel").read_text())
    (qdir / "climb.cel").write_text(CLIMB)
    (qdir / "big.cel").write_text(BIG)
    (qdir / "big_pair.cel").write_text(BIG_PAIR)
    order = [qdir / n for n in ("rising.cel", "climb.cel", "big.cel", "big_pair.cel")]
    expected = _expected(tmp_path, ticks, order)
    assert all(expected.get(s) for s in WATCHED.values()), {s: sum(c.values()) for s, c in expected.items()}

    srv = Server(tmp_path / "data", tmp_path / "server.log")
    procs: list[subprocess.Popen] = []
    try:
        srv.start()
        with CayugaClient(srv.url, timeout=60) as c:
            srv.wait_up(c)
            ids = {}
            for q in order:
                ids[q.name] = c.subscribe(cel=q.read_text())["id"]
        watchers = {}
        for qname, stream in WATCHED.items():
            out = open(tmp_path / f"watch-{stream}.jsonl", "wb")
            err = open(tmp_path / f"watch-{stream}.err", "wb")
            p = subprocess.Popen(_cayuga("watch", ids[qname], "--url", srv.url, "--count",
                                         str(sum(expected[stream].values())), "--retry-for", "300"),
                                 env=_env(), stdout=out, stderr=err)
            watchers[stream] = (p, out, err)
            procs.append(p)
        send_err = open(tmp_path / "send.err", "wb")
        sender = subprocess.Popen(_cayuga("send", str(ticks), "--url", srv.url, "--port", str(srv.tcp), "--rate",
                                          str(max(EVENTS // 5, 1000)), "--retry-for", "300"),
                                  env=_env(), stdout=subprocess.DEVNULL, stderr=send_err)
        procs.append(sender)
        kinds = []
        for k in range(KILLS):
            if k == 1:  # one kill while a snapshot child is writing
                deadline = time.monotonic() + 20
                while not _snapshot_being_written(srv.data_dir) and time.monotonic() < deadline:
                    time.sleep(0.002)
                kinds.append("snapshot" if _snapshot_being_written(srv.data_dir) else "stream")
            elif k == KILLS - 1:  # the last one right after a start: during recovery and its replay
                time.sleep(rng.uniform(0.0, 0.3))
                kinds.append("recovery")
            else:
                time.sleep(rng.uniform(0.3, 1.2))
                kinds.append("stream")
            srv.kill()
            srv.start()
            if k < KILLS - 1:
                with CayugaClient(srv.url, timeout=60) as c:
                    srv.wait_up(c)
        with CayugaClient(srv.url, timeout=60) as c:
            srv.wait_up(c)
        assert sender.wait(300) == 0, (tmp_path / "send.err").read_text()
        print("kills:", kinds)
        for stream, (p, out, err) in watchers.items():
            assert p.wait(300) == 0, (stream, (tmp_path / f"watch-{stream}.err").read_text())
        for stream in WATCHED.values():
            got = Counter(json.dumps(json.loads(line), sort_keys=True)
                          for line in (tmp_path / f"watch-{stream}.jsonl").read_text().splitlines())
            assert got == expected[stream], (stream, kinds, sum(got.values()), sum(expected[stream].values()),
                                             list((got - expected[stream]).items())[:3],
                                             list((expected[stream] - got).items())[:3])
        for f in ["send.err"] + [f"watch-{s}.err" for s in WATCHED.values()]:
            assert "Traceback" not in (tmp_path / f).read_text(), f
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(10)
        srv.stop()
