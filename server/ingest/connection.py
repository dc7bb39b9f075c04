"""One TCP connection's reader: its protocol, from the first byte to the last ``#ack``.

It reads header lines (``#token``, ``#format``, ``#sender``, ``#ack``,
``#from``), then decodes whatever whole lines one read brings as one block
(``Decoder.decode_batch``), applies the client limits, and queues the block
(:meth:`Intake.put`), blocking while the queue is full so that TCP flow control
slows the sender. Bad lines get an ``error line N:`` reply and the connection
goes on; with ``#sender``/``#ack`` the lines are numbered per sender across
connections and acknowledged once durable.

Everything it asks of the rest of the server goes through its
:class:`server.ingest.intake.Intake`; the listener that accepted it, its slot
and its thread are server/ingest/tcp.py's. The protocol a client implements is
docs/protocol.md (``tests/server/test_protocol_doc.py`` keeps it in step with
this module).
"""

from __future__ import annotations

import logging
import select
import socket
import ssl
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Callable

from air.formats import FORMATS, CsvDecoder
from server.durability.diskfull import DiskFull
from server.ingest.intake import Intake, Lines
from server.ingest.limits import refusals, without
from server.ingest.protocol import HEADERS, SENDER_ID
from server.observability.counters import TLS_HANDSHAKE_FAILED, TLS_PLAINTEXT, Count
from server.security import AuthRefused
from server.security.tls import LINGER_SECONDS, PlainText, accept_tls, close_gently, read_more, write_nowait

log = logging.getLogger("cayuga.receivers")

POLL = 0.25  # seconds between checks of the stop flag while blocked
#: Bytes read from a connection at once: the lines in them are decoded and
#: queued as one block.
RECV_BYTES = 1 << 18  # as much as `cayuga send` writes at once: fewer reads, journal records and GIL hand-offs per event
#: Seconds a client has to send its ``#token`` line when tokens are required.
AUTH_SECONDS = 10.0
#: Seconds the last acknowledgement waits for durability once a client has sent everything.
FINAL_ACK_SECONDS = 10.0
#: Seconds a connection refused for a full disk is still read (and discarded) before it is closed.
DISK_FULL_DRAIN_SECONDS = 2.0


def _ready(conn: socket.socket, events: int) -> bool:
    """Whether ``conn`` is readable (POLLIN) or writable (POLLOUT) now, without
    waiting. poll, not select: select cannot watch a descriptor numbered 1024
    or more, which a server whose descriptor limit was raised hands out. A TLS
    connection is readable too while its TLS layer holds decrypted bytes."""
    if events == select.POLLIN and isinstance(conn, ssl.SSLSocket) and conn.pending():
        return True
    p = select.poll()
    p.register(conn, events)
    return bool(p.poll(0))


def line_over(block: bytes, limit: int) -> bool:
    """Whether a line of ``block`` is longer than ``limit`` bytes: a window
    of ``limit + 1`` bytes without a newline, found by one ``rfind`` per
    window (a few for a 256 KiB block) instead of splitting the block into
    its lines. Each step starts at a line's start and goes past the last
    newline in the next ``limit + 1`` bytes: every line it passes fits."""
    pos, end = 0, len(block)
    while end - pos > limit:
        nl = block.rfind(b"\n", pos, pos + limit + 1)
        if nl < 0:
            return True
        pos = nl + 1
    return False


def value_bound(block: bytes, limit: int) -> int:
    """A bound on the bytes of any value in ``block``'s events, for
    :func:`server.ingest.limits.refusals`: no value is longer than the longest
    line, so a block whose lines are all at most ``limit`` bytes gives ``limit``
    (and is not scanned value by value); any other gives its own length."""
    return len(block) if len(block) <= limit or line_over(block, limit) else limit


@dataclass(frozen=True)
class Limits:
    """The settings a connection's reader keeps to (plain values: a reader in
    another process is given them as they are)."""

    max_line_bytes: int = 1 << 20
    max_value_bytes: int = 1 << 16
    idle_timeout: float = 300.0


class _Session:
    """One connection's protocol state (touched by its own thread only)."""

    __slots__ = ("sender", "ack", "resume", "base", "headers", "shift", "skip", "pending", "acked", "due",
                 "unsent", "numbered")

    def __init__(self) -> None:
        self.sender: str | None = None
        self.ack = False
        self.resume = 0  # N of #resume N
        self.base: int | None = None  # K of #from K
        self.headers = True  # still reading header lines
        self.numbered = False  # data lines numbered per sender (with #sender or #ack)
        self.shift = 0  # sender's line number = connection line number + shift
        self.skip = 0  # duplicate lines still to drop
        self.pending: deque[tuple[int, int]] = deque()  # (journal position, lines done) not yet acked
        self.acked = 0
        self.due: int | None = None  # an ack not yet written (the socket had no room)
        self.unsent = b""  # the rest of a line the socket took only part of


class Connection:
    """The reader of one accepted connection, run by its thread (:meth:`run`).
    ``tls``: the server's TLS settings (server/security/tls.py; None: plain
    text); ``stop``: set when the server stops (the reader ends at its next
    line); ``sock`` is the connection's socket, its TLS side once the handshake
    is done (what a stop shuts down under the reader's feet)."""

    def __init__(self, sock: socket.socket, address: str, intake: Intake, limits: Limits, *, tls=None,
                 stop: threading.Event) -> None:
        self.sock = sock
        self.address = address
        self.intake = intake
        self.limits = limits
        self.tls = tls
        self._stop = stop
        self._auth = intake.auth
        self._muted = False  # the client stopped reading its error lines
        self.st = _Session()

    def run(self) -> None:
        """Serve the connection until it ends (the caller closes it)."""
        try:
            if self.tls is not None:
                tls = self._start_tls(self.sock)
                if tls is None:
                    return
                self.sock = tls
            self._read_lines(self.sock, self.st, self.address)
        except OSError as exc:
            log.debug("connection %s ended: %s", self.address, exc)
        finally:
            if self.st.sender is not None:
                try:
                    self.intake.release(self.st.sender)
                except OSError:  # (a reader in another process whose server ended: it holds nothing now)
                    pass

    def _start_tls(self, conn: socket.socket) -> ssl.SSLSocket | None:
        """The connection's TLS side, its handshake done; None when it was
        refused (plain text: told so in plain text) or the handshake failed
        (counted, logged). The handshake has the time a ``#token`` line has."""
        deadline = time.monotonic() + min(self.limits.idle_timeout, AUTH_SECONDS)
        try:
            return accept_tls(conn, self.tls.context, deadline, self._stop)
        except PlainText:
            self.intake.count(TLS_PLAINTEXT["tcp"])
            log.info("TCP connection from %s refused: plain text on a TLS port", self.address)
            try:
                conn.settimeout(1.0)
                conn.sendall(b"error: this port takes TLS only (the server has tls_certfile set): connect with TLS, "
                             b"e.g. cayuga send --url https://HOST:HTTP_PORT --cacert CA.pem (TcpSender(..., "
                             b"ssl_context=...)); closing\n")
                close_gently(conn, LINGER_SECONDS)  # closed at once, what it sent unread, it would be reset first
            except OSError:
                pass
        except (ssl.SSLError, TimeoutError, OSError) as exc:
            self.intake.count(TLS_HANDSHAKE_FAILED["tcp"])
            log.info("TLS handshake with %s failed: %s", self.address, exc)
        return None

    def _blocks(self, conn: socket.socket, idle_work: Callable[[], bool] | None = None):
        """Yield ``(first_line_number, block)`` until EOF or stop: ``block`` is
        whole lines (bytes, newline-terminated but for a final line at EOF), or
        None for one line longer than ``max_line_bytes`` (skipped to its end).
        ``idle_work()`` (True when it has work) is run when nothing is there to
        read yet, before waiting for more (acknowledgements)."""
        buf = b""
        number = 1  # of the first line in buf
        skipping = False
        limit = self.limits.max_line_bytes
        idle = min(self.limits.idle_timeout, AUTH_SECONDS) if self._auth else self.limits.idle_timeout
        tls = isinstance(conn, ssl.SSLSocket)
        heard = time.monotonic()  # when the last complete line came (or the connection opened)
        while not self._stop.is_set():
            if idle_work is not None:
                idle_work()
            try:
                chunk = conn.recv(RECV_BYTES)
                if tls and chunk:  # one TLS record (16 KiB): take what else has come, as one block
                    chunk = read_more(conn, chunk, RECV_BYTES)
            except socket.timeout:
                if time.monotonic() - heard > idle:
                    self.intake.count(Count.TCP_REFUSED_IDLE)
                    log.info("closing idle TCP connection after %.0f s", idle)
                    conn.sendall(f"error: idle for {idle:g} s without a complete line "
                                 "(the idle_timeout setting); closing\n".encode())
                    return
                continue
            if not chunk:
                break
            if skipping:
                nl = chunk.find(b"\n")
                if nl < 0:
                    continue
                chunk, skipping = chunk[nl + 1:], False
                number += 1
            buf = buf + chunk if buf else chunk
            last = buf.rfind(b"\n")
            if last < 0:
                if len(buf) > limit:
                    yield number, None
                    buf, skipping = b"", True
                continue
            block, buf = buf[:last + 1], buf[last + 1:]
            if len(block) > limit and line_over(block, limit):  # rare: a line in it is too long
                yield from self._split_long(block, number)
            else:
                yield number, block
            heard = time.monotonic()
            idle = self.limits.idle_timeout  # the token line, if one was due, has come
            number += block.count(b"\n")
            if len(buf) > limit:
                yield number, None
                buf, skipping = b"", True
        if buf.strip() and not skipping and not self._stop.is_set():
            yield number, buf

    def _split_long(self, block: bytes, number: int):
        lines = block.split(b"\n")[:-1]
        start = 0
        for i, line in enumerate(lines):
            if len(line) > self.limits.max_line_bytes:
                if i > start:
                    yield number + start, b"\n".join(lines[start:i]) + b"\n"
                yield number + i, None
                start = i + 1
        if start < len(lines):
            yield number + start, b"\n".join(lines[start:]) + b"\n"

    def _read_lines(self, conn: socket.socket, st: _Session, address: str = "") -> None:
        decoder = self.intake.decoder("jsonl")
        authenticated = not self._auth
        header_lines = 0  # lines before the first data line

        def idle_work() -> None:
            if (st.pending or st.due is not None or st.unsent) and not _ready(conn, select.POLLIN):
                self._acknowledge(conn, st, wait=POLL)

        for number, block in self._blocks(conn, idle_work):
            if not authenticated:
                if not self._authenticate(conn, None if block is None else block.partition(b"\n")[0], number,
                                          address):
                    return
                authenticated = True
                block = block.partition(b"\n")[2]
                number += 1
                header_lines = 1
                if not block:
                    continue
            while st.headers and block and block.startswith(HEADERS):
                line, _, rest = block.partition(b"\n")
                word, _, arg = line.strip().partition(b" ")
                if word not in HEADERS:  # e.g. "#formats": a data line (refused by the decoder)
                    break
                text = arg.decode("utf-8", "replace").strip()
                if word == b"#format":
                    if text.lower() in FORMATS:
                        decoder = self.intake.decoder(text.lower())
                    else:
                        self._reject(conn, number, f"unknown format {text.lower()!r}; use one of {', '.join(FORMATS)}")
                elif not self._header(conn, st, word, text):
                    return
                block, number, header_lines = rest, number + 1, header_lines + 1
            if st.headers and (block is None or block):
                self._end_headers(st, header_lines)
            if block is not None and not block:
                continue
            first = number + st.shift
            if st.sender is not None and block is not None and not block.endswith(b"\n"):
                # the connection ended inside a line: the sender may have been cut off there (killed in
                # the middle of a write), so the part is not taken, nor counted: #resume asks for it whole
                log.info("sender %s: the connection ended inside line %d; that part is not taken", st.sender, first)
                break
            if block is None and st.skip:  # a duplicate
                st.skip -= 1
                self.intake.count(Count.DUPLICATES_DROPPED)
                continue
            if block is None:
                self._reject(conn, first, f"line longer than {self.limits.max_line_bytes} bytes")
                if not self._handled_or_refused(conn, st, first, first):
                    return
                continue
            lines = block.count(b"\n") + (not block.endswith(b"\n"))
            last = first + lines - 1
            if st.skip:
                block, first = self._drop_duplicates(st, block, first, decoder)
                if not block:
                    continue
            batch = decoder.decode_batch(block, first)
            for line, reason in batch.errors:
                self._reject(conn, line, reason)
            events = batch.events
            if not events:
                if not self._handled_or_refused(conn, st, last, first):
                    return
                continue
            index = None  # position in batch.events of each event queued, when some were refused
            size = value_bound(block, self.limits.max_value_bytes)
            refused = refusals(events, size, horizon=self.intake.horizon(), max_value=self.limits.max_value_bytes)
            if refused:
                for i, reason in sorted(refused.items()):
                    self._reject(conn, batch.line_of(i), reason)
                events, index = without(events, refused)
                if not events:
                    if not self._handled_or_refused(conn, st, last, first):
                        return
                    continue
            lines = None
            if st.sender is not None:
                # every line of the block an event (the usual case): event i is line first + i, without
                # Batch.line_of's pass over the block
                dense = index is None and len(events) == last - first + 1
                lines = Lines(st.sender, first, last, None if dense else
                              [batch.line_of(i) for i in (range(len(events)) if index is None else index)])
            try:
                late = self.intake.put(events, lines)
            except DiskFull as exc:
                j = exc.first_refused if index is None else index[exc.first_refused]
                self._disk_full(conn, st, exc, batch.line_of(j))
                return
            for i in late:
                j = i if index is None else index[i]
                self._reject(conn, batch.line_of(j), f"late: t1={events[i].t1} is older than events already "
                             "processed (see the time setting in the README)", counted=False)
            if st.ack:
                self._queued(conn, st, last)
        if st.ack and st.headers is False:
            self._acknowledge(conn, st, wait=FINAL_ACK_SECONDS)

    # ------------------------------------------------------------------ senders and acknowledgements

    def _header(self, conn: socket.socket, st: _Session, word: bytes, text: str) -> bool:
        """Apply a ``#sender``/``#ack``/``#from`` line; False when the
        connection is refused (told why and to be closed)."""
        if word == b"#ack":
            st.ack = st.numbered = True
            return True
        if word == b"#sender":
            if st.sender is not None:
                return self._protocol_error(conn, f"a second #sender line ({text!r}); one per connection")
            if not SENDER_ID.fullmatch(text):
                return self._protocol_error(conn, f"sender id {text!r} must be 1-128 characters of "
                                            "A-Z a-z 0-9 . _ : -")
            if not self.intake.claim(text):
                self.intake.count(Count.TCP_SENDER_TAKEN)
                return self._protocol_error(conn, f"sender {text} is already connected; the connection that "
                                            "holds it keeps it until it ends: retry later")
            st.sender, st.numbered = text, True
            st.resume = self.intake.progress(text)
            conn.sendall(f"#resume {st.resume}\n".encode())
            return True
        # #from K
        if st.sender is None:
            return self._protocol_error(conn, "#from needs a #sender line before it")
        try:
            k = int(text)
            if k < 0:
                raise ValueError
        except ValueError:
            return self._protocol_error(conn, f"#from {text!r}: K must be a whole number of lines >= 0")
        if k > st.resume:
            return self._protocol_error(conn, f"#from {k} is beyond the {st.resume} lines of sender {st.sender} "
                                        f"journaled so far (#resume {st.resume}): lines {st.resume + 1}-{k} "
                                        "would be missing; send from line " + str(st.resume + 1))
        st.base = k
        return True

    def _protocol_error(self, conn: socket.socket, message: str) -> bool:
        self.intake.count(Count.TCP_PROTOCOL_ERRORS)
        log.info("TCP connection refused: %s", message)
        try:
            conn.sendall(f"error: {message}; closing\n".encode())
        except OSError:
            pass
        return False

    def _end_headers(self, st: _Session, header_lines: int) -> None:
        """The first data line has come: number the lines from here."""
        st.headers = False
        if st.numbered:
            base = st.resume if st.base is None else st.base
            st.shift = base - header_lines
            st.skip = st.resume - base

    def _drop_duplicates(self, st: _Session, block: bytes, first: int, decoder) -> tuple[bytes, int]:
        """Drop the lines of ``block`` the sender had sent before (``#from``);
        a CSV decoder still learns its header from them."""
        cut, k = 0, 0
        while k < st.skip and cut < len(block):
            nl = block.find(b"\n", cut)
            line_end = len(block) if nl < 0 else nl + 1
            if isinstance(decoder, CsvDecoder) and decoder.header is None and block[cut:line_end].strip():
                decoder.decode_batch(block[cut:line_end], first + k)  # the header; errors are the old line's
            cut, k = line_end, k + 1
        st.skip -= k
        self.intake.count(Count.DUPLICATES_DROPPED, k)
        return block[cut:], first + k

    def _handled(self, conn: socket.socket, st: _Session, last: int) -> None:
        """Lines up to ``last`` are handled with nothing to queue (refused)."""
        if st.sender is not None:
            self.intake.record_progress(st.sender, last)
        if st.ack:
            self._queued(conn, st, last)

    def _handled_or_refused(self, conn: socket.socket, st: _Session, last: int, first: int) -> bool:
        """:meth:`_handled`; False when the journal could not take the
        sender's progress (the client was told, the connection is to close)."""
        try:
            self._handled(conn, st, last)
        except DiskFull as exc:
            self._disk_full(conn, st, exc, first)
            return False
        return True

    def _disk_full(self, conn: socket.socket, st: _Session, exc: DiskFull, line: int) -> None:
        """Tell the client that nothing from ``line`` on was accepted (the
        disk is full), let it see the line, and end the connection. A sender's
        line is where its #resume will continue (its journaled progress + 1)."""
        if st.sender is not None:
            line = self.intake.progress(st.sender) + 1
        self.intake.count(Count.DISK_FULL_REFUSALS_TCP)
        log.debug("TCP connection refused from line %d: %s", line, exc)  # the episode is logged by DiskState
        if st.ack:
            self._acknowledge(conn, st, wait=0.0)
        rest, st.unsent = st.unsent, b""
        try:
            conn.settimeout(1.0)
            conn.sendall(rest + f"error: {exc}; nothing from line {line} on was accepted; retry later\n".encode())
            conn.shutdown(socket.SHUT_WR)
            conn.settimeout(POLL)
            deadline = time.monotonic() + DISK_FULL_DRAIN_SECONDS
            while time.monotonic() < deadline and not self._stop.is_set():
                try:
                    if not conn.recv(RECV_BYTES):
                        break
                except socket.timeout:
                    continue
        except OSError:
            pass

    def _queued(self, conn: socket.socket, st: _Session, last: int) -> None:
        """Lines up to ``last`` are in the journal (or queued): acknowledge
        them once durable; now, what already is."""
        st.pending.append((self.intake.position(), last))
        self._acknowledge(conn, st, wait=0.0)

    def _acknowledge(self, conn: socket.socket, st: _Session, wait: float) -> None:
        """Send ``#ack n`` for what is durable (waiting up to ``wait`` s for the
        rest), without blocking on the socket."""
        intake = self.intake
        pending = st.pending
        if pending:
            if not intake.journaled:
                st.due = pending[-1][1]
                pending.clear()
            else:
                if wait and intake.durable() < pending[-1][0]:
                    intake.wait_durable(pending[-1][0], wait)
                durable = intake.durable()
                while pending and pending[0][0] <= durable:
                    st.due = pending.popleft()[1]
        if st.due is not None and st.due > st.acked and not st.unsent:
            st.unsent = f"#ack {st.due}\n".encode()
            st.acked = st.due
            st.due = None
        if st.unsent:
            # one write, not poll + send; TLS: one whole record or nothing, retried with the same bytes
            n = write_nowait(conn, st.unsent)
            st.unsent = st.unsent[n:]

    def _authenticate(self, conn: socket.socket, line: bytes | None, number: int, address: str) -> bool:
        """Whether the first line is ``#token <token>`` of a token with the
        ``ingest`` scope; if not, the client is told why (the connection is
        to close). A wrong token counts against the address
        (server/security/throttle.py); while it waits, the token is not
        looked at."""
        word, _, token = (line or b"").strip().partition(b" ")
        try:
            self.intake.authenticate(token.strip() if word == b"#token" else None, address)
            return True
        except AuthRefused as exc:
            self.intake.count(Count.TCP_REFUSED_AUTH)
            if exc.reason == "scope":
                reason = f"forbidden: {exc}; closing"
            elif exc.reason == "throttled":
                reason = f"{exc}; closing"
            else:
                reason = ("authentication required: the first line must be '#token <token>' with one of the "
                          "server's auth_tokens; closing")
            self._reject(conn, number, reason, counted=False)
            return False

    def _reject(self, conn: socket.socket, number: int, reason: str, counted: bool = True) -> None:
        if counted:
            self.intake.count(Count.REJECTED_TCP)
        log.info("rejected line %d: %s", number, reason)
        if self._muted:
            return
        st = self.st
        rest = b""
        if st.unsent:  # the rest of an ack line goes first
            rest, st.unsent = st.unsent, b""
        try:
            conn.sendall(rest + f"error line {number}: {reason}\n".encode())
        except OSError:  # the client does not read its error lines: stop sending them (each would wait POLL)
            self._muted = True
            self.intake.count(Count.TCP_ERROR_LINES_MUTED)
            log.info("a TCP client does not read its error lines; no more are sent on that connection")
