"""The README's first walkthrough, copied as a newcomer copies it (issue 23):
a real ``cayuga serve`` on non-default ports set only through the
environment (CAYUGA_HTTP_PORT, CAYUGA_TCP_PORT, CAYUGA_DATA_DIR), then the
README's "A first subscription" block run by bash, unchanged, with the same
environment. It must print exactly the witnesses the README shows."""

from __future__ import annotations

import json
import os
import re
import selectors
import shutil
import signal
import ssl
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.conftest import ROOT
from clients.testing import free_ports, wait_until
from tests.server.test_datadir import reaping_orphans


def readme_walkthrough() -> tuple[str, list[str], dict]:
    """(the bash block, the witness lines it says the watcher prints, the answer it shows for the subscription)."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("## A first subscription, step by step", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
    shown = block.split("# the watcher prints:\n", 1)[1]
    witnesses = [line[2:] for line in shown.splitlines() if line.startswith("# {")]
    answer = re.search(r"^# -> (\{.*)$", block, re.M).group(1)
    return block, witnesses, json.loads(re.sub(r",\s*\.\.\.\}$", "}", answer))


def test_the_walkthrough_runs_as_written_on_ports_set_only_in_the_environment(tmp_path):
    block, expected, answer = readme_walkthrough()
    assert len(expected) == 2 and answer["id"] == "s1"
    http_port, tcp_port = free_ports(2)
    assert 8400 not in (http_port, tcp_port) and 8401 not in (http_port, tcp_port)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CAYUGA_")}
    env.update(CAYUGA_HTTP_PORT=str(http_port), CAYUGA_TCP_PORT=str(tcp_port),
               CAYUGA_DATA_DIR=str(tmp_path / "data"), CAYUGA_LOG_LEVEL="warning",
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    server = subprocess.Popen(["cayuga", "serve"], cwd=tmp_path, env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True, start_new_session=True)
    script = tmp_path / "walkthrough.sh"
    script.write_text(block)
    shell = None
    shell_err = open(tmp_path / "walkthrough.stderr", "w+b")  # a file: the background watcher keeps it open
    try:
        def healthy():
            assert server.poll() is None, f"cayuga serve exited: {server.communicate()[1]}"
            try:
                return httpx.get(f"http://127.0.0.1:{http_port}/health", timeout=2).status_code == 200
            except httpx.TransportError:
                return False

        wait_until(healthy, timeout=60, what="cayuga serve to answer /health on CAYUGA_HTTP_PORT")
        # bash -e: a failing command stops it; its own session, so the background watcher can be ended with it
        shell = subprocess.Popen(["bash", "-e", str(script)], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                 stderr=shell_err, start_new_session=True)
        lines: list[str] = []
        sel = selectors.DefaultSelector()
        sel.register(shell.stdout, selectors.EVENT_READ)
        buf = b""
        deadline = time.monotonic() + 120  # bounds a hang only
        while sum(line.startswith('{"stream":"Rising"') for line in lines) < len(expected):
            assert time.monotonic() < deadline, f"the walkthrough printed only {lines}; stderr: {(tmp_path / 'walkthrough.stderr').read_text()}"
            if not sel.select(timeout=1):
                continue
            chunk = os.read(shell.stdout.fileno(), 65536)
            assert chunk, f"the walkthrough ended after printing {lines}"
            buf += chunk
            *done, buf = buf.split(b"\n")
            lines += [x.decode() for x in done]
        sel.close()
        assert shell.wait(timeout=60) == 0  # the script itself (the watcher stays in the background)
        stderr = (tmp_path / "walkthrough.stderr").read_text()
        assert "cayuga: sent 6 lines, 0 rejected, 6 acknowledged" in stderr, stderr
        declared, registered, *watched = lines
        assert json.loads(declared)["name"] == "Temp"
        got = json.loads(registered)
        assert {k: got[k] for k in answer} == answer  # the fields the README shows, as it shows them
        assert watched == expected  # exactly the README's lines
    finally:
        for p in (shell, server):  # each its own session: bash's holds the background `cayuga watch`
            if p is not None:
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        shell_err.close()
        for p in (shell, server):
            if p is not None:
                try:
                    p.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait(10)
                for f in (p.stdout, p.stderr):
                    if f is not None:
                        f.close()
    assert server.returncode == 0  # SIGTERM drains and exits 0


def tls_walkthrough() -> tuple[str, list[str]]:
    """(the bash block of "The same over TLS", the witness lines it says the watcher prints)."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("### The same over TLS, with a token for each job", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
    shown = block.split("# the watcher prints the same two lines as before:\n", 1)[1]
    return block, [line[2:] for line in shown.splitlines() if line.startswith("# {")]


def test_the_tls_walkthrough_runs_as_written(tmp_path):
    """Issue 38's variant: certificates made with openssl, the server started by the block itself with
    TLS and three tokens, then each token doing its job, and the refusals the README shows."""
    if shutil.which("openssl") is None:
        pytest.fail("the TLS walkthrough needs the openssl command (Debian's openssl package)")
    block, expected = tls_walkthrough()
    assert expected == readme_walkthrough()[1]
    http_port, tcp_port = free_ports(2)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CAYUGA_")}
    env.update(CAYUGA_HTTP_PORT=str(http_port), CAYUGA_TCP_PORT=str(tcp_port), CAYUGA_LOG_LEVEL="warning",
               TMPDIR=str(tmp_path), PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    script = tmp_path / "tls-walkthrough.sh"
    script.write_text(block)
    with reaping_orphans():  # the block leaves the server and a watcher running: this process reaps them
        _run_tls_walkthrough(tmp_path, script, env, expected, http_port)


def _run_tls_walkthrough(tmp_path, script, env, expected, http_port) -> None:
    err = open(tmp_path / "tls-walkthrough.stderr", "w+b")  # a file: the background processes keep it open
    # its own session: the server and the watcher it leaves in the background end with it
    shell = subprocess.Popen(["bash", "-e", str(script)], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=err,
                             start_new_session=True)
    lines: list[str] = []

    def complete() -> bool:
        return (shell.poll() is not None and any("HTTPS only" in x for x in lines)
                and sum(x.startswith('{"stream":"Rising"') for x in lines) == len(expected))

    try:
        sel = selectors.DefaultSelector()
        sel.register(shell.stdout, selectors.EVENT_READ)
        buf = b""
        deadline = time.monotonic() + 180  # bounds a hang only
        while not complete():
            assert time.monotonic() < deadline, json.dumps(
                {"stdout": lines, "stderr": (tmp_path / "tls-walkthrough.stderr").read_text(),
                 **_what_the_server_says(tmp_path, http_port)}, indent=1, default=str)
            if sel.select(timeout=1):
                chunk = os.read(shell.stdout.fileno(), 65536)
                assert chunk or shell.poll() is not None, lines
                buf += chunk
                *done, buf = buf.split(b"\n")
                lines += [x.decode() for x in done]
        sel.close()
        assert shell.returncode == 0, (tmp_path / "tls-walkthrough.stderr").read_text()
        registered = json.loads(lines[0])
        assert registered["id"] == "s1" and registered["outputs"] == ["Rising"]
        assert [x for x in lines if x.startswith('{"stream":"Rising"')] == expected
        refused = json.loads(next(x for x in lines if '"missing_scope"' in x))
        assert refused["missing_scope"] == "manage" and refused["detail"].startswith(
            "token dashboard lacks the manage scope that DELETE /subscriptions/{sid} needs (its scopes: watch); ")
        audit = json.loads(next(x for x in lines if x.startswith('{"records"')))
        assert [(r["action"], r["token"], r["address"]) for r in audit["records"]] == [
            ("subscription.register", "ops", "127.0.0.1")]
        plain = json.loads(next(x for x in lines if "HTTPS only" in x))
        assert plain["detail"].startswith(f"this server speaks HTTPS only (its tls_certfile is set): use "
                                          f"https://127.0.0.1:{http_port}/health ")
        assert "cayuga: sent 6 lines, 0 rejected, 6 acknowledged" in (tmp_path / "tls-walkthrough.stderr").read_text()
    finally:
        _end_group(shell.pid)  # the server drains and exits, the watcher ends
        shell.wait(timeout=30)
        shell.stdout.close()
        err.close()


def _what_the_server_says(tmp_path: Path, http_port: int) -> dict:
    """For a failure's message (the block's server runs in the background): its /health and the end
    of its log ($D/server.log, D a mktemp -d under the test's TMPDIR)."""
    out: dict = {}
    for d in tmp_path.glob("tmp.*"):
        log = d / "server.log"
        if log.exists():
            out["server.log"] = log.read_text(errors="replace")[-4000:]
        if (d / "ca.pem").exists():
            try:
                ca = ssl.create_default_context(cafile=str(d / "ca.pem"))
                for what in ("health", "subscriptions/s1"):  # (its last_seq: were the witnesses made?)
                    out[what] = httpx.get(f"https://127.0.0.1:{http_port}/{what}", verify=ca, timeout=10,
                                          headers={"authorization": "Bearer ops-s3cret"}).json()
            except (httpx.HTTPError, ValueError) as exc:
                out["health"] = repr(exc)
    return out


def _end_group(pgid: int) -> None:
    """SIGTERM to every process of the group (the server drains and exits 0), and reap them all: the
    shell's background jobs were orphaned when it ended, and this process adopted them (reaping_orphans)."""
    def reaped() -> bool:
        try:
            while os.waitpid(-pgid, os.WNOHANG)[0]:
                pass
        except ChildProcessError:
            return True  # none of the group is left
        return False

    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        wait_until(reaped, timeout=60, what="the walkthrough's background processes to end", interval=0.05)
    except AssertionError:
        os.killpg(pgid, signal.SIGKILL)
        wait_until(reaped, timeout=10, what="the walkthrough's processes to die")
