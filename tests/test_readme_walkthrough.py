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
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tests.conftest import ROOT
from clients.testing import wait_until


def readme_walkthrough() -> tuple[str, list[str], dict]:
    """(the bash block, the witness lines it says the watcher prints, the answer it shows for the subscription)."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("## A first subscription, step by step", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
    shown = block.split("# the watcher prints:\n", 1)[1]
    witnesses = [line[2:] for line in shown.splitlines() if line.startswith("# {")]
    answer = re.search(r"^# -> (\{.*)$", block, re.M).group(1)
    return block, witnesses, json.loads(re.sub(r",\s*\.\.\.\}$", "}", answer))


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


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
