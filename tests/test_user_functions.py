"""User-defined Python functions, declared in the configuration, in CEL queries
run offline and on the server."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from clients.client import CayugaClient
from server.config import ConfigError, load_settings
from server.serve import RunningServer
from tests.conftest import ROOT

MODULE = '''
def spread(price, volume):
    return price * volume
'''
QUERY = "SELECT Name, SPREAD(Price, Volume) AS Notional FROM FILTER{SPREAD(Price, Volume) > 1000}(Stock) PUBLISH Big"


@pytest.fixture
def fn_config(tmp_path, monkeypatch):
    (tmp_path / "myfns.py").write_text(MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = tmp_path / "c.yaml"
    cfg.write_text("streams:\n  Stock: {Name: string, Price: float, Volume: int}\n"
                   "functions:\n  SPREAD: {path: 'myfns:spread', returns: float}\n")
    return cfg


def test_offline_run_with_a_configured_function(tmp_path, fn_config):
    q = tmp_path / "q.cel"
    q.write_text(QUERY)
    ev = tmp_path / "e.jsonl"
    ev.write_text('{"stream": "Stock", "t1": 1, "Name": "IBM", "Price": 10.0, "Volume": 200}\n'
                  '{"stream": "Stock", "t1": 2, "Name": "MSFT", "Price": 10.0, "Volume": 20}\n')
    r = subprocess.run([sys.executable, "-m", "clients.cli", "run", "--config", str(fn_config), "--query", str(q),
                        "--events", str(ev)], capture_output=True, text=True, timeout=120, cwd=ROOT,
                       env={"PYTHONPATH": f"{tmp_path}:{ROOT}", "PATH": ""})
    assert r.returncode == 0, r.stderr
    assert [json.loads(x) for x in r.stdout.splitlines()] == [
        {"stream": "Big", "t0": 1, "t1": 1, "Name": "IBM", "Notional": 2000.0}]


def test_server_with_a_configured_function(tmp_path, fn_config):
    settings = load_settings(fn_config, data_dir=tmp_path / "d", http_port=0, tcp_port=0, log_level="warning")
    with RunningServer(settings) as srv, CayugaClient(srv.base_url) as c:
        sub = c.subscribe(cel=QUERY)
        with c.watch(sub["id"], timeout=10) as m:
            c.post_events([{"stream": "Stock", "t1": 1, "Name": "IBM", "Price": 10.0, "Volume": 200}])
            assert next(m) == {"stream": "Big", "t0": 1, "t1": 1, "Name": "IBM", "Notional": 2000.0}


def test_bad_function_config_is_reported(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("functions:\n  F: {path: 'no_such_module_x:f', returns: float}\n")
    with pytest.raises(ConfigError, match="functions.F: cannot import no_such_module_x:f"):
        load_settings(cfg).function_registry()
    cfg.write_text("functions:\n  F: {path: 'json:dumps', returns: decimal}\n")
    with pytest.raises(ConfigError, match="unknown attribute type 'decimal'"):
        load_settings(cfg)


def test_running_in_names_the_registered_function_on_a_threads_stack():
    """``FunctionRegistry.running_in``: the registered function nearest the innermost frame
    of a stack (a helper it calls included), and the innermost place; none on the engine's own."""
    import threading

    from air.engine.functions import FunctionRegistry

    seen: dict = {}
    inside, go = threading.Event(), threading.Event()

    def helper():
        inside.set()
        go.wait(30)

    def lookup(x):
        helper()
        return x

    reg = FunctionRegistry.default()
    reg.register("LOOKUP", lookup, "float")
    t = threading.Thread(target=lambda: seen.setdefault("out", reg.get("LOOKUP").fn(1.0)))
    t.start()
    try:
        assert inside.wait(30)
        where = reg.running_in(sys._current_frames()[t.ident])
    finally:
        go.set()
        t.join(30)
    assert where["function"] == "LOOKUP"
    # the innermost place outside Python's library: the helper's line that waits, not threading.py's inside
    assert where["at"].endswith(", in helper") and "test_user_functions.py:" in where["at"], where
    assert seen["out"] == 1.0
    here = reg.running_in(sys._getframe())
    assert here["function"] is None and here["at"].endswith(", in test_running_in_names_the_registered_function_on_a_threads_stack")
    assert reg.running_in(None) == {"function": None, "at": None}
