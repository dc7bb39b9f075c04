"""A small Python client for a Cayuga server: REST, WebSocket and the TCP event port.

An ``https://`` URL speaks TLS on all three (the server's tls_certfile covers
both its ports): ``cacert`` is the CA (PEM) that signed the server's
certificate when it is not one the system trusts, ``cert``/``key`` the
client's certificate for a server that wants one (tls_client_ca).

>>> c = CayugaClient("http://127.0.0.1:8400")                       # doctest: +SKIP
>>> c.declare_stream("Stock", {"Name": "string", "Price": "float"})  # doctest: +SKIP
>>> sub = c.subscribe(cel="SELECT * FROM Stock PUBLISH All")          # doctest: +SKIP
>>> with c.watch(sub["id"]) as matches:                              # doctest: +SKIP
...     with c.sender() as s:
...         s.send({"stream": "Stock", "Name": "IBM", "Price": 84.0})
...     print(next(matches))
"""

from __future__ import annotations

import json
import os
import random
import re
import socket
import ssl
import struct
import threading
import time
from contextlib import contextmanager
from itertools import repeat
from operator import getitem
from typing import Callable, Iterable, Iterator
from urllib.parse import quote, urlparse

import httpx
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus
from websockets.sync.client import connect

from clients.tls import TlsSetupError, alert_of, explain_tls, tls_context  # noqa: F401  (part of this API)

#: WebSocket close codes after which reconnecting cannot help: bad parameter, bad token,
#: a token without the scope or reach, unknown subscription or stream, a broken subscription
#: (its query no longer compiles against the server's configuration), no longer retained,
#: ``from`` beyond the end.
FINAL_CLOSE_CODES = frozenset({4400, 4401, 4403, 4404, 4409, 4410, 4416})
#: What a close without a reason of its own means, in words: the standard codes a server or
#: a proxy sends (uvicorn closes the WebSockets still open when it stops with 1012).
CLOSE_WORDS = {1001: "the server is shutting down", 1006: "the connection was lost",
               1011: "the server failed (an internal error)", 1012: "the server is shutting down",
               1013: "the server asks to try again later"}
#: The ``<seq> `` that starts each line of a message asked for with seq.


def strip_seqs(frame: bytes, first: int, last: int) -> bytes:
    """``frame``'s lines ``<seq> <JSON>``, seqs ``first`` to ``last`` one after
    another, without their seq prefixes: each line's prefix is as wide as its
    seq has digits, so the lines are cut in C (a slice per run of equal
    widths), not matched one by one."""
    if first == last:
        return frame[frame.find(b" ") + 1:]
    lines = frame.split(b"\n")
    out: list[bytes] = []
    seq, i = first, 0
    while seq <= last:
        width = len(str(seq))
        upto = min(last, 10 ** width - 1)  # the last seq with this many digits
        k = upto - seq + 1
        out.extend(map(getitem, lines[i:i + k], repeat(slice(width + 1, None))))
        i += k
        seq = upto + 1
    return b"\n".join(out)


#: The server's address when nothing says otherwise (``cayuga serve``'s defaults).
DEFAULT_URL = "http://127.0.0.1:8400"


def is_control(message: str | bytes) -> bool:
    """Whether a WebSocket message is a control message (a JSON object with a
    ``"control"`` key, e.g. ``{"control": "inexact", ...}``), not witnesses."""
    head = message[:11]
    return head == '{"control":' or head == b'{"control":'


def default_url(environ=None) -> str:
    """The server's base URL from the environment: ``CAYUGA_URL`` when set;
    else, for a client beside the server, the server's own settings
    ``CAYUGA_HOST`` (a wildcard address such as 0.0.0.0 means this machine)
    and ``CAYUGA_HTTP_PORT`` (``https`` when ``CAYUGA_TLS_CERTFILE`` is set);
    else :data:`DEFAULT_URL`. Raises ValueError
    when those settings give no address a client can reach."""
    env = os.environ if environ is None else environ
    url = (env.get("CAYUGA_URL") or "").strip()
    if url:
        if not re.match(r"^https?://[^/\s]+", url):
            raise ValueError(f"CAYUGA_URL={url!r} is not an http:// or https:// URL (e.g. http://127.0.0.1:8400)")
        return url.rstrip("/")
    host = (env.get("CAYUGA_HOST") or "").strip() or "127.0.0.1"
    port = (env.get("CAYUGA_HTTP_PORT") or "").strip() or "8400"
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"CAYUGA_HTTP_PORT={port!r} names no port a client can connect to (1-65535; 0 lets the "
                         "server pick one): set CAYUGA_URL, or give --url, with the port the server listens on")
    host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    scheme = "https" if (env.get("CAYUGA_TLS_CERTFILE") or "").strip() else "http"  # the server's TLS setting
    return f"{scheme}://{host}:{port}"


class CayugaAPIError(RuntimeError):
    """The server answered with an error; ``status`` and ``body`` say what and why."""

    def __init__(self, status: int, body) -> None:
        self.status = status
        self.body = body
        #: The server's own words (``detail`` of its JSON answer, a close's reason).
        self.detail = str(body.get("detail") if isinstance(body, dict) else body)
        super().__init__(f"HTTP {status}: {self.detail}")


class WebSocketClosed(CayugaAPIError):
    """The server closed a WebSocket with a code no retry mends (:data:`FINAL_CLOSE_CODES`):
    ``status`` is the close code (e.g. 4404), ``detail`` its reason."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(code, reason)
        self.args = (f"the server closed the WebSocket ({code}): {reason}",)


def close_words(code: int | None, reason: str = "") -> str:
    """Why a WebSocket closed, in words: the server's reason, else what its code means
    (:data:`CLOSE_WORDS`); ``code`` None: no close frame came (the connection was lost)."""
    if code is None:
        return CLOSE_WORDS[1006]
    return reason or CLOSE_WORDS.get(code) or f"the server closed the connection (WebSocket close code {code})"


class WebSocketRefused(CayugaAPIError):
    """The server answered a WebSocket handshake with an HTTP error (e.g. 503 at
    ``max_websockets``); ``body`` is its JSON, whose ``detail`` names the cap."""


class _RecvTimeout(Exception):
    pass


def _handshake_body(body: bytes | None):
    """The body of a refused WebSocket handshake: its JSON (the server's
    ``{"detail": ...}``), else its text."""
    text = bytes(body or b"").decode(errors="replace").strip()
    try:
        return json.loads(text)
    except ValueError:
        return text or "(no body)"


class SenderRefused(ConnectionError):
    """The server answered ``#sender`` with a refusal instead of ``#resume N``:
    ``answer`` is its line (``error: sender <id> is already connected ...``,
    ``error line 1: authentication required ...``, ``error: too many connections ...``)."""

    def __init__(self, answer: str) -> None:
        self.answer = answer
        super().__init__(f"the server answered #sender with: {answer}")


class Backoff:
    """Waits between reconnection attempts: doubling from ``first`` to ``cap``
    seconds, each drawn at random between half of it and all of it ("equal
    jitter"), so that the clients one server restart cut off do not all come
    back in the same instant. :meth:`reset` once a connection works again."""

    def __init__(self, first: float = 0.1, cap: float = 5.0, rand: Callable[[], float] = random.random) -> None:
        self.first, self.cap, self._rand = first, cap, rand
        self._step = first

    def reset(self) -> None:
        self._step = self.first

    def next(self) -> float:
        """The next wait, in seconds."""
        step = self._step
        self._step = min(step * 2, self.cap)
        return step / 2 + self._rand() * step / 2


class CayugaClient:
    def __init__(self, base_url: str | None = None, *, token: str | None = None,
                 tcp_port: int | None = None, timeout: float = 30.0, cacert: str | None = None,
                 cert: str | None = None, key: str | None = None, ssl_context: ssl.SSLContext | None = None) -> None:
        """``base_url`` defaults to :func:`default_url` (``CAYUGA_URL``, or the
        server's own ``CAYUGA_HOST``/``CAYUGA_HTTP_PORT``, or http://127.0.0.1:8400).
        With an ``https://`` URL, REST, WebSockets and the TCP port speak TLS:
        ``cacert``, ``cert``, ``key`` as :func:`tls_context` takes them (or a
        ready ``ssl_context``)."""
        self.base_url = (base_url or default_url()).rstrip("/")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.token = token
        self.tls = urlparse(self.base_url).scheme == "https"
        self.ssl_context = ssl_context or (tls_context(cacert, cert, key) if self.tls else None)
        self.http = httpx.Client(base_url=self.base_url, headers=headers, timeout=timeout,
                                 verify=self.ssl_context if self.ssl_context is not None else True)
        self._tcp_port = tcp_port

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> "CayugaClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _call(self, method: str, path: str, **kw):
        r = self.http.request(method, path, **kw)
        body = r.json() if r.content and r.headers.get("content-type", "").startswith("application/json") else r.text
        if r.status_code >= 400:
            raise CayugaAPIError(r.status_code, body)
        return body

    # -- REST
    def health(self) -> dict:
        return self._call("GET", "/health")

    def declare_stream(self, name: str, schema: dict[str, str]) -> dict:
        return self._call("POST", "/streams", json={"name": name, "schema": schema})

    def streams(self) -> list[dict]:
        return self._call("GET", "/streams")

    def subscribe(self, *, cel: str | None = None, air: str | None = None, name: str | None = None,
                  max_instances: int | None = None, max_state_bytes: int | str | None = None,
                  sase: str | None = None, from_: float | str | None = None) -> dict:
        """Register a subscription; the answer's ``warnings`` list each clause
        that keeps automaton instances without a time bound (registered all the
        same). ``max_instances`` / ``max_state_bytes`` (bytes or a size such as
        ``"64MiB"``) cap its state (above, its oldest partial matches are shed
        and it is marked inexact). ``from_`` (an event time, ``"retained"`` or
        ``"-24h"``) runs it over the server's retained history first: the
        answer's ``backfill`` says how far it is."""
        body: dict = {"cel": cel} if cel is not None else {"sase": sase} if sase is not None else {"air": air}
        if name:
            body["name"] = name
        if max_instances is not None:
            body["max_instances"] = max_instances
        if max_state_bytes is not None:
            body["max_state_bytes"] = max_state_bytes
        if from_ is not None:
            body["from"] = from_
        return self._call("POST", "/subscriptions", json=body)

    def subscribe_body(self, body: dict) -> dict:
        """``POST /subscriptions`` with ``body`` as the API takes it (``cel``/``air``/``sase``,
        ``name``, caps, ``from``): for a body read as is, e.g. a line of a .jsonl file."""
        return self._call("POST", "/subscriptions", json=body)

    def preview(self, query: dict, from_: float | str = "-1h", limit: int = 100) -> dict:
        """Run a query (``{"cel": ...}``, ``sase`` or ``air``) over the retained
        history from ``from_`` without registering it: its first ``limit``
        witnesses, their ``count``, the range and ``truncated``."""
        return self._call("POST", "/subscriptions/preview", json={**query, "from": from_, "limit": limit})

    def subscribe_many(self, queries: Iterable[dict | str]) -> list[dict]:
        """Register many subscriptions in one call, all or nothing: each item
        is CEL text or a dict like :meth:`subscribe`'s arguments (``cel``,
        ``air`` or ``sase``, optional ``name``). Returns them in order, each with its
        ``warnings`` (as :meth:`subscribe`); on errors raises
        :class:`CayugaAPIError` whose ``body["errors"]`` give each one's ``index``."""
        items = [{"cel": q} if isinstance(q, str) else {k: v for k, v in q.items() if v is not None} for q in queries]
        return self._call("POST", "/subscriptions/batch", json={"subscriptions": items})["subscriptions"]

    def validate(self, *, cel: str | None = None, air: str | None = None, sase: str | None = None) -> dict:
        body = {"cel": cel} if cel is not None else {"sase": sase} if sase is not None else {"air": air}
        return self._call("POST", "/subscriptions/validate", json=body)

    def subscriptions(self, offset: int = 0, limit: int | None = None) -> list[dict]:
        """Registered subscriptions in registration order (a page of them with
        ``offset``/``limit``)."""
        params = {"offset": offset} if limit is None else {"offset": offset, "limit": limit}
        return self._call("GET", "/subscriptions", params=params)

    def subscription(self, sid: str) -> dict:
        return self._call("GET", f"/subscriptions/{quote(sid, safe='')}")

    def unsubscribe(self, sid: str, cascade: bool = False) -> None:
        """Delete a subscription; with ``cascade`` also those reading its outputs
        (without it, deleting one that others read fails with 409)."""
        self._call("DELETE", f"/subscriptions/{quote(sid, safe='')}", params={"cascade": "true"} if cascade else None)

    def post_events(self, events: list[dict]) -> dict:
        return self._call("POST", "/events", json=events)

    def whoami(self) -> dict:
        """What this client's token may do: its name, scopes and reach (GET /whoami)."""
        return self._call("GET", "/whoami")

    def audit(self, limit: int = 100, **filters) -> dict:
        """The newest records of the server's audit log (GET /audit; an admin token): ``filters``
        are ``action``, ``token`` (a name), ``subscription``, ``address``."""
        return self._call("GET", "/audit", params={"limit": limit, **{k: v for k, v in filters.items() if v}})

    # -- WebSocket
    def ws_url(self, subscription: str | None = None, *, stream: str | None = None, batch: int = 1,
               seq: bool = False, from_: int | str | None = None) -> str:
        """The WebSocket URL of a subscription's (or a stream's) witnesses;
        ``batch`` > 1 asks for up to that many per message (JSON lines);
        ``seq`` for each line prefixed with its seq (``<seq> `` or, on a stream,
        ``<sid>:<seq> ``); ``from_`` to start at a seq (on a stream:
        ``"s1:5,s3:9"``), which implies ``seq``."""
        path = f"/ws/subscriptions/{subscription}" if subscription else f"/ws/streams/{stream}"
        u = urlparse(self.base_url)
        scheme = "wss" if u.scheme == "https" else "ws"
        params = [f"batch={batch}"] if batch > 1 else []
        if seq and from_ is None:
            params.append("seq=1")
        if from_ is not None:
            params.append(f"from={quote(str(from_), safe=':,')}")
        return f"{scheme}://{u.netloc}{path}" + ("?" + "&".join(params) if params else "")

    @contextmanager
    def frames(self, subscription: str | None = None, *, stream: str | None = None, batch: int = 1000,
               timeout: float | None = None, seq: bool = False,
               from_: int | str | None = None) -> Iterator[Iterator[str]]:
        """Iterate over the raw messages of a subscription (or stream): each is
        one witness, or with ``batch`` > 1 up to that many, one JSON object per
        line (with ``seq``/``from_``, each line prefixed as :meth:`ws_url` says).
        ``timeout`` bounds the wait for each message (TimeoutError)."""
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else None
        url = self.ws_url(subscription, stream=stream, batch=batch, seq=seq, from_=from_)
        with connect(url, additional_headers=headers, open_timeout=10, max_size=None, ssl=self._ws_ssl()) as ws:
            def messages() -> Iterator[str]:
                while True:
                    try:
                        msg = ws.recv(timeout=timeout)
                    except ConnectionClosed as exc:
                        if exc.rcvd is not None and exc.rcvd.code not in (1000, 1001, 1012):
                            raise CayugaAPIError(exc.rcvd.code, exc.rcvd.reason) from None
                        return
                    yield msg

            yield messages()

    @contextmanager
    def watch(self, subscription: str | None = None, *, stream: str | None = None,
              timeout: float | None = None, batch: int = 1000,
              on_notice: Callable[[dict], None] | None = None) -> Iterator[Iterator[dict]]:
        """Iterate over witnesses of a subscription (or any output stream), as
        dicts. ``timeout`` bounds the wait for each message (TimeoutError).
        Control messages (:func:`is_control`: e.g. the subscription lost state)
        are not witnesses: they go to ``on_notice``, if given."""
        with self.frames(subscription, stream=stream, batch=batch, timeout=timeout) as frames:
            def witnesses() -> Iterator[dict]:
                for msg in frames:
                    if is_control(msg):
                        if on_notice is not None:
                            on_notice(json.loads(msg))
                        continue
                    for line in msg.split("\n"):
                        yield json.loads(line)

            yield witnesses()

    def follow(self, subscription: str | None = None, *, stream: str | None = None,
               after: dict[str, int] | None = None, retry_for: float = 300.0, batch: int = 1000,
               timeout: float | None = None, on_retry: Callable[[str, float], None] | None = None,
               on_notice: Callable[[dict], None] | None = None) -> Iterator[tuple[str, int, str]]:
        """Every witness of a subscription (or stream) exactly once, across
        disconnects and server restarts: yields (subscription id, seq, witness
        JSON); see :meth:`follow_runs`, which it takes them from."""
        for sid, first, block, n in self.follow_runs(subscription, stream=stream, after=after,
                                                     retry_for=retry_for, batch=batch, timeout=timeout,
                                                     on_retry=on_retry, on_notice=on_notice):
            for i, line in enumerate(block.split("\n") if n > 1 else (block,)):
                yield sid, first + i, line

    def follow_runs(self, subscription: str | None = None, *, stream: str | None = None,
                    after: dict[str, int] | None = None, retry_for: float = 300.0, batch: int = 1000,
                    timeout: float | None = None, on_retry: Callable[[str, float], None] | None = None,
                    on_notice: Callable[[dict], None] | None = None) -> Iterator[tuple[str, int, str, int]]:
        """Every witness of a subscription (or stream) exactly once, across
        disconnects and server restarts: yields runs of witnesses,
        (subscription id, first seq, the witnesses' JSON lines joined by
        newlines, how many); :meth:`follow_frames` as text."""
        for sid, first, block, n in self.follow_frames(subscription, stream=stream, after=after,
                                                       retry_for=retry_for, batch=batch, timeout=timeout,
                                                       on_retry=on_retry, on_notice=on_notice):
            yield sid, first, block.decode(), n

    def follow_frames(self, subscription: str | None = None, *, stream: str | None = None,
                      after: dict[str, int] | None = None, retry_for: float = 300.0, batch: int = 1000,
                      timeout: float | None = None, on_retry: Callable[[str, float], None] | None = None,
                      on_notice: Callable[[dict], None] | None = None) -> Iterator[tuple[str, int, bytes, int]]:
        """Every witness of a subscription (or stream) exactly once, across
        disconnects and server restarts: yields runs of witnesses,
        (subscription id, first seq, the witnesses' JSON lines joined by
        newlines as UTF-8 bytes, how many), the seqs of a run consecutive (a
        subscription's message is one run: its frame's bytes are not decoded,
        and its seq prefixes are cut by their known widths, see
        :func:`strip_seqs`). ``after``: the last seq already had per subscription (resume
        there); without it, a subscription is followed from its newest witness
        on (``last_seq`` of GET /subscriptions/{id}), a stream from what comes
        once connected. On a disconnect it reconnects with ``from`` (backoff
        0.1 s doubling to 5 s), giving up after ``retry_for`` seconds without a
        connection; then, or on a close that a retry cannot mend (unknown
        subscription, no longer retained: :data:`FINAL_CLOSE_CODES`), it raises
        :class:`CayugaAPIError` (a close) or OSError. ``on_retry(reason, delay)``
        is told of each retry; ``on_notice(message)`` of each control message
        (:func:`is_control`, e.g. ``{"control": "inexact", ...}``: the subscription
        lost partial matches; ``{"control": "gap", ...}``: the server's witness log
        lacks witnesses ``from`` to ``to``, and a resume goes on after them), which
        is never yielded as a witness."""
        after = dict(after or {})
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else None
        down_since: float | None = None
        backoff = Backoff()
        while True:
            try:
                if subscription and subscription not in after:
                    after[subscription] = self.subscription(subscription).get("last_seq", 0)
                if subscription:
                    frm: str | None = str(after[subscription] + 1)
                else:
                    frm = ",".join(f"{s}:{n + 1}" for s, n in after.items()) or None
                url = self.ws_url(subscription, stream=stream, batch=batch, seq=True, from_=frm)
                with connect(url, additional_headers=headers, open_timeout=10, max_size=None,
                             ssl=self._ws_ssl()) as ws:
                    down_since = None
                    backoff.reset()
                    while True:
                        try:
                            msg = ws.recv(timeout=timeout, decode=False)
                        except TimeoutError:
                            raise _RecvTimeout from None
                        if msg[:1] == b"{" and is_control(msg):
                            notice = json.loads(msg)
                            if notice.get("control") == "gap" and isinstance(notice.get("to"), int):
                                gapped = subscription or notice.get("subscription")  # lost: resume after them
                                after[gapped] = max(after.get(gapped, 0), notice["to"])
                            if on_notice is not None:
                                on_notice(notice)
                            continue
                        if subscription:  # one run when the seqs are new and consecutive (they are)
                            known = after[subscription]
                            first = int(msg[:msg.find(b" ")])
                            n = msg.count(b"\n") + 1
                            tail = msg.rfind(b"\n") + 1
                            last = int(msg[tail:msg.find(b" ", tail)])
                            if first > known and last - first + 1 == n:
                                after[subscription] = last
                                yield subscription, first, strip_seqs(msg, first, last), n
                                continue
                        for line in msg.split(b"\n"):
                            head, _, body = line.partition(b" ")
                            if subscription:
                                sid, num = subscription, head
                            else:
                                sid, _, num = head.decode().rpartition(":")
                            seq = int(num)
                            if seq > after.get(sid, 0):  # never twice, whatever happens
                                after[sid] = seq
                                yield sid, seq, body, 1
            except _RecvTimeout:
                raise TimeoutError(f"no witness within {timeout} s") from None
            except ConnectionClosed as exc:
                rcvd = exc.rcvd
                if rcvd is not None and rcvd.code in FINAL_CLOSE_CODES:
                    raise WebSocketClosed(rcvd.code, rcvd.reason) from None
                reason = close_words(rcvd.code if rcvd else None, rcvd.reason if rcvd else "")
                failure: Exception = CayugaAPIError(rcvd.code if rcvd else 1006, reason)
            except CayugaAPIError as exc:  # the REST call for last_seq
                if exc.status < 500:
                    raise
                reason, failure = exc.detail, exc
            except InvalidStatus as exc:  # refused before it became a WebSocket (a cap reached: 503)
                failure = WebSocketRefused(exc.response.status_code, _handshake_body(exc.response.body))
                reason = f"the server refused the WebSocket: {failure.detail}"
            except (OSError, InvalidHandshake, httpx.TransportError) as exc:
                tls_problem = explain_tls(exc, self.base_url)
                if tls_problem is not None and "expired" not in tls_problem:  # retrying cannot mend a CA or a name
                    raise TlsSetupError(tls_problem) from None
                reason, failure = f"cannot reach the server at {self.base_url}: {tls_problem or exc}", exc
            now = time.monotonic()
            if down_since is None:
                down_since = now
            delay = backoff.next()
            if now - down_since + delay > retry_for:
                raise failure
            if on_retry is not None:
                on_retry(reason, delay)
            time.sleep(delay)

    def _ws_ssl(self) -> ssl.SSLContext | None:
        return self.ssl_context if self.tls else None

    # -- TCP
    def tcp_address(self) -> tuple[str, int]:
        port = self._tcp_port or self.health()["tcp_port"]
        return urlparse(self.base_url).hostname or "127.0.0.1", port

    @property
    def tcp_ssl_context(self) -> ssl.SSLContext | None:
        """The TLS context for the TCP port (the HTTP port's: the server has one certificate for both), or None."""
        return self.ssl_context if self.tls else None

    @contextmanager
    def sender(self, fmt: str = "jsonl") -> Iterator["TcpSender"]:
        s = TcpSender(*self.tcp_address(), fmt=fmt, token=self.token, ssl_context=self.tcp_ssl_context)
        try:
            yield s
        finally:
            s.close()


class TcpSender:
    """Streams events to the server's TCP port. A background thread collects
    the error lines the server sends back for rejected events, so a sender
    never stalls on them; :meth:`close` returns them all. With ``token`` the
    connection starts with ``#token <token>`` (servers with auth_tokens want
    it). ``header_lines`` is how many lines it sent before the first event
    (the server's error lines count them).

    With ``sender_id`` the connection says ``#sender <id>`` and reads the
    server's ``#resume N`` (:attr:`resume`: lines of this sender already
    journaled); with ``ack`` it asks for ``#ack n`` lines (:attr:`acked`, see
    :meth:`wait_acked`). Error line numbers then count the sender's data lines
    (:attr:`header_lines` is 0). :meth:`send_from` sends ``#from K`` (the first
    line sent is the sender's line K+1). A refusal of ``#sender`` raises
    :class:`SenderRefused` with the server's line.

    With ``ssl_context`` the connection speaks TLS (a server with
    tls_certfile), checking the server's certificate for ``server_hostname``
    (default: ``host``).

    ``timeout`` bounds the connection, the wait for ``#resume`` and each send
    (:meth:`set_timeout` changes it for the sends that follow); a send that
    runs out raises ``TimeoutError``, after which :meth:`abort` is the way out:
    it resets the connection, so the server never takes the part of a line it
    got for a whole line."""

    def __init__(self, host: str, port: int, fmt: str = "jsonl", timeout: float = 30.0,
                 token: str | None = None, sender_id: str | None = None, ack: bool = False,
                 ssl_context: ssl.SSLContext | None = None, server_hostname: str | None = None) -> None:
        sock = socket.create_connection((host, port), timeout=timeout)
        # lines go out as they are sent: Nagle's algorithm held small writes back
        # for the server's delayed ACK (tens of milliseconds at 10K events/s)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if ssl_context is not None:
            try:
                sock = ssl_context.wrap_socket(sock, server_hostname=server_hostname or host)
            except BaseException:
                sock.close()
                raise
        self.sock = sock
        self.timeout = timeout
        self.errors: list[str] = []
        self.sent = 0
        self.acked = 0
        self.resume = 0
        self.ended = False  # the server closed the connection (or it failed)
        self._cond = threading.Condition()
        header = ((f"#token {token}\n" if token else "") + (f"#format {fmt}\n" if fmt != "jsonl" else "")
                  + (f"#sender {sender_id}\n" if sender_id else "") + ("#ack\n" if ack else ""))
        self.header_lines = 0 if (sender_id or ack) else header.count("\n")
        buf = b""
        try:
            if header:
                try:
                    self.sock.sendall(header.encode())
                except ssl.SSLError as exc:  # the server ended the session: its alert says why, if it came
                    raise alert_of(self.sock, exc) from None
            if sender_id:  # wait for "#resume N" (an "error: ..." line if refused)
                while b"\n" not in buf:
                    chunk = self.sock.recv(65536)
                    if not chunk:
                        raise ConnectionError("the server closed the connection before answering #sender")
                    buf += chunk
                line, _, buf = buf.partition(b"\n")
                text = line.decode(errors="replace").strip()
                if not text.startswith("#resume "):
                    raise SenderRefused(text)
                self.resume = int(text.split()[1])
        except BaseException:
            self.sock.close()
            raise
        self._reader = threading.Thread(target=self._read_errors, args=(buf,), name="tcp-sender-errors",
                                        daemon=True)
        self._reader.start()

    def _read_errors(self, buf: bytes = b"") -> None:
        while True:
            *lines, buf = buf.split(b"\n")
            for line in lines:
                if line.startswith(b"#ack "):
                    with self._cond:
                        self.acked = max(self.acked, int(line[5:]))
                        self._cond.notify_all()
                elif line:
                    self.errors.append(line.decode(errors="replace"))
            try:
                chunk = self.sock.recv(65536)
            except socket.timeout:
                continue
            except ssl.SSLError as exc:  # e.g. the server wants a client certificate (TLS 1.3 says so only now)
                self.errors.append(f"error: TLS: {exc.reason or exc}")
                break
            except OSError:
                break
            if not chunk:
                break
            buf += chunk
        if buf.strip():
            self.errors.append(buf.decode(errors="replace"))
        with self._cond:
            self.ended = True
            self._cond.notify_all()

    def wait_acked(self, n: int, timeout: float) -> bool:
        """Wait until the server has acknowledged ``n`` lines (or the
        connection ended, or ``timeout`` s passed); whether it has."""
        with self._cond:
            self._cond.wait_for(lambda: self.acked >= n or self.ended, timeout)
            return self.acked >= n

    def wait_for_ack(self, n: int, timeout: float) -> int:
        """Wait until the server acknowledges more lines than it had (or ``n``
        in all, or the connection ends, or ``timeout`` s pass); returns the
        lines acknowledged."""
        with self._cond:
            before = self.acked
            self._cond.wait_for(lambda: self.acked > before or self.acked >= n or self.ended, timeout)
            return self.acked

    def set_timeout(self, seconds: float) -> None:
        """Let each send from now on wait at most ``seconds`` for the server to take it."""
        self.sock.settimeout(max(seconds, 0.001))

    def send_from(self, k: int) -> None:
        """Say that the next line sent is the sender's line ``k + 1`` (``#from k``)."""
        self.sock.sendall(f"#from {k}\n".encode())

    def send(self, event: dict | str) -> None:
        line = event if isinstance(event, str) else json.dumps(event)
        self.sock.sendall(line.rstrip("\n").encode() + b"\n")
        self.sent += 1

    def send_many(self, events: Iterable[dict | str]) -> None:
        for e in events:
            self.send(e)

    def send_lines(self, block: bytes, lines: int) -> None:
        """Send ``lines`` whole lines at once (``block`` ends with a newline)."""
        self.sock.sendall(block)
        self.sent += lines

    def close(self, timeout: float | None = None) -> list[str]:
        """Finish sending and wait until the server has read everything (it
        closes its side); returns the server's error lines."""
        try:  # the TCP half-close (on TLS too: the reader thread goes on reading the server's answers)
            socket.socket.shutdown(self.sock, socket.SHUT_WR)
        except OSError:
            pass
        self._reader.join(timeout if timeout is not None else self.timeout)
        self.sock.close()
        return self.errors

    def abort(self, timeout: float = 5.0) -> list[str]:
        """Drop the connection with a reset rather than an end of stream, so
        the part of a line that a timed-out send left is never taken for a
        whole line (at an orderly end the server decodes an unterminated last
        line, on a connection without ``#sender``, and with one before this
        was fixed). Returns the server's error lines."""
        try:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            socket.socket.shutdown(self.sock, socket.SHUT_RD)  # wakes the reader thread; sends nothing
        except OSError:
            pass
        self._reader.join(timeout)
        self.sock.close()
        return self.errors
