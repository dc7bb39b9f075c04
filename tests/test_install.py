"""The install contract (issues 23 and 25): a plain ``pip install -e .`` into a fresh
venv, from a copy of the files a clone has, brings no Spark (no pyspark,
pandas or pyarrow), and its ``cayuga serve`` starts and answers /health;
its ``cayuga spark`` says what to install. One venv, built the way a
newcomer builds it (pip's own build isolation: setuptools, wheel and Cython
come from the package index, as on a fresh machine)."""

from __future__ import annotations

import gzip
import json
import os
import platform
import shutil
import subprocess
import sys
import time
import zipfile

import httpx

from tests.conftest import ROOT
from clients.testing import stop_process, wait_until

#: What a clone holds that the install reads (the Dockerfile copies the same).
SOURCES = ("pyproject.toml", "setup.py", "README.md", "LICENSE", "air", "server", "clients", "examples")
#: Never in a plain install.
HEAVY = ("pyspark", "pandas", "pyarrow")


def test_plain_install_is_light_and_serves(tmp_path):
    src = tmp_path / "clone"
    src.mkdir()
    ignore = shutil.ignore_patterns("__pycache__", "*.so", "*.c", "compiled.json", "*.egg-info", "node_modules")  # .gitignore's
    for name in SOURCES:
        p = ROOT / name
        if p.is_dir():
            shutil.copytree(p, src / name, ignore=ignore)
        else:
            shutil.copy2(p, src / name)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    py, cayuga = venv / "bin" / "python", venv / "bin" / "cayuga"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CAYUGA_", "VIRTUAL_ENV", "PYTHONPATH"))}
    started = time.monotonic()
    r = subprocess.run([str(py), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "-e", str(src)],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1800)
    assert r.returncode == 0, r.stderr[-4000:]
    print(f"pip install -e . took {time.monotonic() - started:.0f} s")  # reported, never judged
    _check_compiled_modules(src / "air" / "engine")
    found = subprocess.run([str(py), "-c", "import importlib.util as u, json; "
                            f"print(json.dumps([m for m in {HEAVY!r} if u.find_spec(m)]))"],
                           cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert json.loads(found.stdout) == [], found.stderr

    no_spark = subprocess.run([str(cayuga), "spark", "run", "--stream", "Stock(Name string)", "--query",
                               str(src / "examples" / "rising.cel"), "--input", "x", "--output", "y"],
                              cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert no_spark.returncode == 2 and "Traceback" not in no_spark.stderr, no_spark.stderr
    assert "pip install 'cayuga[spark]'" in no_spark.stderr

    port_file = tmp_path / "ports.json"
    server = subprocess.Popen([str(cayuga), "serve", "--http-port", "0", "--tcp-port", "0", "--data-dir",
                               str(tmp_path / "data"), "--port-file", str(port_file)],
                              cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        def up():
            assert server.poll() is None, f"cayuga serve exited: {server.communicate()[1]}"
            return port_file.exists()

        wait_until(up, timeout=120, what="the fresh install's cayuga serve to write its port file")
        port = json.loads(port_file.read_text())["http_port"]
        health = httpx.get(f"http://127.0.0.1:{port}/health", timeout=10)
        assert health.status_code == 200 and health.json()["status"] == "ok", health.text
        assert stop_process(server, 60) == 0  # a drained, clean exit
    finally:
        stop_process(server)
        server.stderr.close()


def _check_compiled_modules(engine) -> None:
    """setup.py compiles the engine where a C compiler exists: its modules carry
    no debug information or symbol table (1 MB, not 6) and no RUNPATH naming
    the build machine's library directory (pyenv's LDSHARED adds one)."""
    modules = sorted(engine.glob("*.so"))
    if shutil.which("cc") or shutil.which("gcc"):
        assert modules, f"a C compiler is here, but setup.py compiled nothing in {engine}"
    for so in modules:
        dynamic = subprocess.run(["readelf", "-d", str(so)], capture_output=True, text=True, check=True).stdout
        assert "RUNPATH" not in dynamic and "RPATH" not in dynamic, f"{so.name}:\n{dynamic}"
        sections = subprocess.run(["readelf", "-S", "-W", str(so)], capture_output=True, text=True,
                                  check=True).stdout
        assert ".debug_" not in sections and ".symtab" not in sections, f"{so.name} is not stripped"


def test_the_built_wheel_carries_the_defaults_and_serves_from_an_empty_directory(tmp_path):
    """A wheel, not a checkout: the shipped defaults (server/config.yaml) and the
    console are package data, so a server installed from the wheel, run in a
    directory that holds nothing of the project, declares the default streams
    (without them, GET /streams was [] and the README's first POST /subscriptions
    a 400) and serves the console."""
    src = tmp_path / "clone"
    src.mkdir()
    ignore = shutil.ignore_patterns("__pycache__", "*.so", "*.c", "compiled.json", "*.egg-info", "node_modules")
    for name in SOURCES:
        p = ROOT / name
        (shutil.copytree(p, src / name, ignore=ignore) if p.is_dir() else shutil.copy2(p, src / name))
    dist, site, empty = tmp_path / "dist", tmp_path / "site", tmp_path / "empty"
    empty.mkdir()
    # As on a machine without a C compiler (CC=/bin/false fails every compile): the build says it
    # makes the pure-Python engine, and the wheel is tagged py3-none-any, not for this platform.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith("CAYUGA_")}
    env["CC"] = "/bin/false"
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "-v", "--no-deps", "--no-build-isolation",
                            "--wheel-dir", str(dist), str(src)], timeout=600, env=env, cwd=empty,
                           capture_output=True, text=True)
    assert built.returncode == 0, built.stdout[-4000:] + built.stderr[-4000:]
    output = built.stdout + built.stderr
    assert "cayuga: WARNING: no engine module was compiled: building the pure-Python engine" in output
    for deprecated in ("License classifiers are deprecated", "project.license` as a TOML table is deprecated",
                       "project.license as a TOML table is deprecated"):
        assert deprecated not in output, f"the build warns: {deprecated}"
    (wheel,) = dist.glob("cayuga-*.whl")
    assert wheel.name.endswith("-py3-none-any.whl"), wheel.name
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        info = next(n for n in names if n.endswith(".dist-info/METADATA"))
        metadata = zf.read(info).decode()
        assert "Root-Is-Purelib: true" in zf.read(info.replace("METADATA", "WHEEL")).decode()
    assert {"air/py.typed", "server/py.typed", "clients/py.typed"} <= names
    assert info.replace("METADATA", "licenses/LICENSE") in names and not any(n.endswith(".so") for n in names)
    assert "License-Expression: MIT" in metadata and "License-File: LICENSE" in metadata
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(site), str(wheel)],
                   check=True, timeout=600, env=env, cwd=empty)
    assert (site / "server" / "config.yaml").read_text() == (ROOT / "server" / "config.yaml").read_text()
    assert not (site / "bench").exists() and (site / "clients" / "bench" / "queries" / "rising.cel").exists()

    ports = tmp_path / "ports.json"
    run_env = {k: v for k, v in env.items() if not k.startswith("CAYUGA_")}
    run_env["PYTHONPATH"] = str(site)  # the wheel's packages first, the venv's dependencies after
    where = subprocess.run([sys.executable, "-c", "import server.config as c; print(c.DEFAULT_CONFIG)"], cwd=empty,
                           env=run_env, capture_output=True, text=True, timeout=60)
    assert where.stdout.strip() == str(site / "server" / "config.yaml"), where.stdout + where.stderr
    # `cayuga bench server` runs the packaged queries, found beside the installed module
    bench = subprocess.run([sys.executable, "-c", "from clients.bench.server_e2e import QUERIES; "
                            "print(QUERIES); print(sorted(p.name for p in QUERIES.glob('*.cel')))"],
                           cwd=empty, env=run_env, capture_output=True, text=True, timeout=60)
    assert bench.stdout.split("\n")[:2] == [str(site / "clients" / "bench" / "queries"),
                                             str(sorted(p.name for p in (src / "clients" / "bench" / "queries")
                                                        .glob("*.cel")))], bench.stdout + bench.stderr
    helped = subprocess.run([sys.executable, "-m", "clients.cli", "bench", "server", "--help"], cwd=empty,
                            env=run_env, capture_output=True, text=True, timeout=60)
    assert helped.returncode == 0 and "rising, runup, mshape, all" in helped.stdout, helped.stdout + helped.stderr
    proc = subprocess.Popen([sys.executable, "-m", "clients.cli", "serve", "--http-port", "0", "--tcp-port", "0",
                             "--port-file", str(ports), "--data-dir", str(tmp_path / "data")],
                            cwd=empty, env=run_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        wait_until(lambda: ports.exists() and ports.stat().st_size > 0 or proc.poll() is not None, 60,
                   "the server's ports")
        assert proc.poll() is None, proc.stdout.read().decode()
        base = f"http://127.0.0.1:{json.loads(ports.read_text())['http_port']}"
        with httpx.Client(base_url=base, timeout=10) as c:
            assert "Stock" in {s["name"] for s in c.get("/streams").json()}
            r = c.post("/subscriptions", json={"cel": "SELECT Name, Price_1 AS Before, Price AS After FROM Stock "
                                                      "NEXT{$1.Name = $2.Name AND $2.Price >= 1.05 * $1.Price} Stock "
                                                      "PUBLISH Rising"})
            assert r.status_code == 201, r.text
            assert c.get("/").status_code == 200 and "<html" in c.get("/").text.lower()
    finally:
        try:
            stop_process(proc)
        finally:
            proc.stdout.close()


def test_the_version_is_written_once_in_pyproject(monkeypatch, tmp_path):
    """The API and cayuga_build_info report the installed distribution's version
    (pyproject.toml's), not a second copy of it; a source tree without metadata
    reads pyproject.toml."""
    import importlib.metadata
    import tomllib

    from air.engine import BUILD
    from clients.testing import server_settings
    from server.app import create_app
    from server.version import version

    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert version() == declared
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "9.8.7")
    app = create_app(server_settings(tmp_path / "data"))  # the daemon is made, not started
    try:
        assert app.openapi()["info"]["version"] == "9.8.7"
        assert app.state.daemon.registry.get_sample_value("cayuga_build_info", {
            "version": "9.8.7", "engine_build": BUILD, "python": platform.python_version()}) == 1
    finally:
        app.state.daemon.store.close()

    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", missing)
    assert version() == declared


def test_large_responses_are_sent_gzipped(tmp_path):
    """Swagger's 1.7 MB bundle (and /openapi.json, the console's scripts) go out
    compressed to a client that accepts gzip; small answers and WebSockets as they are."""
    from clients.testing import server_settings
    from server.serve import RunningServer

    bundle = ROOT / "server" / "console" / "static" / "vendor" / "swagger-ui" / "swagger-ui-bundle.js"
    srv = RunningServer(server_settings(tmp_path / "data")).start()
    try:
        with httpx.Client(base_url=srv.base_url, timeout=30) as c:
            assert "/console/vendor/swagger-ui/swagger-ui-bundle.js" in c.get("/docs").text
            with c.stream("GET", "/console/vendor/swagger-ui/swagger-ui-bundle.js",
                          headers={"Accept-Encoding": "gzip"}) as r:
                raw = b"".join(r.iter_raw())
            assert r.status_code == 200 and r.headers.get("content-encoding") == "gzip", r.headers
            assert len(raw) < bundle.stat().st_size / 3, f"{len(raw)} bytes sent for {bundle.stat().st_size}"
            assert gzip.decompress(raw) == bundle.read_bytes()
            plain = c.get("/console/vendor/swagger-ui/swagger-ui-bundle.js", headers={"Accept-Encoding": "identity"})
            assert "content-encoding" not in plain.headers and plain.content == bundle.read_bytes()
            small = c.get("/livez", headers={"Accept-Encoding": "gzip"})
            assert small.status_code == 200 and "content-encoding" not in small.headers
    finally:
        srv.stop()
