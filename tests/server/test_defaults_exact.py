"""Exact at the defaults (issue 31): the README's Rising query through a fresh
``cayuga serve`` at the shipped configuration, a random walk without drift over
1,000 symbols (its state passes 100,000 live instances, where the old count
limit silently dropped witnesses, differently on every run), sent with
``cayuga send`` and read with ``cayuga watch --from-start``: exactly ``cayuga
run``'s witnesses, in its order, numbered 1..N, and /health ``ok``.

CI sends 200,000 ticks (about 135,000 live instances at the end);
``CAYUGA_EXACT_TICKS=1000000`` runs the issue's million."""

from __future__ import annotations

import os
import subprocess

from clients.client import CayugaClient
from clients.testing import ServerProcess, cayuga_command, cayuga_env, stop_process, wait_until
from clients.testing.market import RISING, write_ticks

TICKS = int(os.environ.get("CAYUGA_EXACT_TICKS", "200000"))


def test_the_shipped_defaults_give_cayuga_runs_witnesses_for_the_readme_query(tmp_path):
    ticks = tmp_path / "walk.jsonl"
    write_ticks(ticks, TICKS, 1000, seed=11, down=0.01, up=0.01)
    query = tmp_path / "rising.cel"
    query.write_text(RISING)
    expected = subprocess.run(cayuga_command("run", "--query", str(query), "--events", str(ticks)),
                              env=cayuga_env(), capture_output=True, timeout=900, check=True).stdout.splitlines()
    assert len(expected) > TICKS // 4
    with ServerProcess(tmp_path / "data") as srv:  # the shipped config.yaml; only the ports and data dir differ
        with CayugaClient(srv.base_url) as c:
            sid = c.subscribe(cel=RISING)["id"]
            subprocess.run(cayuga_command("send", str(ticks), "--url", srv.base_url, "--port", str(srv.tcp_port)),
                           env=cayuga_env(), capture_output=True, timeout=900, check=True)
            watch = subprocess.Popen(cayuga_command("watch", sid, "--url", srv.base_url, "--from-start", "--seq",
                                                    "--count", str(len(expected))),
                                     env=cayuga_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            try:
                out, err = watch.communicate(timeout=900)
            finally:
                stop_process(watch)
            state = wait_until(lambda: (h := c.health())["events_taken"] == TICKS and h, what="every tick taken")
            sub = c.subscription(sid)
    got = out.splitlines()
    assert [int(line.split(b" ", 1)[0]) for line in got] == list(range(1, len(expected) + 1))
    assert [line.split(b" ", 1)[1] for line in got] == expected
    assert b"lost" not in err
    assert sub["exact"] is True and sub["last_seq"] == len(expected)
    assert state["status"] == "ok" and state["inexact"] == {} and state["state"]["instances"] > 100_000, state
