"""Named event counters: the receivers, the API and the engine thread bump them; scrapes read them.

Every counter is a member of :class:`Count`, so a misspelt one fails where it
is written (an AttributeError, or a KeyError for a string) instead of reading 0.
The families with a label (``TCP_REFUSED``, ``HTTP_CONN_REFUSED``, ...) map the
label to its member; they are built at import, so a label without a member
fails then. :class:`Counters` holds their values, read by metrics.py and /stats.
"""

from __future__ import annotations

import threading
from enum import Enum


class Count(Enum):
    """Every counter; the value is its key in /stats's and the tests' words."""

    RECEIVED_TCP = "received_tcp"  # events accepted into the queue, per source
    RECEIVED_HTTP = "received_http"
    REJECTED_TCP = "rejected_tcp"  # malformed or schema-violating events, per source
    REJECTED_HTTP = "rejected_http"
    DELIVERED = "delivered"  # witness messages handed to WebSocket clients
    DROP_RETENTION = "drop_retention"  # clients closed: what they needed left the witness log
    DROP_DISCONNECT = "drop_disconnect"  # clients closed: too slow on an internal (unlogged) stream
    CLIENT_LAGS = "client_lags"  # times a client fell client_buffer behind (served from the log)
    TCP_REFUSED_MAX_CONNECTIONS = "tcp_refused_max_connections"
    TCP_REFUSED_PER_ADDRESS = "tcp_refused_per_address"
    TCP_REFUSED_IDLE = "tcp_refused_idle"
    TCP_REFUSED_AUTH = "tcp_refused_auth"
    TCP_PROTOCOL_ERRORS = "tcp_protocol_errors"  # a bad #sender, #from, or a sender id already connected
    TCP_SENDER_TAKEN = "tcp_sender_taken"  # of those: the sender id was already connected
    TCP_ERROR_LINES_MUTED = "tcp_error_lines_muted"
    DUPLICATES_DROPPED = "duplicates_dropped"  # lines a #sender sent again
    HTTP_BODY_TOO_LARGE = "http_body_too_large"
    HTTP_BATCH_TOO_LARGE = "http_batch_too_large"
    HTTP_NOT_JSON = "http_not_json"
    HTTP_CONN_HEADER_TIMEOUT = "http_conn_header_timeout"
    HTTP_CONN_BODY_TIMEOUT = "http_conn_body_timeout"
    HTTP_CONN_EVICTED = "http_conn_evicted"
    HTTP_CONN_MAX_CONNECTIONS = "http_conn_max_connections"
    HTTP_CONN_WEBSOCKETS = "http_conn_websockets"  # a WebSocket refused at max_websockets
    HTTP_CONN_WEBSOCKETS_PER_ADDRESS = "http_conn_websockets_per_address"  # ... at max_websockets_per_address
    HTTP_CONN_REQUEST_TOO_LARGE = "http_conn_request_too_large"  # a request line or headers too long (414, 431)
    DISK_FULL_REFUSALS_TCP = "disk_full_refusals_tcp"
    DISK_FULL_REFUSALS_HTTP = "disk_full_refusals_http"
    WITNESS_LOG_ERRORS = "witness_log_errors"  # witness-log appends that failed
    WITNESS_LOG_HOLDS = "witness_log_holds"  # times the engine thread began holding a batch
    SUBSCRIPTIONS_REFUSED = "subscriptions_refused"
    INSTANCES_EVICTED = "instances_evicted"
    INSTANCE_EVICTIONS = "instance_evictions"
    INSTANCES_EVICTED_SHARED = "instances_evicted_shared"
    INSTANCES_EXPIRED = "instances_expired"  # past their filter's DUR bound (changes no witness)
    SNAPSHOT_FORKS = "snapshot_forks"
    ENGINE_ERRORS = "engine_errors"
    #: a subscription's batches of witnesses whose first seq an engine worker told otherwise than the main
    #: process numbered them (its numbers stand): none, unless the two fell out of step
    WORKER_SEQS_TOLD_WRONG = "worker_seqs_told_wrong"
    # requests and connections refused for their token (server/security), per port and reason
    AUTH_HTTP_MISSING = "auth_http_missing"
    AUTH_HTTP_WRONG = "auth_http_wrong"
    AUTH_HTTP_SCOPE = "auth_http_scope"
    AUTH_HTTP_THROTTLED = "auth_http_throttled"
    AUTH_TCP_MISSING = "auth_tcp_missing"
    AUTH_TCP_WRONG = "auth_tcp_wrong"
    AUTH_TCP_SCOPE = "auth_tcp_scope"
    AUTH_TCP_THROTTLED = "auth_tcp_throttled"
    AUDIT_WRITE_ERRORS = "audit_write_errors"  # audit records that could not be written
    TLS_HANDSHAKE_FAILED_HTTP = "tls_handshake_failed_http"  # TLS connections whose handshake failed, per port
    TLS_HANDSHAKE_FAILED_TCP = "tls_handshake_failed_tcp"
    TLS_PLAINTEXT_HTTP = "tls_plaintext_http"  # plain-text connections to a TLS port, per port
    TLS_PLAINTEXT_TCP = "tls_plaintext_tcp"
    TLS_RELOADS = "tls_reloads"  # certificate reloads (SIGHUP) that took, and that failed
    TLS_RELOADS_FAILED = "tls_reloads_failed"


#: Per source ("tcp", "http"): events accepted, events rejected, requests refused for a full disk.
RECEIVED = {"tcp": Count.RECEIVED_TCP, "http": Count.RECEIVED_HTTP}
REJECTED = {"tcp": Count.REJECTED_TCP, "http": Count.REJECTED_HTTP}
DISK_FULL_REFUSALS = {"tcp": Count.DISK_FULL_REFUSALS_TCP, "http": Count.DISK_FULL_REFUSALS_HTTP}
#: Per reason a TCP connection was refused or closed (server/ingest/tcp.py).
TCP_REFUSED = {r: Count[f"TCP_REFUSED_{r.upper()}"] for r in ("max_connections", "per_address", "idle", "auth")}
#: Per reason an HTTP connection was closed or refused (server/api/httpguard.py).
HTTP_CONN_REFUSED = {r: Count[f"HTTP_CONN_{r.upper()}"]
                     for r in ("header_timeout", "body_timeout", "evicted", "max_connections", "websockets",
                               "websockets_per_address", "request_too_large")}
#: Per (port, reason) a token was refused (server/security): missing, wrong, scope, throttled.
AUTH_PORTS = ("http", "tcp")
AUTH_REASONS = ("missing", "wrong", "scope", "throttled")
AUTH_FAILURES = {(port, reason): Count[f"AUTH_{port.upper()}_{reason.upper()}"]
                 for port in AUTH_PORTS for reason in AUTH_REASONS}
#: Per port: TLS handshakes that failed, plain-text connections refused on a TLS port.
TLS_HANDSHAKE_FAILED = {p: Count[f"TLS_HANDSHAKE_FAILED_{p.upper()}"] for p in AUTH_PORTS}
TLS_PLAINTEXT = {p: Count[f"TLS_PLAINTEXT_{p.upper()}"] for p in AUTH_PORTS}
#: Per reason a WebSocket client was closed (server/delivery/hub.py's policies).
CLIENT_DROPS = {"retention": Count.DROP_RETENTION, "disconnect": Count.DROP_DISCONNECT}


class Counters:
    """Thread-safe named counters (receivers and the API write; scrapes read)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._c: dict[Count, int] = dict.fromkeys(Count, 0)

    def add(self, key: Count, n: int = 1) -> None:
        with self._lock:
            try:
                self._c[key] += n
            except KeyError:
                raise KeyError(f"{key!r} is not a counter: use a member of "
                               "server.observability.counters.Count") from None

    def get(self, key: Count) -> int:
        with self._lock:
            try:
                return self._c[key]
            except KeyError:
                raise KeyError(f"{key!r} is not a counter: use a member of "
                               "server.observability.counters.Count") from None

    def snapshot(self) -> dict[Count, int]:
        with self._lock:
            return dict(self._c)
