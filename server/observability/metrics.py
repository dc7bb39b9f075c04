"""Prometheus metrics. Counters live where the work happens (receivers, queue,
engine, notifiers); a collector reads them at scrape time, so the hot paths
only bump integers. It reads a :class:`MetricsSource` (the health view,
health.py), not the daemon. Each server has its own registry (tests run several).

Live instances: a scrape's size does not grow with the number of subscriptions
(up to max_subscriptions, 1M) unless ``metrics_per_subscription`` asks for a
series each. By default it has ``cayuga_subscriptions``, ``cayuga_instances``
(every subscription's count, summed), a few quantiles of instances per
subscription and ``cayuga_subscription_instances{subscription}`` for the
``metrics_top_subscriptions`` subscriptions holding the most."""

from __future__ import annotations

import heapq
import math
import platform
import time
from operator import itemgetter
from typing import Protocol

from prometheus_client import (CollectorRegistry, GCCollector, Histogram, Info, PlatformCollector, ProcessCollector,
                               disable_created_metrics)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from air.engine import BUILD as ENGINE_BUILD
from server.delivery.hub import NotifierHub
from server.durability.diskfull import PARTS, DiskState
from server.durability.journal import Journal
from server.durability.snapshot import Snapshotter
from server.durability.witlog import WitnessLog
from server.ingest.queue import DelayQueue
from server.config import Settings
from server.observability.counters import (AUTH_FAILURES, CLIENT_DROPS, DISK_FULL_REFUSALS, HTTP_CONN_REFUSED,
                                           RECEIVED, REJECTED, TCP_REFUSED, TLS_HANDSHAKE_FAILED, TLS_PLAINTEXT,
                                           Count, Counters)
from server.observability.healthmetrics import HealthCollector
from server.observability.threadcpu import ThreadCpuCollector
from server.version import version

#: Quantiles of live instances per subscription (``cayuga_subscription_instances_quantile``).
QUANTILES = (0.5, 0.9, 0.99)

#: No ``*_created`` series: a scrape is the counters' values, not when each was made.
disable_created_metrics()


class MetricsSource(Protocol):
    """What the collector reads at scrape time (server/observability/health.py: ``Health``)."""

    settings: Settings
    counters: Counters
    engine_stats: object  # the engine's running totals (events, witnesses, late, eval_errors)
    queue: DelayQueue
    hub: NotifierHub
    disk: DiskState
    snapshotter: Snapshotter
    journal: Journal | None

    @property
    def witlog(self) -> WitnessLog | None: ...

    @property
    def tcp_connections(self) -> int: ...

    @property
    def counted_at(self) -> float: ...

    @property
    def subscription_count(self) -> int: ...

    def epoch_lag_seconds(self) -> float: ...

    def instance_counts(self) -> dict[str, int]: ...

    def inexact(self) -> dict[str, dict]: ...

    def broken_subscriptions(self) -> dict[str, dict]: ...

    def witness_gaps(self) -> dict[str, list[dict]]: ...

    def runaways(self) -> dict[str, dict]: ...

    def state(self) -> dict: ...

    def workers(self) -> list[dict]: ...


def _security(c: dict) -> list:
    """The security counters (server/security): refused tokens, the audit log, TLS."""
    auth = CounterMetricFamily("cayuga_auth_failures", "Requests and connections refused for their token, per "
                               "port (http: REST and WebSockets; tcp: the event port) and reason: missing (no "
                               "token), wrong (not one of auth_tokens), scope (a token without the scope or the "
                               "reach the request needs, 403), throttled (its address sent too many wrong tokens "
                               "and waits, 429)", labels=["port", "reason"])
    for (port, reason), key in AUTH_FAILURES.items():
        auth.add_metric([port, reason], c[key])
    handshakes = CounterMetricFamily("cayuga_tls_handshake_failures", "TLS connections whose handshake failed or "
                                     "timed out (a client that does not trust the certificate, no client "
                                     "certificate where tls_client_ca wants one), per port", labels=["port"])
    plain = CounterMetricFamily("cayuga_tls_plaintext_refused", "Plain-text connections to a TLS port, answered "
                                "with an error and closed, per port", labels=["port"])
    for port, key in TLS_HANDSHAKE_FAILED.items():
        handshakes.add_metric([port], c[key])
        plain.add_metric([port], c[TLS_PLAINTEXT[port]])
    reloads = CounterMetricFamily("cayuga_tls_reloads", "Certificate reloads (SIGHUP): ok, or failed (the "
                                  "server kept the certificate it had; its log says why)", labels=["result"])
    reloads.add_metric(["ok"], c[Count.TLS_RELOADS])
    reloads.add_metric(["failed"], c[Count.TLS_RELOADS_FAILED])
    audit = CounterMetricFamily("cayuga_audit_write_errors", "Audit records that could not be written "
                                "(data_dir/audit: a full disk, permissions)", value=c[Count.AUDIT_WRITE_ERRORS])
    return [auth, handshakes, plain, reloads, audit]


class _Collector:
    def __init__(self, source: MetricsSource) -> None:
        self.d = source

    def collect(self):
        d = self.d
        c = d.counters.snapshot()
        stats = d.engine_stats
        received = CounterMetricFamily("cayuga_events_received", "Events accepted into the queue",
                                       labels=["source"])
        for source in RECEIVED:
            received.add_metric([source], c[RECEIVED[source]])
        yield received
        rejected = CounterMetricFamily("cayuga_events_rejected", "Malformed or schema-violating events",
                                       labels=["source"])
        for source in REJECTED:
            rejected.add_metric([source], c[REJECTED[source]])
        yield rejected
        yield CounterMetricFamily("cayuga_events_late", "Events older than one already released (dropped)",
                                  value=d.queue.late + stats.late)
        yield CounterMetricFamily("cayuga_events_processed", "Events processed by the engine, "
                                  "resubscribed witnesses included", value=stats.events)
        yield CounterMetricFamily("cayuga_witnesses", "Witnesses produced", value=stats.witnesses)
        yield CounterMetricFamily("cayuga_witnesses_delivered", "Witness messages handed to WebSocket clients",
                                  value=c[Count.DELIVERED])
        yield CounterMetricFamily("cayuga_eval_errors", "Predicate or schema-map evaluations that failed",
                                  value=stats.eval_errors)
        drops = CounterMetricFamily("cayuga_client_drops", "WebSocket clients disconnected: retention (what "
                                    "they needed left the witness log), disconnect (too slow on an internal "
                                    "stream, which is not logged)", labels=["policy"])
        for policy, key in CLIENT_DROPS.items():
            drops.add_metric([policy], c[key])
        yield drops
        yield CounterMetricFamily("cayuga_client_lags", "Times a WebSocket client fell client_buffer witnesses "
                                  "behind and was served from the witness log", value=c[Count.CLIENT_LAGS])
        yield GaugeMetricFamily("cayuga_lagging_clients", "WebSocket clients now catching up from the witness log",
                                value=d.hub.lagging())
        wl = d.witlog
        if wl is not None:
            yield GaugeMetricFamily("cayuga_witness_log_records", "Witnesses retained in the witness log",
                                    value=wl.records)
            yield GaugeMetricFamily("cayuga_witness_log_bytes", "Bytes retained in the witness log", value=wl.bytes)
            yield GaugeMetricFamily("cayuga_witness_log_segments", "Segment files of the witness log",
                                    value=wl.segments)
            yield CounterMetricFamily("cayuga_witness_log_appended", "Witnesses appended to the witness log since "
                                      "start-up", value=wl.appended)
            yield CounterMetricFamily("cayuga_witness_log_dropped", "Witnesses deleted from the witness log by "
                                      "retention since start-up", value=wl.dropped)
            yield CounterMetricFamily("cayuga_witness_log_deduplicated", "Re-produced witnesses (seq already in "
                                      "the log) neither logged again nor sent live, since start-up",
                                      value=wl.deduplicated)
        refusals = CounterMetricFamily("cayuga_tcp_refusals", "TCP event connections refused or closed: "
                                       "max_connections, per_address, idle (no complete line for idle_timeout), "
                                       "auth (no valid #token line)", labels=["reason"])
        for reason, key in TCP_REFUSED.items():
            refusals.add_metric([reason], c[key])
        yield refusals
        http = CounterMetricFamily("cayuga_http_refusals", "HTTP requests refused: body larger than "
                                   "max_body_bytes (413), too many events in one POST /events (413), a body "
                                   "that is not JSON (415)", labels=["reason"])
        for reason, key in (("body_bytes", Count.HTTP_BODY_TOO_LARGE), ("batch_items", Count.HTTP_BATCH_TOO_LARGE),
                            ("content_type", Count.HTTP_NOT_JSON)):
            http.add_metric([reason], c[key])
        yield http
        conns = CounterMetricFamily("cayuga_http_connections_refused", "HTTP connections closed or refused by "
                                    "server/api/httpguard.py: header_timeout (no complete request headers within "
                                    "http_header_timeout, 408), body_timeout (a request body paused for "
                                    "http_body_timeout, 408), evicted (the oldest waiting connection, to make "
                                    "room at max_http_connections, 503), max_connections (one more at "
                                    "max_http_connections, all busy, 503), websockets and websockets_per_address "
                                    "(a WebSocket beyond max_websockets or max_websockets_per_address, 503), "
                                    "request_too_large (a request line over 8 KiB, 414, or headers over 64 KiB, "
                                    "431)", labels=["reason"])
        for reason, key in HTTP_CONN_REFUSED.items():
            conns.add_metric([reason], c[key])
        yield conns
        yield from _security(c)
        full = CounterMetricFamily("cayuga_disk_full_refusals", "Requests refused because the data directory "
                                   "could not be written (a full disk): tcp (connections told 'error: disk full' "
                                   "and closed), http (507 answers)", labels=["source"])
        for source, key in DISK_FULL_REFUSALS.items():
            full.add_metric([source], c[key])
        yield full
        failing = d.disk.current()
        gauge = GaugeMetricFamily("cayuga_disk_full", "1 while that part of the data directory cannot be "
                                  "written (journal, witness_log, store, snapshot), else 0", labels=["part"])
        for part in PARTS:
            gauge.add_metric([part], 1 if part in failing else 0)
        yield gauge
        yield CounterMetricFamily("cayuga_witness_log_append_failures", "Witness-log appends that failed (the "
                                  "engine held the batch and tried again)", value=c[Count.WITNESS_LOG_ERRORS])
        yield CounterMetricFamily("cayuga_witness_log_holds", "Times the engine thread began holding a batch "
                                  "because the witness log could not be written", value=c[Count.WITNESS_LOG_HOLDS])
        yield CounterMetricFamily("cayuga_worker_seqs_told_wrong", "A subscription's batches of witnesses whose "
                                  "first seq an engine worker told otherwise than the main process numbered them "
                                  "(the main process's numbers stand): 0 unless the two fell out of step",
                                  value=c[Count.WORKER_SEQS_TOLD_WRONG])
        yield CounterMetricFamily("cayuga_tcp_error_lines_muted", "TCP connections that stopped getting their "
                                  "error lines because they did not read them",
                                  value=c[Count.TCP_ERROR_LINES_MUTED])
        yield CounterMetricFamily("cayuga_subscriptions_refused", "Registrations refused by max_subscriptions, "
                                  "max_states or max_predicate_atoms", value=c[Count.SUBSCRIPTIONS_REFUSED])
        yield CounterMetricFamily("cayuga_instances_evicted", "Instances shed, oldest first, from subscriptions "
                                  "above max_state_bytes (the heaviest) or their cap: one per instance "
                                  "(cayuga_eviction_rounds_total counts the cuts, each removing one or more)",
                                  value=c[Count.INSTANCES_EVICTED])
        yield CounterMetricFamily("cayuga_eviction_rounds", "Times a subscription was cut back by the state "
                                  "budget or its cap: one per subscription per cut, however many instances it "
                                  "lost (those: cayuga_instances_evicted_total)", value=c[Count.INSTANCE_EVICTIONS])
        yield CounterMetricFamily("cayuga_instances_evicted_shared", "Of cayuga_instances_evicted_total, the "
                                  "instances other subscriptions saw too (merged states of identical queries): "
                                  "they lost them with the one cut back, and are marked inexact too",
                                  value=c[Count.INSTANCES_EVICTED_SHARED])
        yield CounterMetricFamily("cayuga_instances_expired", "Instances dropped because no event could affect "
                                  "them any more (past their state's DUR bound): changes no witness",
                                  value=c[Count.INSTANCES_EXPIRED])
        state = d.state()
        yield GaugeMetricFamily("cayuga_state_bytes", "Automaton state (every live instance), in bytes as the "
                                "engine estimates it, at the state budget's last check", value=state["bytes"])
        yield GaugeMetricFamily("cayuga_state_budget_bytes", "max_state_bytes: above it, the heaviest "
                                "subscriptions are shed and marked inexact", value=state["max_state_bytes"])
        inexact = d.inexact()
        shed = CounterMetricFamily("cayuga_subscription_instances_shed", "Partial matches one subscription lost "
                                   "to shedding (only subscriptions that lost some)", labels=["subscription"])
        flag = GaugeMetricFamily("cayuga_subscription_inexact", "1 for a subscription that lost partial matches "
                                 "(its witnesses after /health's since_seq may lack some), until it is deleted",
                                 labels=["subscription"])
        for sid, m in sorted(inexact.items()):
            shed.add_metric([sid], m["instances_lost"])
            flag.add_metric([sid], 1)
        yield shed
        yield flag
        broken = GaugeMetricFamily("cayuga_subscription_broken", "1 for a stored subscription that does not compile "
                                   "against this configuration and does not run (/health's broken says why)",
                                   labels=["subscription"])
        for sid in sorted(d.broken_subscriptions()):
            broken.add_metric([sid], 1)
        yield broken
        missing = GaugeMetricFamily("cayuga_witness_log_missing", "Witnesses of a subscription the witness log lacks "
                                    "though they were numbered (/health's witness_gaps)", labels=["subscription"])
        for sid, runs in sorted(d.witness_gaps().items()):
            missing.add_metric([sid], sum(g["to"] - g["from"] + 1 for g in runs))
        yield missing
        runaways = GaugeMetricFamily("cayuga_subscription_runaway_visits", "Instances every input event visits, "
                                     "for the runaways of the state budget's last check", labels=["subscription"])
        for sid, r in sorted(d.runaways().items()):
            runaways.add_metric([sid], r["visits_per_event"])
        yield runaways
        snap = d.snapshotter
        yield CounterMetricFamily("cayuga_snapshots", "Snapshots of the processing state written by a forked "
                                  "child (the shutdown one is not counted)", value=snap.taken)
        yield CounterMetricFamily("cayuga_snapshot_failures", "Snapshot children that failed (the journal still "
                                  "covers everything; the next one tries again)", value=snap.failed)
        yield GaugeMetricFamily("cayuga_snapshot_pause_seconds", "How long the engine thread stood still for the "
                                "last snapshot (the fork)", value=snap.last_pause)
        yield GaugeMetricFamily("cayuga_snapshot_write_seconds", "How long the last snapshot child took",
                                value=snap.last_seconds)
        yield GaugeMetricFamily("cayuga_snapshot_bytes", "Size of the last snapshot", value=snap.last_bytes)
        yield CounterMetricFamily("cayuga_tcp_duplicates_dropped", "Lines a #sender connection sent again "
                                  "(#from K below #resume N) and that were dropped",
                                  value=c[Count.DUPLICATES_DROPPED])
        yield CounterMetricFamily("cayuga_tcp_protocol_errors", "TCP connections closed for a bad #sender, "
                                  "#from or a sender id already connected", value=c[Count.TCP_PROTOCOL_ERRORS])
        j = d.journal
        if j is not None:
            yield CounterMetricFamily("cayuga_journal_records", "Records appended to the event journal",
                                      value=j.records)
            yield CounterMetricFamily("cayuga_journal_bytes", "Bytes appended to the event journal", value=j.bytes)
            kept = j.retained()
            yield GaugeMetricFamily("cayuga_journal_retained_bytes", "Bytes the journal's segments hold now "
                                    "(recovery's part and the retained history: retain_duration, retain_bytes)",
                                    value=kept["bytes"])
            yield GaugeMetricFamily("cayuga_journal_retained_from_seconds", "Event time of the oldest retained "
                                    "event, in seconds (time_unit_ms); 0 when none",
                                    value=(kept["from"] or 0) * d.settings.time_unit_ms / 1000.0)
            yield CounterMetricFamily("cayuga_journal_syncs", "fdatasync rounds of the journal (durability: fsync)",
                                      value=j.syncs)
            buckets, total = [], 0
            for le, n in zip((*map(str, journal_buckets()), "+Inf"), j.sync_buckets):
                total += n
                buckets.append((le, total))
            sync = HistogramMetricFamily("cayuga_journal_sync_seconds", "Time of one journal sync round")
            sync.add_metric([], buckets, sum_value=j.sync_seconds)
            yield sync
            yield CounterMetricFamily("cayuga_journal_write_failures", "Journal appends refused because the "
                                      "journal could not be written or synced (cut back to the last whole record)",
                                      value=j.write_failures)
            yield CounterMetricFamily("cayuga_journal_torn_tails", "Torn or corrupt journal tails cut off when "
                                      "the journal was opened", value=j.torn)
            yield GaugeMetricFamily("cayuga_journal_position", "Position of the last journal record appended",
                                    value=j.appended)
            yield GaugeMetricFamily("cayuga_journal_retained_bytes", "Bytes the journal's segment files hold "
                                    "(deleted once a snapshot covers them)", value=j.retained_bytes)
            yield GaugeMetricFamily("cayuga_journal_segments", "Segment files of the journal",
                                    value=len(j.segments))
        yield GaugeMetricFamily("cayuga_queue_depth", "Events waiting in the priority queue", value=len(d.queue))
        yield GaugeMetricFamily("cayuga_epoch_lag_seconds", "Current time minus the engine's epoch (how far "
                                "processing is behind the clock)", value=d.epoch_lag_seconds())
        yield GaugeMetricFamily("cayuga_clients", "Connected WebSocket clients", value=d.hub.client_count)
        yield GaugeMetricFamily("cayuga_tcp_connections", "Open TCP event connections",
                                value=d.tcp_connections)
        yield GaugeMetricFamily("cayuga_instances_age_seconds", "Seconds since the live instances "
                                "(cayuga_instances, cayuga_subscription_instances) were last recounted in full "
                                "(by the engine thread, in the background)",
                                value=time.monotonic() - d.counted_at)
        yield from self._instances()

    def _instances(self):
        """Live instances: aggregates over every subscription, and one series
        per subscription for the heaviest (or, when asked, for all)."""
        d, settings = self.d, self.d.settings
        counts = d.instance_counts()  # a copy: the engine thread keeps counting
        values = sorted(counts.values())
        yield GaugeMetricFamily("cayuga_subscriptions", "Subscriptions registered", value=d.subscription_count)
        yield GaugeMetricFamily("cayuga_instances", "Live automaton instances of every subscription together "
                                "(each subscription's count, summed)", value=sum(values))
        spread = GaugeMetricFamily("cayuga_subscription_instances_quantile", "Live instances per subscription: "
                                   "the given quantile over all subscriptions (0.5: half of them hold at most "
                                   "this many)", labels=["quantile"])
        for q in QUANTILES:
            spread.add_metric([str(q)], values[max(math.ceil(q * len(values)) - 1, 0)] if values else 0)  # nearest rank
        yield spread
        if settings.metrics_per_subscription:
            per, what = counts.items(), "every subscription (metrics_per_subscription)"
        else:
            k = settings.metrics_top_subscriptions
            per = heapq.nlargest(k, ((sid, n) for sid, n in counts.items() if n), key=itemgetter(1)) if k else []
            what = (f"the {k} subscriptions holding the most (metrics_top_subscriptions; none holding none); "
                    "metrics_per_subscription: true gives every subscription")
        inst = GaugeMetricFamily("cayuga_subscription_instances", f"Live automaton instances of one subscription, "
                                 f"for {what}", labels=["subscription"])
        for sid, n in per:
            inst.add_metric([sid], n)
        yield inst


def journal_buckets():
    from server.durability.journal import SYNC_BUCKETS

    return SYNC_BUCKETS


def make_registry(source: MetricsSource) -> tuple[CollectorRegistry, Histogram]:
    """A registry of its own for one server: its counters, the engine latency
    histogram, ``cayuga_build_info`` and the process's CPU, memory and file
    descriptors and the garbage collector's passes (``process_*``, ``python_*``)."""
    reg = CollectorRegistry()
    reg.register(_Collector(source))
    reg.register(HealthCollector(source))  # engine up, engine errors, queue capacity and stall (alerts)
    reg.register(ThreadCpuCollector())  # the main process's CPU by thread (threadcpu.py)
    ProcessCollector(registry=reg)
    PlatformCollector(registry=reg)
    GCCollector(registry=reg)  # python_gc_*: the cyclic collector's passes per generation
    Info("cayuga_build", "The running server: its version, engine build and Python", registry=reg).info(
        {"version": version(), "engine_build": ENGINE_BUILD, "python": platform.python_version()})
    latency = Histogram("cayuga_engine_latency_seconds", "Engine processing time per event",
                        registry=reg,
                        buckets=(1e-6, 5e-6, 1e-5, 5e-5, 1e-4, 5e-4, 1e-3, 5e-3, 1e-2, 5e-2, 0.1, 0.5, 1.0))
    return reg, latency
