"""SASE from the command line, as a user runs it (real subprocesses, real files):
``cayuga run --query q.sase``, ``cayuga compile q.sase`` (whose AIR runs the
same), ``cayuga register`` of .sase files, and a query error."""

from __future__ import annotations

import json
import subprocess
import sys

from clients.client import CayugaClient
from tests.conftest import ROOT
from tests.server.conftest import server, start_server  # noqa: F401  (fixtures)

STREAMS = ["--stream", "SHELF(tag string, shelf string)", "--stream", "COUNTER(tag string)",
           "--stream", "EXIT(tag string, gate int)"]
QUERY = "EVENT SEQ(SHELF x, !(COUNTER y), EXIT z)\nWHERE [tag] AND x.shelf = 'A'\nWITHIN 12 hours\nRETURN x.tag, z.gate\n"
H = 3_600_000
EVENTS = [{"stream": "SHELF", "t1": 1 * H, "tag": "t1", "shelf": "A"},
          {"stream": "EXIT", "t1": 2 * H, "tag": "t1", "gate": 1},
          {"stream": "COUNTER", "t1": 3 * H, "tag": "t1"},
          {"stream": "EXIT", "t1": 4 * H, "tag": "t1", "gate": 2},
          {"stream": "SHELF", "t1": 5 * H, "tag": "t2", "shelf": "A"},
          {"stream": "EXIT", "t1": 6 * H, "tag": "t2", "gate": 3}]


def cayuga(*args):
    return subprocess.run([sys.executable, "-m", "clients.cli", *args], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)


def files(tmp_path):
    q = tmp_path / "shop.sase"
    q.write_text(QUERY)
    e = tmp_path / "events.jsonl"
    e.write_text("".join(json.dumps(x) + "\n" for x in EVENTS))
    return q, e


def test_run_a_sase_query(tmp_path):
    q, e = files(tmp_path)
    r = cayuga("run", *STREAMS, "--query", str(q), "--events", str(e))
    assert r.returncode == 0, r.stderr
    assert [json.loads(x) for x in r.stdout.splitlines()] == [
        {"stream": "shop", "t0": 1 * H, "t1": 2 * H, "tag": "t1", "gate": 1},
        {"stream": "shop", "t0": 5 * H, "t1": 6 * H, "tag": "t2", "gate": 3}]
    assert "6 events, 2 witnesses" in r.stderr and "warning" not in r.stderr


def test_compile_a_sase_query_to_air_that_runs_the_same(tmp_path):
    q, e = files(tmp_path)
    air = tmp_path / "shop.xml"
    r = cayuga("compile", *STREAMS, str(q), "-o", str(air))
    assert r.returncode == 0, r.stderr
    assert air.read_text().startswith("<NFAs>")
    a = cayuga("run", *STREAMS, "--query", str(air), "--events", str(e))
    b = cayuga("run", *STREAMS, "--query", str(q), "--events", str(e))
    assert a.returncode == b.returncode == 0 and a.stdout == b.stdout and a.stdout


def test_a_query_error_names_the_file_and_the_position(tmp_path):
    q = tmp_path / "bad.sase"
    q.write_text("EVENT SEQ(SHELF x,\n          !(COUNTER y))\n")
    e = tmp_path / "e.jsonl"
    e.write_text("")
    r = cayuga("run", *STREAMS, "--query", str(q), "--events", str(e))
    assert r.returncode == 2
    assert f"{q}: line 2, column 11: a negated end (y last) needs WITHIN" in r.stderr
    assert r.stderr.rstrip().endswith("^")


def test_no_window_warns_on_standard_error(tmp_path):
    q = tmp_path / "open.sase"
    q.write_text("EVENT SEQ(SHELF x, EXIT z) WHERE [tag]")
    e = tmp_path / "e.jsonl"
    e.write_text("")
    r = cayuga("run", *STREAMS, "--query", str(q), "--events", str(e))
    assert r.returncode == 0 and "without WITHIN" in r.stderr and "line 1, column 20" in r.stderr


def test_register_sase_files(server, tmp_path):
    with CayugaClient(server.base_url) as c:
        c.declare_stream("SHELF", {"tag": "string", "shelf": "string"})
        c.declare_stream("COUNTER", {"tag": "string"})
        c.declare_stream("EXIT", {"tag": "string", "gate": "int"})
        q, _ = files(tmp_path)
        r = cayuga("register", str(q), "--url", server.base_url)
        assert r.returncode == 0, r.stderr
        (sub,) = c.subscriptions()
        assert sub["kind"] == "sase" and sub["name"] == "shop" and r.stdout.split() == [sub["id"], str(q)]
