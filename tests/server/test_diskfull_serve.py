"""Issue 19, the full-disk row: a real ``cayuga serve`` whose data directory
is a 20 MB tmpfs that fills up while ``cayuga send`` streams a tick file and
``cayuga watch`` processes follow two queries.

While the disk is full: /health answers "degraded" with the reason and the
path, POST /events and POST /subscriptions answer 507 with a body saying
"disk full" (never a 500), the TCP sender is refused with an ``error: disk
full:`` line and keeps retrying, the metrics count it. Then space is freed
(the filler files are deleted): ingestion resumes without a restart, the
sender finishes, each watcher's witnesses equal ``cayuga run`` on the same
file as a multiset, and the witness log (``?from=1``) holds each of them
exactly once -- nothing was delivered that is not logged. (Whether the
engine also meets the full witness log here depends on timing, so it is
only printed; test_diskfull.py holds witnesses deterministically.) After kill -9 and
a restart it still holds each exactly once.

``CAYUGA_DISKFULL_EVENTS`` makes the run longer (default 60,000 ticks; give
a bigger ``CAYUGA_DISKFULL_TMPFS`` too, e.g. ``64m`` for 200,000: the run's
journal, witness log and snapshots must fit once space is freed), and
``CAYUGA_DISKFULL_LEAVE`` sets the bytes left free when the stream starts.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections import Counter
from pathlib import Path

import httpx

from clients.client import CayugaClient
from clients.testing import RISING, cayuga_command, cayuga_env, wait_until, write_ticks
from tests.server.test_crash import Server, expected_witnesses, start_watchers
from tests.server.tmpfs import fill, free_space, tmpfs

EVENTS = int(os.environ.get("CAYUGA_DISKFULL_EVENTS", "60000"))
#: Bytes left free when the stream starts: the journal and the witness log fill them.
LEAVE = int(os.environ.get("CAYUGA_DISKFULL_LEAVE", str(1 << 20)))
#: The tmpfs: big enough for the whole run once the filler files are deleted.
SIZE = os.environ.get("CAYUGA_DISKFULL_TMPFS", "20m")
WAIT = 120.0  # seconds any one condition may take

HALF = "SELECT Name, Price, Volume FROM FILTER{Volume >= 5000}(Stock) PUBLISH Half\n"
WATCHED = {"rising.cel": "Rising", "half.cel": "Half"}


def _wait(what: str, check, timeout: float = WAIT, procs=()):
    """``wait_until(check)``, failing at once if one of ``procs`` ends meanwhile."""
    def running_and_check():
        got = check()
        for p in () if got else procs:
            assert p.poll() is None, f"{p.args} ended while waiting for {what}"
        return got

    return wait_until(running_and_check, timeout, what, interval=0.05)


def _metric(text: str, name: str, labels: str = "") -> float:
    m = re.search(rf"^{re.escape(name)}{re.escape(labels)} (\S+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


def _canon(path: Path) -> Counter:
    return Counter(json.dumps(json.loads(line), sort_keys=True) for line in path.read_text().splitlines())


def test_a_full_disk_refuses_waits_and_resumes_without_losing_or_repeating_a_witness(tmp_path):
    ticks = tmp_path / "ticks.jsonl"
    write_ticks(ticks, EVENTS, 40, seed=19)
    qdir = tmp_path / "queries"
    qdir.mkdir()
    (qdir / "rising.cel").write_text(RISING + "\n")
    (qdir / "half.cel").write_text(HALF)
    order = [qdir / "rising.cel", qdir / "half.cel"]
    expected = expected_witnesses(ticks, order)
    assert all(expected.get(s) for s in WATCHED.values())

    with tmpfs(tmp_path, SIZE) as mnt:
        srv = Server(mnt / "data", tmp_path / "server.log", {"CAYUGA_SNAPSHOT_SECONDS": "1"})
        procs: list[subprocess.Popen] = []
        files: list = []
        http = httpx.Client(base_url=srv.base_url, timeout=30)
        statuses: Counter = Counter()

        def health() -> dict:
            r = http.get("/health")
            statuses[r.status_code] += 1
            assert r.status_code == 200, r.text
            return r.json()

        try:
            srv.start()
            srv.wait_up()
            with CayugaClient(srv.base_url, timeout=60) as c:
                ids = {q.name: c.subscribe(cel=q.read_text())["id"] for q in order}
            watchers = start_watchers(srv.base_url, ids, expected, WATCHED, tmp_path, files)
            procs += watchers.values()
            # they follow from the newest witness on: connected before the first event, or they miss some
            _wait("the watchers to connect", lambda: health()["clients"] >= len(WATCHED), procs=procs)
            fillers = [fill(mnt, leave=LEAVE, name="filler-1")]
            sender = subprocess.Popen(cayuga_command("send", str(ticks), "--url", srv.base_url, "--port",
                                                     str(srv.tcp_port), "--sender-id", "ticks", "--retry-for", "300"),
                                      env=cayuga_env(), stdout=subprocess.DEVNULL,
                                      stderr=(send_err := open(tmp_path / "send.err", "wb")))
            files.append(send_err)
            procs.append(sender)

            # the stream fills the disk ...
            _wait("the stream to fill the disk", lambda: free_space(mnt) < 256 << 10, procs=[sender, srv.proc])
            fillers.append(fill(mnt, leave=0, name="filler-2"))  # ... and it stays full: not a byte left ...
            snapshots = mnt / "data" / "snapshots"
            while list(snapshots.glob("*.tmp")):  # ... once a snapshot child being written gave its space back
                _wait("the snapshot child to end", lambda: not list(snapshots.glob("*.tmp")), procs=[srv.proc])
                fill(mnt, leave=0, name="filler-2")

            # refusals that say so, never a 500
            for _ in range(10):
                # the time of the first tick the server has not taken (tick n's t1 is n): not late, and no
                # tick still to come is older, so were they taken the stream goes on as it would have (at
                # the last tick's time, taken, they made every tick after them late); no witness of either query
                t = int(_metric(http.get("/metrics").text, "cayuga_events_received_total", '{source="tcp"}')) + 1
                events = [{"stream": "Stock", "t0": t, "t1": t, "Name": "Z" * 40, "Price": 1.0, "Volume": 1}
                          for _ in range(500)]
                r = http.post("/events", json=events)
                if r.status_code == 507:
                    break
                # space came back meanwhile (a snapshot published, the one before it and the journal before
                # it deleted): those events were taken, rightly (or refused as late, had ticks come in between);
                # fill what was freed and try again
                assert r.status_code == 202 and r.json()["accepted"] + r.json()["late"] == len(events), r.text
                fill(mnt, leave=0, name="filler-2")
            assert r.status_code == 507, r.text
            body = r.json()
            assert body["detail"].startswith("disk full: ") and "none of the 500 events was accepted" in \
                body["detail"] and body["accepted"] == 0, body
            state = _wait("/health to report the full disk", lambda: (h := health()).get("disk_full") and h,
                          procs=[sender, srv.proc])
            assert state["status"] == "degraded"
            assert "disk full" in state["reason"] and str(mnt) in state["reason"], state
            for _ in range(10):
                r = http.post("/subscriptions", json={"cel": HALF.replace("Half", "Other")})
                if r.status_code == 507:
                    break
                assert r.status_code == 201, r.text  # space came back meanwhile, as above: undo, fill, again
                assert http.delete(f"/subscriptions/{r.json()['id']}").status_code == 204
                fill(mnt, leave=0, name="filler-2")
            assert r.status_code == 507, r.text
            assert "disk full" in r.json()["detail"], r.text
            assert [s["id"] for s in http.get("/subscriptions").json()] == list(ids.values())
            refused = _metric(http.get("/metrics").text, "cayuga_disk_full_refusals_total", '{source="tcp"}')
            metrics = _wait("the sender to be refused again", lambda: (m := http.get("/metrics").text) and
                            _metric(m, "cayuga_disk_full_refusals_total", '{source="tcp"}') > refused + 2 and m,
                            procs=[sender, srv.proc])
            assert _metric(metrics, "cayuga_disk_full_refusals_total", '{source="http"}') >= 2
            assert sum(_metric(metrics, "cayuga_disk_full", f'{{part="{p}"}}')
                       for p in ("journal", "witness_log", "store", "snapshot")) >= 1
            assert health()["status"] == "degraded"
            assert sender.poll() is None  # still retrying: nothing is lost, it waits
            full = {k + lab: _metric(metrics, k, lab) for k, lab in (
                ("cayuga_disk_full_refusals_total", '{source="tcp"}'),
                ("cayuga_disk_full_refusals_total", '{source="http"}'),
                ("cayuga_journal_write_failures_total", ""), ("cayuga_witness_log_append_failures_total", ""),
                ("cayuga_snapshot_failures_total", ""), ("cayuga_events_received_total", '{source="tcp"}'))}
            print("while full:", full, "parts:", sorted(health()["disk_full"]))

            # space returns: everything resumes by itself, without a restart
            for f in fillers:
                f.unlink()
            assert free_space(mnt) > 10 << 20
            assert sender.wait(WAIT) == 0, (tmp_path / "send.err").read_text()
            _wait("/health to be ok again", lambda: health()["status"] == "ok", procs=[srv.proc])
            for stream, p in watchers.items():
                assert p.wait(WAIT) == 0, (tmp_path / f"watch-{stream}.err").read_text()
            for qname, stream in WATCHED.items():
                got = _canon(tmp_path / f"watch-{stream}.jsonl")
                assert got == expected[stream], (stream, sum(got.values()), sum(expected[stream].values()))

            def exactly_once_in_the_log() -> None:
                for qname, stream in WATCHED.items():
                    n = sum(expected[stream].values())
                    logged = [(seq, json.dumps(json.loads(w), sort_keys=True)) for seq, w in srv.logged(ids[qname], n)]
                    assert [seq for seq, _ in logged] == list(range(1, n + 1)), stream
                    assert Counter(w for _, w in logged) == expected[stream], stream
                    assert http.get(f"/subscriptions/{ids[qname]}").json()["last_seq"] == n, stream

            exactly_once_in_the_log()  # every witness printed is in the log, once
            print("witnesses compared:", {s: sum(expected[s].values()) for s in WATCHED.values()})

            srv.kill()
            srv.start()
            srv.wait_up()
            _wait("the restart's replay", lambda: (h := health())["queue_depth"] == 0 and not h.get("replay_remaining"),
                  procs=[srv.proc])
            exactly_once_in_the_log()
            assert statuses.keys() == {200}
            for f in ["send.err"] + [f"watch-{s}.err" for s in WATCHED.values()]:
                assert "Traceback" not in (tmp_path / f).read_text(), f
            log = (tmp_path / "server.log").read_text()
            assert "Traceback" not in log, log[-5000:]
        finally:
            http.close()
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait(10)
            for f in files:
                f.close()
            srv.stop()
