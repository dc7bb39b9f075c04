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
        batches = GaugeMetricFamily("cayuga_engine_worker_in_flight_batches", "Batches handed to an engine worker "
                                    "and not yet back (its queue depth)", labels=["worker"])
        events = CounterMetricFamily("cayuga_engine_worker_events", "Events an engine worker has taken and "
                                     "answered (rate() gives its events/s)", labels=["worker"])
        instances = GaugeMetricFamily("cayuga_engine_worker_instances", "Instances of an engine worker's "
                                      "subscriptions at the last count", labels=["worker"])
        cpu = CounterMetricFamily("cayuga_engine_worker_cpu_seconds", "CPU time an engine worker process has used "
                                  "(its current process: a restart starts it again)", labels=["worker"])
        waited = CounterMetricFamily("cayuga_engine_worker_cpu_wait_seconds", "Time an engine worker process was "
                                     "ready to run and waited for a CPU (Linux's schedstat run delay; its current "
                                     "process): high beside its CPU, the machine has fewer free cores than the "
                                     "workers and the main process need", labels=["worker"])
        restarts = CounterMetricFamily("cayuga_engine_worker_restarts", "Times an engine worker that died was "
                                       "started again (server/workers/restart.py)", labels=["worker"])
        stopped = GaugeMetricFamily("cayuga_engine_worker_stopped", "1 once an engine worker died too often to be "
                                    "started again (its subscriptions get no events: restart the server)",
                                    labels=["worker"])
        collections = CounterMetricFamily("cayuga_engine_worker_gc_collections", "Collections of the cyclic garbage "
                                          "collector in an engine worker process, per generation, at the last "
                                          "instance count (its current process)", labels=["worker", "generation"])
        parts = CounterMetricFamily("cayuga_engine_worker_batch_cpu_seconds", "CPU time of an engine worker's "
                                    "batches by part: decode (its events made from the message), engine (the "
                                    "feed), witnesses (theirs and the result's encoding); at the last instance "
                                    "count (its current process)", labels=["worker", "part"])
        oldest = GaugeMetricFamily("cayuga_engine_worker_oldest_batch_seconds", "Seconds since an engine worker was "
                                   "sent the oldest batch it has not answered (0: it owes none); /health says "
                                   "not_answering past 15 s", labels=["worker"])
        for w in d.workers():
            label = [str(w["worker"])]
            oldest.add_metric(label, w.get("oldest_batch_s") or 0.0)
            up.add_metric(label, 1 if w["alive"] else 0)
            flight.add_metric(label, w["in_flight_events"])
            batches.add_metric(label, w["in_flight_batches"])
            events.add_metric(label, w["events"])
            instances.add_metric(label, w["instances"])
            if w["cpu_seconds"] is not None:
                cpu.add_metric(label, w["cpu_seconds"])
            if w.get("cpu_wait_seconds") is not None:
                waited.add_metric(label, w["cpu_wait_seconds"])
            restarts.add_metric(label, w["restarts"])
            for generation, n in enumerate(w["gc_collections"] or ()):
                collections.add_metric([*label, str(generation)], n)
            for part, seconds in (w["cpu_parts"] or {}).items():
                parts.add_metric([*label, part], seconds)
            stopped.add_metric(label, 1 if w["state"] == "stopped" else 0)
        yield from (up, flight, batches, events, instances, cpu, waited, restarts, stopped, collections, parts, oldest)
        readers = getattr(getattr(d, "receiver", None), "readers", None)
        if readers is not None:  # receivers: 1 (server/ingest/readers.py)
            yield CounterMetricFamily("cayuga_tcp_reader_restarts", "Times the TCP reader process died and "
                                      "another was started (its connections ended; their senders resume)",
                                      value=readers.restarts)
            used = readers.cpu_seconds()
            if used is not None:
                yield CounterMetricFamily("cayuga_tcp_reader_cpu_seconds", "CPU time the TCP reader process has "
                                          "used (its current process: a restart starts it again)", value=used)
        yield CounterMetricFamily("cayuga_engine_errors", "Events the engine raised an error on (the thread "
                                  "survived; /health reports the last one and says degraded)",
                                  value=d.counters.get(Count.ENGINE_ERRORS))
        yield GaugeMetricFamily("cayuga_queue_capacity", "Events the priority queue holds before senders block "
                                "(queue_capacity)", value=d.queue.capacity)
        yield GaugeMetricFamily("cayuga_queue_stalled", "1 while the queue is full and nothing has left it for "
                                "a while (senders are blocked; /readyz answers 503), else 0",
                                value=1 if d.queue_stalled() else 0)
