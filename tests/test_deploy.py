"""The operator's files in deploy/ (issue 25's ops row): the alert rules pass
promtool's own checks and unit tests (deploy/alerts.test.yml), and every
PromQL expression of the rules and of the Grafana dashboard names only
metrics a real server exports -- scraped from a running one, so a renamed or
removed metric breaks this test, not an operator's dashboard at 3 a.m.

Last, a real Prometheus scrapes a real server with the rules loaded and
answers every panel's query. promtool and prometheus come from Debian's
``prometheus`` package (.ci/run installs it); under CI=true a missing one
fails its tests, elsewhere they skip."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from clients.testing import free_port, stop_process, wait_until
from tests.conftest import ROOT
from tests.server.conftest import start_server, stock  # noqa: F401  (start_server is a fixture)

DEPLOY = ROOT / "deploy"
DASHBOARD = DEPLOY / "grafana" / "dashboards" / "cayuga.json"
#: Series Prometheus makes itself, per target.
SCRAPE_SERIES = {"up"}
#: Labels Prometheus adds (the target's) or a histogram's bucket bound.
SCRAPE_LABELS = {"job", "instance", "le"}
#: PromQL words that look like names: functions, aggregations, keywords.
PROMQL_WORDS = {"sum", "max", "min", "avg", "count", "by", "without", "on", "ignoring", "group_left", "group_right",
                "and", "or", "unless", "rate", "irate", "increase", "deriv", "histogram_quantile", "bool", "offset",
                "label_values", "predict_linear", "abs", "clamp_min", "topk"}


def _alert_exprs() -> list[tuple[str, str]]:
    groups = yaml.safe_load((DEPLOY / "alerts.yml").read_text())["groups"]
    return [(r["alert"], r["expr"]) for g in groups for r in g["rules"]]


def _panels(dash: dict) -> list[dict]:
    out = []
    for p in dash["panels"]:
        out.append(p)
        out.extend(p.get("panels", []))  # a collapsed row holds its panels
    return out


def _dashboard_exprs() -> list[tuple[str, str]]:
    dash = json.loads(DASHBOARD.read_text())
    exprs = [(p["title"], t["expr"]) for p in _panels(dash) if p["type"] != "row" for t in p["targets"]]
    exprs += [(f"variable {v['name']}", v["definition"]) for v in dash["templating"]["list"]]
    return exprs


def _concrete(expr: str) -> str:
    """A dashboard expression with Grafana's variables filled in, as Grafana sends it."""
    return expr.replace("$__rate_interval", "1m").replace("$instance", ".*")


def _names(expr: str) -> tuple[set[str], set[str]]:
    """The metric names and the label names an expression uses."""
    values_of = re.fullmatch(r"label_values\((\w+),\s*(\w+)\)", expr.strip())  # a Grafana variable's query
    if values_of:
        return {values_of[1]}, {values_of[2]}
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # strings: values, never names
    labels = set(re.findall(r"(\w+)\s*(?:=~|!~|!=|=)\s*\"", expr))
    for group in re.findall(r"\b(?:by|without|on|ignoring)\s*\(([^)]*)\)", expr):
        labels |= {g.strip() for g in group.split(",") if g.strip()}
    bare = re.sub(r"\{[^}]*\}|\[[^\]]*\]|\b(?:by|without|on|ignoring)\s*\([^)]*\)", " ", expr)
    words = set(re.findall(r"\b[a-zA-Z_:][\w:]*\b(?!\s*\()", bare)) - PROMQL_WORDS
    return {w for w in words if not re.fullmatch(r"[0-9e.+-]+|[0-9]+[smhdwy]", w)}, labels


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """The sample names and label names of a real server's /metrics, after some traffic."""
    from clients.testing import server_settings
    from server.serve import RunningServer

    # (with a TCP reader process, whose metrics exist only then: receivers is 0 below 4 cores)
    srv = RunningServer(server_settings(tmp_path_factory.mktemp("deploy") / "data", receivers=1)).start()
    try:
        with httpx.Client(base_url=srv.base_url, timeout=10) as c:
            # a NEXT keeps an instance alive after its first event (cayuga_instances has a value)
            r = c.post("/subscriptions", json={"cel": "SELECT * FROM Stock NEXT{$1.Name = $2.Name} Stock PUBLISH Pairs"})
            assert r.status_code == 201, r.text
            assert c.post("/events", json=[stock("IBM", 1.0, 1, 5)]).status_code == 202
            wait_until(lambda: re.search(r"^cayuga_instances(\{.*\})? 1\.0$", c.get("/metrics").text, re.M), 30,
                       "the event to be processed and its instance counted")
            text = c.get("/metrics").text
    finally:
        srv.stop()
    samples, labels = set(), set()
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples.add(s.name)
            labels |= set(s.labels)
    return samples, labels


@pytest.mark.parametrize("where", ["alerts", "dashboard"])
def test_every_expression_names_only_metrics_the_server_exports(exported, where):
    samples, labels = exported
    exprs = _alert_exprs() if where == "alerts" else _dashboard_exprs()
    assert exprs
    unknown = []
    for title, expr in exprs:
        names, used = _names(_concrete(expr))
        assert names, f"{title}: no metric found in {expr!r}"
        unknown += [f"{title}: metric {n}" for n in names - samples - SCRAPE_SERIES]
        unknown += [f"{title}: label {n}" for n in used - labels - SCRAPE_LABELS]
    assert not unknown, "not exported by the server:\n" + "\n".join(unknown)


@pytest.mark.parametrize("where", ["alerts", "dashboard"])
def test_no_expression_reads_a_per_subscription_series(where):
    """A server may hold a million subscriptions: rules and panels read aggregates only
    (cayuga_instances summed, never its subscription label)."""
    exprs = _alert_exprs() if where == "alerts" else _dashboard_exprs()
    for title, expr in exprs:
        names, labels = _names(_concrete(expr))
        assert "subscription" not in labels, f"{title}: {expr}"
        assert not any(n.startswith("cayuga_subscription_") for n in names), f"{title}: {expr}"


def test_the_name_check_catches_a_wrong_name():
    """The parser above finds names where they hide (after a function, inside by())."""
    names, labels = _names('histogram_quantile(0.99, sum by (le, part) (rate(cayuga_nope_bucket{a="b"}[5m])))'
                           " / on(instance) cayuga_other")
    assert names == {"cayuga_nope_bucket", "cayuga_other"} and labels == {"le", "part", "a", "instance"}


def test_the_dashboard_is_well_formed_and_provisioned_as_compose_mounts_it():
    dash = json.loads(DASHBOARD.read_text())
    panels = [p for p in _panels(dash) if p["type"] != "row"]
    ids = [p["id"] for p in _panels(dash)]
    assert len(ids) == len(set(ids)), "panel ids repeat"
    datasource = yaml.safe_load((DEPLOY / "grafana" / "provisioning" / "datasources" / "prometheus.yml").read_text())
    uid = datasource["datasources"][0]["uid"]
    for p in panels:
        assert p["targets"] and p["datasource"]["uid"] == uid, p["title"]
        assert all(t["datasource"]["uid"] == uid and t["expr"].strip() for t in p["targets"]), p["title"]
        pos = p["gridPos"]
        assert 0 <= pos["x"] and pos["x"] + pos["w"] <= 24, p["title"]
    titles = " ".join(p["title"].lower() for p in panels)
    for shown in ("events in", "queue", "epoch lag", "witnesses", "late", "instances", "journal", "disk full",
                  "engine", "websocket"):
        assert shown in titles, f"no panel shows {shown}"

    compose = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())["services"]
    mounts = {m.split(":")[0]: m.split(":")[1] for m in compose["grafana"]["volumes"] if m.startswith("./")}
    provider = yaml.safe_load((DEPLOY / "grafana" / "provisioning" / "dashboards" / "cayuga.yml").read_text())
    assert mounts["./grafana/dashboards"] == provider["providers"][0]["options"]["path"]
    assert mounts["./grafana/provisioning"] == "/etc/grafana/provisioning"
    assert re.fullmatch(r"grafana/grafana:\d+\.\d+\.\d+", compose["grafana"]["image"]), "pin Grafana's image"
    assert any(v.startswith("grafana-data:") for v in compose["grafana"]["volumes"])
    prom = yaml.safe_load((DEPLOY / "prometheus.yml").read_text())
    # CayugaScrapeDown and the dashboard's Scrape panel look for up{job="cayuga"}
    assert [job["job_name"] for job in prom["scrape_configs"]] == ["cayuga"]
    prom_mounts = {m.split(":")[0]: m.split(":")[1] for m in compose["prometheus"]["volumes"] if m.startswith("./")}
    for rules in prom["rule_files"]:
        assert prom_mounts[f"./{rules}"] == f"/etc/prometheus/{rules}", f"compose does not mount {rules}"


def _promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        if os.environ.get("CI") == "true":
            pytest.fail("promtool is missing: .ci/run installs Debian's prometheus package, which has it")
        pytest.skip("promtool is missing (apt-get install prometheus); CI runs this test")
    return found


def _run(*args, cwd=DEPLOY) -> str:
    r = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, f"{' '.join(map(str, args))} failed:\n{r.stdout}\n{r.stderr}"
    return r.stdout + r.stderr


def test_promtool_checks_the_rules_and_runs_their_unit_tests():
    promtool = _promtool()
    assert "SUCCESS" in _run(promtool, "check", "rules", "alerts.yml")
    assert "SUCCESS" in _run(promtool, "check", "config", "prometheus.yml")
    tested = yaml.safe_load((DEPLOY / "alerts.test.yml").read_text())["tests"]
    covered = {t["alertname"] for test in tested for t in test["alert_rule_test"]}
    assert covered == {name for name, _ in _alert_exprs()}, "every alert needs a unit test"
    assert "SUCCESS" in _run(promtool, "test", "rules", "alerts.test.yml")


def test_promtool_parses_every_dashboard_query(tmp_path):
    """Grafana shows a broken query as an empty panel; promtool refuses it here."""
    promtool = _promtool()
    rules = [{"record": f"dashboard:query_{i}", "expr": _concrete(expr)}
             for i, (_, expr) in enumerate(_dashboard_exprs()) if not expr.startswith("label_values(")]
    (tmp_path / "dashboard.yml").write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    assert "SUCCESS" in _run(promtool, "check", "rules", "dashboard.yml", cwd=tmp_path)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # the thread's death is the subject
def test_the_alerts_inputs_follow_a_real_server(start_server, monkeypatch):  # noqa: F811
    """cayuga_engine_up, cayuga_queue_stalled, cayuga_queue_capacity and
    cayuga_engine_errors_total: what CayugaEngineDead, CayugaQueueStalled and
    CayugaEngineErrors read, as /livez and /readyz see it."""
    import server.observability.health

    monkeypatch.setattr(server.observability.health, "STALL_SECONDS", 0.3)

    def value(srv, name: str) -> float:
        for family in text_string_to_metric_families(httpx.get(srv.base_url + "/metrics", timeout=10).text):
            for s in family.samples:
                if s.name == name:
                    return s.value
        raise AssertionError(f"{name} is not exported")

    srv = start_server(queue_capacity=10, max_future=3600)
    assert value(srv, "cayuga_engine_up") == 1 and value(srv, "cayuga_queue_stalled") == 0
    assert value(srv, "cayuga_queue_capacity") == 10 and value(srv, "cayuga_engine_errors_total") == 0
    soon = int(time.time() * 1000) + 1_800_000  # due in half an hour: the queue fills and nothing leaves it
    assert httpx.post(srv.base_url + "/events", json=[stock("IBM", 1.0, 1, soon)] * 10, timeout=10).status_code == 202
    wait_until(lambda: value(srv, "cayuga_queue_stalled") == 1, 20, "cayuga_queue_stalled to say 1")
    assert httpx.get(srv.base_url + "/readyz", timeout=10).status_code == 503

    class EngineDies(BaseException):
        """Not an Exception: nothing on the engine thread catches it."""

    def die(eng):
        raise EngineDies()

    srv.daemon.submit(die)
    wait_until(lambda: value(srv, "cayuga_engine_up") == 0, 10, "cayuga_engine_up to say 0")
    assert httpx.get(srv.base_url + "/livez", timeout=10).status_code == 503


def test_a_real_prometheus_scrapes_a_server_answers_every_panel_and_evaluates_the_rules(start_server,  # noqa: F811
                                                                                         tmp_path):
    """Debian's prometheus (the package that brings promtool) scrapes a running
    server over loopback with alerts.yml loaded: every rule evaluates without
    error and none is active on a healthy server, and every dashboard query
    returns a series -- so a panel is not empty for a reason the name check
    cannot see (a label that never has that value, a wrong aggregation)."""
    binary = shutil.which("prometheus")
    if binary is None:
        if os.environ.get("CI") == "true":
            pytest.fail("prometheus is missing: .ci/run installs Debian's prometheus package")
        pytest.skip("prometheus is missing (apt-get install prometheus); CI runs this test")
    srv = start_server()
    with httpx.Client(base_url=srv.base_url, timeout=10) as c:
        r = c.post("/subscriptions", json={"cel": "SELECT * FROM Stock NEXT{$1.Name = $2.Name} Stock PUBLISH Pairs"})
        assert r.status_code == 201, r.text
        assert c.post("/events", json=[stock("IBM", 1.0, 1, 5)]).status_code == 202
    target = srv.base_url.removeprefix("http://")
    config = {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
              "rule_files": [str(DEPLOY / "alerts.yml")],
              "scrape_configs": [{"job_name": "cayuga", "static_configs": [{"targets": [target]}]}]}
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    log = (tmp_path / "prometheus.log").open("w")
    prom = subprocess.Popen([binary, f"--config.file={tmp_path / 'prometheus.yml'}",
                             f"--storage.tsdb.path={tmp_path / 'tsdb'}", f"--web.listen-address=127.0.0.1:{port}"],
                            stdout=log, stderr=subprocess.STDOUT)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as api:
            def query(expr: str) -> list:
                body = api.get("/api/v1/query", params={"query": expr}).json()
                assert body["status"] == "success", f"{expr}: {body}"
                return body["data"]["result"]

            def ready() -> bool:
                assert prom.poll() is None, (tmp_path / "prometheus.log").read_text()[-3000:]
                try:
                    # two scrapes of a counter make a rate
                    return api.get("/-/ready").status_code == 200 and bool(
                        query("rate(cayuga_events_processed_total[1m])")) and bool(query("cayuga_instances"))
                except httpx.TransportError:
                    return False

            wait_until(ready, 60, "Prometheus to scrape the server twice")
            empty = [f"{title}: {expr}" for title, expr in _dashboard_exprs()
                     if not expr.startswith("label_values(") and not query(_concrete(expr))]
            assert not empty, "panels without data from a running server:\n" + "\n".join(empty)

            def evaluated() -> list:
                rules = [r for g in api.get("/api/v1/rules").json()["data"]["groups"] for r in g["rules"]]
                return rules if rules and all(r.get("lastEvaluation", "").startswith("2") and
                                              not r["lastEvaluation"].startswith("0001") for r in rules) else []

            wait_until(evaluated, 30, "every rule to be evaluated once")
            rules = evaluated()
            assert sorted(r["name"] for r in rules) == sorted(name for name, _ in _alert_exprs())
            assert [(r["name"], r.get("lastError")) for r in rules if r["health"] != "ok"] == []
            assert [a for r in rules for a in r.get("alerts", [])] == [], "alerts on a healthy server"
    finally:
        try:
            stop_process(prom)
        finally:
            log.close()
