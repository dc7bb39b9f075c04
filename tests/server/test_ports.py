"""A port the server cannot listen on (issue 35): ``cayuga serve`` said
``cannot start: [Errno 98] Address already in use`` for the HTTP port, and
printed uvicorn's traceback (exit 3) for the TCP port. Both ports are bound
before anything starts; a refusal is one line, exit 2, naming the port, the
setting that chose it and how to choose another."""

from __future__ import annotations

import os
import socket
import subprocess

import pytest

from clients.testing import cayuga_command, cayuga_env, free_port, running_server
from server.config import DEFAULT_CONFIG, ConfigError, load_settings
from server.serve import RunningServer
from tests.server.conftest import assert_no_cayuga_threads, make_settings


@pytest.fixture
def taken():
    """A port some other program listens on."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def serve(tmp_path, *args, **env):
    return subprocess.run(cayuga_command("serve", "--data-dir", str(tmp_path / "data"), *args),
                          env=cayuga_env({**os.environ, **env}), capture_output=True, text=True, timeout=120)


def test_an_http_port_in_use_names_the_flag_that_chose_it(tmp_path, taken):
    r = serve(tmp_path, "--http-port", str(taken), "--tcp-port", "0")
    assert r.returncode == 2
    assert r.stderr == (
        f"cayuga: cannot start: the HTTP port {taken} on 127.0.0.1 is in use (by another cayuga serve, or another "
        f"program: `ss -ltnp 'sport = :{taken}'` names it); the port comes from the flag --http-port: give this "
        "server another port: --http-port N or CAYUGA_HTTP_PORT=N (0 picks a free one, and --port-file FILE says "
        "which)\n")


def test_a_tcp_port_in_use_is_one_line_too_not_a_traceback(tmp_path, taken):
    r = serve(tmp_path, "--http-port", "0", CAYUGA_TCP_PORT=str(taken))
    assert r.returncode == 2
    assert r.stderr.startswith(f"cayuga: cannot start: the TCP event port {taken} on 127.0.0.1 is in use ")
    assert r.stderr.endswith(f"the port comes from CAYUGA_TCP_PORT={taken}: give this server another port: "
                             "--tcp-port N or CAYUGA_TCP_PORT=N (0 picks a free one, and --port-file FILE says "
                             "which)\n")


def test_one_port_for_both_is_refused_in_one_line(tmp_path):
    """Both sockets bound (each lets a port be bound twice until one listens), and the
    HTTP one failed at uvicorn's listen: ``cannot start: [Errno 9] Bad file descriptor``."""
    port = free_port()
    r = serve(tmp_path, "--http-port", str(port), CAYUGA_TCP_PORT=str(port))
    assert r.returncode == 2
    assert r.stderr == (
        f"cayuga: cannot start: the HTTP port and the TCP event port are both {port} (http_port from the flag "
        f"--http-port, tcp_port from CAYUGA_TCP_PORT={port}); each needs a port of its own: give one of them "
        "another, e.g. --tcp-port N or CAYUGA_TCP_PORT=N (0 picks a free one, and --port-file FILE says which)\n")
    with pytest.raises(ConfigError, match=f"the HTTP port and the TCP event port are both {port} "):
        RunningServer(make_settings(tmp_path, http_port=port, tcp_port=port))
    with running_server(tmp_path / "data", http_port=port):  # the data directory was let go, and the port
        pass
    assert_no_cayuga_threads()


def test_a_server_in_this_process_refuses_a_port_in_use_and_lets_the_data_directory_go(tmp_path, taken):
    with pytest.raises(ConfigError, match=f"the TCP event port {taken} on 127.0.0.1 is in use"):
        RunningServer(make_settings(tmp_path, tcp_port=taken))
    with running_server(tmp_path / "data"):  # the same data directory: its lock was released
        pass
    assert_no_cayuga_threads()


def test_each_setting_knows_where_it_came_from(tmp_path, monkeypatch):
    for name in ("CAYUGA_HTTP_PORT", "CAYUGA_TCP_PORT", "CAYUGA_HOST"):
        monkeypatch.delenv(name, raising=False)
    assert load_settings().origin("http_port") == f"http_port in the bundled {DEFAULT_CONFIG}"
    monkeypatch.setenv("CAYUGA_TCP_PORT", "9401")
    config = tmp_path / "c.yaml"
    config.write_text("http_port: 9400\n")
    settings = load_settings(config, host="::1")
    assert settings.origin("http_port") == f"http_port in {config}"
    assert settings.origin("tcp_port") == "CAYUGA_TCP_PORT=9401"
    assert settings.origin("host") == "the flag --host"
    assert settings.origin("delay") == "the default delay"
