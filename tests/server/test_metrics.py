"""/metrics for an operator (issue 25): build info, the process's own figures,
base units, no ``*_created`` series, and OpenMetrics when the scraper asks."""

from __future__ import annotations

import re

import httpx

from air.engine import BUILD
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
