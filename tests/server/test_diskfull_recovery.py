"""Issue 33: after a full disk is freed, the server turns ready by itself,
and ``cayuga send`` ends with the server's own reason; on a real ``cayuga
serve`` whose data directory is a small tmpfs (tests/server/tmpfs.py).

- A journal append refused for a full disk ended its episode only with the
  next append that worked: with no sender writing, ``/readyz`` stayed 503
  after the space came back. Now the server retries the journal (and the
  store) itself, periodically and bounded (server/durability/diskfull.py),
  and the episode ends once a write of the refused record's size works.
- ``cayuga send`` against a full disk gave up with "the server has taken no
  line for 0 s (overloaded, shutting down, or its journal stuck?)": its last
  connection was made with no time left and stalled at once. Now it reports
  the server's reply, ``the server's disk is full: ...``, as documented.
"""

from __future__ import annotations

import re
import subprocess

import httpx

from clients.testing import ServerProcess, cayuga_command, stock, wait_until, write_ticks
from tests.server.tmpfs import fill, tmpfs

PARTS = ("journal", "witness_log", "store", "snapshot")


def disk_full_parts(base_url: str) -> set[str]:
    """The parts ``cayuga_disk_full{part}`` says cannot be written (a scrape retries nothing itself)."""
    text = httpx.get(base_url + "/metrics", timeout=10).text
    return {p for p in PARTS if re.search(rf'^cayuga_disk_full\{{part="{p}"\}} 1(\.0)?$', text, re.M)}


def test_once_space_is_freed_the_server_turns_ready_without_a_client_writing(tmp_path):
    with tmpfs(tmp_path, "4m") as mnt:
        with ServerProcess(mnt / "data", tmp_path / "server.log") as srv:
            http = srv.http_client
            filler = fill(mnt, leave=0)
            r = http.post("/events", json=[stock("IBM", 1.0, 1, i) for i in range(1, 1001)])
            assert r.status_code == 507, r.text
            r = http.post("/subscriptions", json={"cel": "SELECT * FROM Stock PUBLISH All"})
            assert r.status_code == 507, r.text
            assert {"journal", "store"} <= disk_full_parts(srv.base_url)
            ready = http.get("/readyz")
            assert ready.status_code == 503 and "disk full" in ready.json()["reason"], ready.text

            filler.unlink()  # space returns; nobody writes
            wait_until(lambda: not disk_full_parts(srv.base_url), 60,
                       what="the server to find by itself that its data directory can be written again")
            ready = http.get("/readyz")
            assert ready.status_code == 200 and ready.json()["status"] == "ok", ready.text
            r = http.post("/events", json=[stock("IBM", 1.0, 1, 1)])
            assert r.status_code == 202 and r.json()["accepted"] == 1, r.text
        log = srv.log.read_text()
        assert "the journal can be written again" in log and "Traceback" not in log


def test_cayuga_send_against_a_full_disk_names_the_full_disk(tmp_path):
    ticks = tmp_path / "ticks.jsonl"
    write_ticks(ticks, 2000, 10, seed=33)
    with tmpfs(tmp_path, "4m") as mnt:
        with ServerProcess(mnt / "data", tmp_path / "server.log") as srv:
            filler = fill(mnt, leave=0)
            try:
                # --retry-for above the least patience a connected server gets (5 s): the run's last
                # connection is made as its time runs out, which is where the wrong reason came from
                sent = subprocess.run(cayuga_command("send", str(ticks), "--url", srv.base_url, "--retry-for", "6"),
                                      env=srv.env, capture_output=True, text=True, timeout=120)
            finally:
                filler.unlink()
    assert sent.returncode == 1, sent.stderr
    last = sent.stderr.strip().splitlines()[-1]
    assert last.startswith("cayuga: gave up after 6 s of retries: the server's disk is full: the journal could "
                           "not be written (No space left on device)"), sent.stderr
    assert last.endswith("free space on the server and run this again (it resumes); "
                         "0 of 2000 lines acknowledged"), last
    assert "taken no line" not in sent.stderr and "Traceback" not in sent.stderr
