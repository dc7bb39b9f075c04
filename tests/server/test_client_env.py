"""Client commands find the server through the environment, and ``cayuga
watch`` shows a subscription's history (issue 23). Real ``cayuga`` processes
against an in-process server on kernel-picked loopback ports; the commands
get no --url, only CAYUGA_URL."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

from clients.testing import stock
from tests.conftest import ROOT

RISING = ("SELECT Name, Price_1 AS Before, Price AS After FROM Stock "
          "NEXT{$1.Name = $2.Name AND $2.Price >= 1.05 * $1.Price} Stock PUBLISH Rising")


def cayuga(*args, env: dict, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "clients.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env=env)


def only(**kw) -> dict:
    """The test's environment without any CAYUGA_* variable but those given."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CAYUGA_")}
    env.update(kw)
    return env


def three_witnesses(client) -> str:
    """A subscription with three witnesses, seqs 1-3 (IBM, MSFT, Dell each rise 10%)."""
    sid = client.subscribe(cel=RISING)["id"]
    events = [stock(n, 10.0, 1, t) for t, n in enumerate(("IBM", "MSFT", "Dell"), 1)]
    events += [stock(n, 11.0, 1, t) for t, n in enumerate(("IBM", "MSFT", "Dell"), 4)]
    client.post_events(events)
    from clients.testing import wait_until

    wait_until(lambda: client.subscription(sid).get("last_seq", 0) == 3, timeout=30, what="three witnesses")
    return sid


def test_every_client_command_takes_the_server_from_CAYUGA_URL(server, client, tmp_path):
    env = only(CAYUGA_URL=server.base_url + "/")
    q = tmp_path / "rising.cel"
    q.write_text(RISING)
    r = cayuga("register", str(q), env=env)
    assert r.returncode == 0, r.stderr
    sid = r.stdout.split()[0]
    assert r.stderr.strip().splitlines()[-1] == "cayuga: registered 1 query"
    events = tmp_path / "e.jsonl"
    events.write_text("".join(json.dumps(stock("IBM", p, 1, t)) + "\n" for t, p in ((1, 10.0), (2, 11.0))))
    r = cayuga("send", str(events), env=env)  # the TCP port: asked from that server's /health
    assert r.returncode == 0, r.stderr
    assert r.stderr.strip().splitlines()[-1] == "cayuga: sent 2 lines, 0 rejected, 2 acknowledged"
    r = cayuga("watch", sid, "--from-start", "--count", "1", env=env)
    assert r.returncode == 0, r.stderr
    assert [json.loads(x) for x in r.stdout.splitlines()] == [
        {"stream": "Rising", "t0": 1, "t1": 2, "Name": "IBM", "Before": 10.0, "After": 11.0}]


def test_the_servers_own_port_variables_serve_a_client_beside_it(server, client):
    sid = three_witnesses(client)
    env = only(CAYUGA_HTTP_PORT=str(server.http_port), CAYUGA_HOST="0.0.0.0")  # a wildcard: this machine
    r = cayuga("watch", sid, "--from-start", "--count", "1", env=env)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["Name"] == "IBM"


def test_a_url_the_environment_cannot_give_is_refused_with_the_fix(server):
    r = cayuga("watch", "s1", env=only(CAYUGA_HTTP_PORT="0"))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "CAYUGA_HTTP_PORT='0' names no port a client can connect to" in r.stderr
    assert "set CAYUGA_URL, or give --url" in r.stderr
    r = cayuga("send", "examples/example9.jsonl", env=only(CAYUGA_URL="localhost:8400"))
    assert r.returncode == 2 and "CAYUGA_URL='localhost:8400' is not an http:// or https:// URL" in r.stderr


def test_spark_source_reads_CAYUGA_URL_too():
    """Its reach for the server comes before Spark starts: a port nobody listens on is named."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"  # bound, not listening: refused
        r = cayuga("spark", "source", "--stream", "Stock(Name string)", "examples/example9.jsonl",
                   env=only(CAYUGA_URL=dead))
    assert r.returncode == 2, r.stderr
    assert f"cannot reach the server at {dead}" in r.stderr


def test_watch_from_start_from_n_and_seq(server, client):
    sid = three_witnesses(client)
    env = only(CAYUGA_URL=server.base_url)
    r = cayuga("watch", sid, "--from-start", "--count", "3", "--seq", env=env)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert [x.split(" ", 1)[0] for x in lines] == ["1", "2", "3"]
    assert [json.loads(x.split(" ", 1)[1])["Name"] for x in lines] == ["IBM", "MSFT", "Dell"]
    r = cayuga("watch", sid, "--from", "2", "--count", "2", env=env)
    assert r.returncode == 0, r.stderr
    assert [json.loads(x)["Name"] for x in r.stdout.splitlines()] == ["MSFT", "Dell"]
    r = cayuga("watch", sid, "--from", "3", "--count", "1", "--seq", env=env)
    assert r.stdout.split(" ", 1)[0] == "3" and json.loads(r.stdout.split(" ", 1)[1])["Name"] == "Dell"


def test_watch_from_refuses_what_it_cannot_mean(server):
    env = only(CAYUGA_URL=server.base_url)
    r = cayuga("watch", "s1", "--from", "2", "--from-start", env=env)
    assert r.returncode == 2 and r.stderr.strip() == "cayuga: give --from N or --from-start, not both"
    r = cayuga("watch", "--stream", "Rising", "--from-start", env=env)
    assert r.returncode == 2 and "--from and --from-start take a subscription's witness numbers" in r.stderr
    r = cayuga("watch", "s1", "--from", "0", env=env)
    assert r.returncode == 2 and "Traceback" not in r.stderr
