"""The server's health as metrics, for alert rules and the dashboard
(deploy/alerts.yml, deploy/grafana/): what /livez and /readyz decide, as
numbers Prometheus keeps a history of. Read at scrape time from the health
view (health.py), never waiting for the engine thread."""

from __future__ import annotations

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from server.observability.counters import Count


class HealthCollector:
    """``cayuga_engine_up``, ``cayuga_engine_errors_total``, ``cayuga_queue_capacity``
    and ``cayuga_queue_stalled`` from a :class:`server.observability.health.Health`."""

    def __init__(self, source) -> None:
        self.d = source

    def collect(self):
        d = self.d
        yield GaugeMetricFamily("cayuga_engine_up", "1 while the engine thread runs, 0 once it has died (/livez "
                                "answers 503: restart the server)", value=1 if d.engine_alive else 0)
        up = GaugeMetricFamily("cayuga_engine_worker_up", "1 while an engine worker process runs (engine_workers), "
                               "0 once it has ended", labels=["worker"])
        flight = GaugeMetricFamily("cayuga_engine_worker_in_flight_events", "Events handed to an engine worker "
                                   "and not yet back", labels=["worker"])
        for w in d.workers():
            up.add_metric([str(w["worker"])], 1 if w["alive"] else 0)
            flight.add_metric([str(w["worker"])], w["in_flight_events"])
        yield up
        yield flight
        yield CounterMetricFamily("cayuga_engine_errors", "Events the engine raised an error on (the thread "
                                  "survived; /health reports the last one and says degraded)",
                                  value=d.counters.get(Count.ENGINE_ERRORS))
        yield GaugeMetricFamily("cayuga_queue_capacity", "Events the priority queue holds before senders block "
                                "(queue_capacity)", value=d.queue.capacity)
        yield GaugeMetricFamily("cayuga_queue_stalled", "1 while the queue is full and nothing has left it for "
                                "a while (senders are blocked; /readyz answers 503), else 0",
                                value=1 if d.queue_stalled() else 0)
