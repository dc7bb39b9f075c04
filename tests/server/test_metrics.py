"""/metrics for an operator (issue 25): build info, the process's own figures,
base units, no ``*_created`` series, OpenMetrics when the scraper asks, a scrape
whose size does not grow with the subscriptions (unless asked), and names an
operator cannot take for one another."""

from __future__ import annotations

import re

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from air.engine import BUILD
from clients.testing import wait_until
from server.config import ConfigError
from tests.server.conftest import stock


def test_metrics_carry_build_info_process_figures_and_base_units(start_server):
    srv = start_server(time_unit_ms=1000)  # the stream's time unit is the second
    r = httpx.post(srv.base_url + "/events", json=[stock("IBM", 1.0, 1, 5)], timeout=10)
    assert r.status_code == 202
    text = httpx.get(srv.base_url + "/metrics", timeout=10).text
    assert re.search(r'^cayuga_build_info\{.*engine_build="%s".*\} 1\.0$' % BUILD, text, re.M), text[:2000]
    for family in ("process_resident_memory_bytes", "process_open_fds", "python_info", "cayuga_epoch_lag_seconds"):
        assert re.search(rf"^{family}\b", text, re.M), family
    assert "_created" not in text
    assert not re.search(r"^cayuga_epoch_lag ", text, re.M)  # in stream time units: gone


def test_openmetrics_when_the_scraper_asks_for_it(start_server):
    srv = start_server()
    r = httpx.get(srv.base_url + "/metrics", timeout=10,
                  headers={"Accept": "application/openmetrics-text; version=1.0.0; charset=utf-8"})
    assert r.headers["content-type"].startswith("application/openmetrics-text")
    assert r.text.endswith("# EOF\n")
    plain = httpx.get(srv.base_url + "/metrics", timeout=10)
    assert plain.headers["content-type"].startswith("text/plain") and "# EOF" not in plain.text


def test_the_journal_and_the_witness_log_report_their_size_on_disk(start_server):
    """Disk alerts need the size of each log, not bytes appended since start-up."""
    srv = start_server()
    with httpx.Client(base_url=srv.base_url, timeout=10) as c:
        c.post("/subscriptions", json={"cel": "SELECT * FROM Stock PUBLISH Everything"})
        assert c.post("/events", json=[stock("IBM", 1.0, 1, t) for t in range(1, 101)]).status_code == 202
        text = c.get("/metrics").text
    values = {m.group(1): float(m.group(2)) for m in re.finditer(r"^(cayuga_\w+) ([0-9.e+]+)$", text, re.M)}
    files = sorted((srv.daemon.settings.data_dir / "journal").iterdir())
    assert values["cayuga_journal_segments"] == len(files) >= 1
    on_disk = sum(f.stat().st_size for f in files)
    # whole records, plus each segment's 8-byte file header
    assert 0 < values["cayuga_journal_retained_bytes"] <= on_disk <= values["cayuga_journal_retained_bytes"] + 8 * len(files)
    assert values["cayuga_witness_log_bytes"] > 0


# -- live instances: a bounded scrape by default, every subscription on request

#: Subscription i keeps one instance per event of Volume <= its bound (each event has a name of its own,
#: so none is ever matched). Most have bound 0; HEAVY of them bounds 1..HEAVY and so hold 2..HEAVY+1.
HEAVY = 30


def _fill(c: httpx.Client, n: int) -> tuple[list[str], dict[str, int]]:
    """Register ``n`` subscriptions (the last HEAVY heavier, each more than the one before) and send the
    events; returns the ids and the instances each will hold."""
    bounds = [0] * (n - HEAVY) + list(range(1, HEAVY + 1))
    cels = [f"FILTER{{Volume <= {b}}}(Stock) NEXT{{$1.Name = $2.Name}} Stock PUBLISH P{i}"
            for i, b in enumerate(bounds)]
    r = c.post("/subscriptions/batch", json={"subscriptions": [{"cel": cel} for cel in cels]}, timeout=120)
    assert r.status_code == 201, r.text[:500]
    ids = [s["id"] for s in r.json()["subscriptions"]]
    events = [stock(f"N{v}", 1.0, v, t) for t, v in enumerate(range(HEAVY + 1), start=1)]
    assert c.post("/events", json=events).status_code == 202
    return ids, {sid: b + 1 for sid, b in zip(ids, bounds)}


def _families(text: str) -> dict:
    return {f.name: f for f in text_string_to_metric_families(text)}


def _counted(c: httpx.Client, total: int) -> str:
    """A scrape once every subscription's instances are counted (``cayuga_instances`` == total)."""
    def scraped():
        text = c.get("/metrics").text
        every = [s.value for s in _families(text)["cayuga_instances"].samples if not s.labels]
        return text if every == [total] else None

    return wait_until(scraped, timeout=60, what=f"{total} live instances counted")


def test_the_default_scrape_stays_small_with_many_subscriptions(start_server):
    """2,000 subscriptions: aggregates and the 10 heaviest, not a series each."""
    srv = start_server()
    with httpx.Client(base_url=srv.base_url, timeout=30) as c:
        empty = c.get("/metrics").text  # (the server's own series: per thread, per worker, ...)
        ids, holds = _fill(c, 2000)
        text = _counted(c, sum(holds.values()))
    fams = _families(text)
    assert fams["cayuga_subscriptions"].samples[0].value == 2000
    per = {s.labels["subscription"]: s.value for s in fams["cayuga_subscription_instances"].samples}
    assert per == {sid: holds[sid] for sid in ids[-10:]}  # the ten heaviest, each with its own count
    spread = {s.labels["quantile"]: s.value for s in fams["cayuga_subscription_instances_quantile"].samples}
    assert spread == {"0.5": 1, "0.9": 1, "0.99": 11}  # nearest rank: the 1980th of 2,000, the 10th heavy one
    instance_series = [line for line in text.splitlines() if re.match(r"cayuga_\w*instances\w*[{ ]", line)]
    assert len(instance_series) <= 10 + 10, instance_series
    # what 2,000 subscriptions add: the ten heaviest and the aggregates (the 2,000 series alone took ~90 KB)
    grown = len(text.encode()) - len(empty.encode())
    assert grown < 6_000, grown
    assert len(text.encode()) < 40_000


def test_per_subscription_series_when_the_setting_asks(start_server):
    srv = start_server(metrics_per_subscription=True)
    with httpx.Client(base_url=srv.base_url, timeout=30) as c:
        ids, holds = _fill(c, 2000)
        text = _counted(c, sum(holds.values()))
    per = {s.labels["subscription"]: s.value for s in _families(text)["cayuga_subscription_instances"].samples}
    assert per == holds


def test_top_k_and_the_opt_in_come_from_config_and_environment(tmp_path, monkeypatch):
    from server.config import load_settings

    config = tmp_path / "cayuga.yaml"
    config.write_text("metrics_top_subscriptions: 3\n")
    monkeypatch.setenv("CAYUGA_METRICS_PER_SUBSCRIPTION", "true")
    s = load_settings(config)
    assert s.metrics_top_subscriptions == 3 and s.metrics_per_subscription is True
    monkeypatch.setenv("CAYUGA_METRICS_TOP_SUBSCRIPTIONS", "-1")
    with pytest.raises(ConfigError, match="metrics_top_subscriptions"):
        load_settings(config)


def _stems(name: str) -> frozenset[str]:
    """The words of a metric name without their endings: instances_evicted and
    instance_evictions both give {instance, evict}."""
    words = name.removeprefix("cayuga_").split("_")
    return frozenset(re.sub(r"(ion|ed)$", "", w.removesuffix("s")) for w in words)


def test_metric_names_say_what_they_count(start_server):
    """No two families an operator could take for each other (the same words but
    for their endings), and the eviction counters say how they differ."""
    srv = start_server()
    fams = _families(httpx.get(srv.base_url + "/metrics", timeout=10).text)
    ours = {n: f for n, f in fams.items() if n.startswith("cayuga_")}
    by_stems: dict[frozenset, list[str]] = {}
    for name in ours:
        by_stems.setdefault(_stems(name), []).append(name)
    assert [names for names in by_stems.values() if len(names) > 1] == []
    for name, fam in ours.items():
        assert fam.documentation, f"{name} has no HELP"
        if fam.type == "counter":  # the parser strips _total from a counter family's name
            assert not name.endswith("_total")
        else:
            assert not name.endswith("_total"), f"{name} is a {fam.type} named like a counter"
    evicted, rounds = ours["cayuga_instances_evicted"], ours["cayuga_eviction_rounds"]
    assert evicted.type == rounds.type == "counter"
    assert "cayuga_eviction_rounds_total" in evicted.documentation
    assert "cayuga_instances_evicted_total" in rounds.documentation
    assert "cayuga_instance_evictions" not in fams
