"""``cayuga send``: an event file to a running server's TCP port, every line
delivered once: a sender id and acknowledgements (#sender, #ack), resuming
where the server's journal stands after a reconnection, every wait bounded by
``--retry-for``. Registered on the ``cayuga`` group by clients/cli.py."""

from __future__ import annotations

import re
import sys
import threading
import time
from pathlib import Path

import click

from clients.options import make_client, tls_options, url_option
from clients.words import plural, unreachable


def _fail(message: str, code: int = 2) -> None:
    click.echo(f"cayuga: {message}", err=True)
    sys.exit(code)


#: Unacknowledged bytes ``cayuga send`` lets out before it waits for acknowledgements.
SEND_WINDOW = 32 << 20
#: Seconds one connection may go without an acknowledgement (or an answer to
#: ``#sender``) before ``cayuga send`` drops it and reconnects (a dead network path).
ACK_STALL_SECONDS = 60.0
#: The least time ``cayuga send`` gives a server it is connected to for an
#: answer or an acknowledgement, however small ``--retry-for`` is.
MIN_PATIENCE = 5.0


def _default_sender_id(path: str, data: bytes) -> str:
    """``send-<hash>``: the same file (absolute path and content) gets the
    same id; the content counts, so a file rewritten in place, or another
    stream on standard input, is a new sender rather than one the server has
    "already" had."""
    import hashlib

    where = "-" if path == "-" else str(Path(path).resolve())
    content = hashlib.blake2b(data, digest_size=16).hexdigest()
    return "send-" + hashlib.sha256(f"{where}\0{len(data)}\0{content}".encode()).hexdigest()[:24]


class _Hashing(threading.Thread):
    """:func:`_default_sender_id` on a thread of its own; :meth:`result` waits for it."""

    def __init__(self, path: str, data: bytes) -> None:
        super().__init__(name="cayuga-send-hash", daemon=True)
        self._args, self._id = (path, data), None
        self.start()

    def run(self) -> None:
        self._id = _default_sender_id(*self._args)

    def result(self) -> str:
        self.join()
        return self._id


class _Lost(Exception):
    """The connection was lost, refused, or made no progress: reconnect and
    resume, while ``--retry-for`` allows."""


class _Stalled(_Lost):
    """The server took no line while this connection waited ``seconds``: cayuga
    send's own finding, not the server's word."""

    def __init__(self, message: str, seconds: float) -> None:
        super().__init__(message)
        self.seconds = seconds


class _Progress:
    """How far ``cayuga send`` has got: the lines the server has acknowledged
    (or said it had, ``#resume``), the furthest line sent, and since when no
    line was acknowledged. It bounds every wait: a wait on a connected server
    ends once nothing has moved for ``--retry-for`` seconds (MIN_PATIENCE at
    least) or one connection has had no acknowledgement for
    ACK_STALL_SECONDS; a failure gives up once nothing has moved for
    ``--retry-for`` seconds. Reconnecting is not progress: a server that
    takes the connection and then refuses or ignores every line ends it too."""

    def __init__(self, retry_for: float) -> None:
        self.retry_for = retry_for
        self.acked = 0
        self.sent = 0
        self.since = self.attempt_at = time.monotonic()

    def acknowledged(self, n: int) -> bool:
        """Note the server's count; whether it is progress."""
        if n <= self.acked:
            return False
        self.acked, self.since = n, time.monotonic()
        return True

    def sending(self, upto: int) -> None:
        if self.acked >= self.sent:  # nothing was outstanding: the time since was --rate's pacing, not the server's
            self.since = time.monotonic()
        self.sent = max(self.sent, upto)

    def attempt(self) -> None:
        """A new connection is being made."""
        self.attempt_at = time.monotonic()

    def idle(self) -> float:
        """Seconds without progress (or, on this connection, without an acknowledgement)."""
        return time.monotonic() - max(self.since, self.attempt_at)

    def exhausted(self) -> bool:
        return time.monotonic() - self.since >= self.retry_for

    def patience(self) -> float:
        """Seconds the next wait on the server may last (<= 0: none)."""
        now = time.monotonic()
        return min(self.since + max(self.retry_for, MIN_PATIENCE),
                   max(self.since, self.attempt_at) + ACK_STALL_SECONDS) - now


#: A refusal no retry can mend: a wrong token, one without the ingest scope, a bad ``#from``, a malformed ``#sender``,
#: plain text to a TLS port.
_FINAL = re.compile(r"error(?: line \d+)?: (?:authentication required|forbidden|#from |a second #sender|sender id "
                    r"|this port takes TLS)")
#: Another connection holds the sender id.
_TAKEN = re.compile(r"error: sender \S+ is already connected")
#: The server cannot journal: its disk is full (retry; it answers again once there is room).
_DISK_FULL = "error: disk full"


def _explain(problem: str, sender_id: str) -> tuple[str, str]:
    """(what went wrong, what to do about it: '' when the words say it)."""
    if _TAKEN.match(problem):
        return (f"another connection with sender id {sender_id} is still open (the server refuses a second one)",
                "wait until it ends (is another cayuga send of this file running?) and run this again, "
                "or give --sender-id another id to send the file as a new sender")
    if problem.startswith(_DISK_FULL):
        return (f"the server's disk is full: {problem[len(_DISK_FULL):].lstrip(': ')}",
                "free space on the server and run this again (it resumes)")
    return problem, ""


@click.command()
@click.argument("events_path", metavar="FILE", type=click.Path(exists=True, dir_okay=False, allow_dash=True))
@url_option
@click.option("--port", "tcp_port", type=int, default=None,
              help="The server's TCP event port (default: asked from the server's /health).")
@click.option("--format", "fmt", type=click.Choice(["jsonl", "cayuga", "csv"]), default="jsonl", show_default=True,
              help="Format of FILE: JSON lines, the original Cayuga lines, or CSV with a header line.")
@click.option("--rate", type=float, default=None, help="Events per second (default: as fast as possible).")
@click.option("--token", envvar="CAYUGA_TOKEN", default=None,
              help="API token (or CAYUGA_TOKEN); sent as the connection's first line '#token <token>'.")
@click.option("--sender-id", default=None,
              help="The id the server tracks this file's progress by (#sender); default: derived from "
                   "the file's absolute path and content, so sending the same file again resumes it (or, "
                   "when the server has it all, sends nothing), and a changed file is sent as new.")
@tls_options
@click.option("--retry-for", type=click.FloatRange(0), default=60.0, show_default=True,
              help="Seconds to keep trying while no line gets acknowledged: reconnecting with exponential "
                   "backoff (0.1 s doubling to 5 s, each wait drawn between half and all of it) when the "
                   "connection is lost or refused (the server restarts, another connection holds the sender "
                   "id, its disk is full), and waiting for a "
                   f"server that takes no line (a connected server gets at least {MIN_PATIENCE:g} s). Each "
                   "reconnection resumes where the server's journal stands. Then exit 1 with the reason.")
def send(events_path, url, tcp_port, fmt, rate, token, sender_id, cacert, cert, key, retry_for) -> None:
    """Send an event file to a running server's TCP port, with a progress bar.

    Every line is delivered exactly once: the connection names a sender
    (#sender) and asks for acknowledgements (#ack); the server answers with
    the lines of that sender it already has (#resume N) and cayuga send goes
    on from line N+1 (nothing at all when it has every line). When the
    connection is lost (the server restarts, the network fails), it
    reconnects and resumes, for as long as --retry-for allows without
    progress. Every wait is bounded by --retry-for: it never hangs.

    Exit status 0 when every line is acknowledged and none was rejected; 1
    when some was (each reported with its file line number), when the server
    refused for good (a wrong token), when the server has more lines of this
    sender id than the file, or when --retry-for ran out (the server
    unreachable, another connection holding the sender id, a full disk, a
    server that takes no line); 130 when interrupted."""
    with click.open_file(events_path, "rb") as fh:
        data = fh.read()
    hashing = None
    if not sender_id:  # the file's hash (0.1 s for 100 MB; hashlib lets go of the GIL) while the rest starts
        hashing = _Hashing(events_path, data)
    from tqdm import tqdm

    from clients.client import Backoff, SenderRefused, TcpSender, explain_tls
    from server.ingest.protocol import SENDER_ID

    total = data.count(b"\n") + (1 if data and not data.endswith(b"\n") else 0)
    sender_id = sender_id or hashing.result()
    if not SENDER_ID.fullmatch(sender_id):
        _fail(f"--sender-id {sender_id!r}: 1-128 characters of A-Z a-z 0-9 . _ : -")
    if total == 0:
        click.echo(f"cayuga: nothing to send: {events_path} is empty", err=True)
        return
    client = make_client(url, token=token, tcp_port=tcp_port, cacert=cacert, cert=cert, key=key)
    errors: dict[int, str] = {}  # by file line: a line resent after a reconnection may be reported twice
    other: list[str] = []
    progress = _Progress(retry_for)
    had = None  # lines the server had when this run began (#resume of its first connection)
    backoff = Backoff()
    failing = False  # a failure since the last progress (told once, with the retry)
    said = ""  # the server's last refusal since the last progress ("error: disk full: ...")
    start = time.monotonic()
    address = None
    bar = tqdm(total=total, unit="ev", unit_scale=True, disable=None)

    def say(message: str) -> None:
        tqdm.write(f"cayuga: {message}", file=sys.stderr)

    def stop(message: str, code: int) -> None:
        bar.close()
        click.echo(f"cayuga: {message}", err=True)
        sys.exit(code)

    try:
        while True:
            sender = None
            try:
                progress.attempt()
                try:
                    if address is None:
                        client.http.timeout = max(min(progress.patience(), 30.0), 0.1)
                        address = client.tcp_address()
                    sender = TcpSender(*address, fmt=fmt, token=token, sender_id=sender_id, ack=True,
                                       timeout=max(progress.patience(), 0.1), ssl_context=client.tcp_ssl_context)
                except SenderRefused as exc:
                    raise _Lost(exc.answer) from None
                except Exception as exc:  # noqa: BLE001 - refused, reset, timed out, an HTTP error: all mean retry
                    tls_problem = explain_tls(exc, url) or (str(exc) if "speaks HTTPS only" in str(exc) else None)
                    if tls_problem is not None and "expired" not in tls_problem:  # no retry mends a CA or a name
                        stop(f"{tls_problem}; {progress.acked} of {plural(total, 'line')} acknowledged", 1)
                    raise _Lost(tls_problem and f"cannot reach the server at {url}: {tls_problem}"
                                or unreachable(url, exc)) from None
                resume = sender.resume
                if resume > total:
                    sender.abort()
                    stop(f"the server already has {plural(resume, 'line')} from sender id {sender_id}, more than the "
                         f"{plural(total, 'line')} of {events_path}: that id was used to send another file (or this one "
                         "before it was changed); give --sender-id an id of its own for this file", 1)
                if had is None:
                    had = resume
                    if 0 < resume < total:
                        say(f"the server already has lines 1-{resume} of {events_path} (sender id {sender_id}); "
                            f"sending lines {resume + 1}-{total}")
                elif failing:
                    say(f"reconnected; the server has {resume} of {plural(total, 'line')}, going on from line {resume + 1}"
                        if resume < total else f"reconnected; the server has all {plural(total, 'line')}")
                if progress.acknowledged(resume):
                    failing, said = False, ""
                    backoff.reset()
                if resume == total:  # nothing to send: no line would bring an #ack
                    sender.close(timeout=1.0)
                    if progress.sent == 0:
                        stop(f"nothing new to send: the server already has all {plural(total, 'line')} of {events_path} "
                             f"(sender id {sender_id})", 0)
                    break
                first = resume
                if fmt == "csv" and resume:  # the header line must come again: resend, the server drops what it has
                    first = 0
                    sender.send_from(0)
                _send_acked(sender, data, first, total, rate, start, bar, progress)
                _await_acks(sender, total, progress)
                _collect(sender.close(timeout=max(progress.patience(), 1.0)), errors, other)
                break
            except (_Lost, OSError) as exc:
                if sender is not None:
                    _collect(sender.abort(), errors, other)
                    if progress.acknowledged(sender.acked):
                        failing, said = False, ""
                        backoff.reset()
                problem = ((_last_error(sender) if sender is not None else "")
                           or (str(exc) if isinstance(exc, _Lost) else f"the connection was lost: {exc}"))
                if problem.startswith("error"):  # the server's own words
                    said = problem
                elif isinstance(exc, _Stalled) and exc.seconds < MIN_PATIENCE and said:
                    # the time ran out on a connection made just before: that is no finding about the
                    # server; its last reply since the last progress is why nothing got through
                    problem = said
                if _FINAL.match(problem) and not _TAKEN.match(problem):
                    stop(f"{problem}; {progress.acked} of {plural(total, 'line')} acknowledged", 1)
                what, todo = _explain(problem, sender_id)
                gave_up = (f"gave up after {retry_for:g} s of retries: {what}" + (f": {todo}" if todo else "")
                           + f"; {progress.acked} of {plural(total, 'line')} acknowledged")
                if progress.exhausted():
                    stop(gave_up, 1)
                if not failing:
                    failing = True
                    say(f"{what}; retrying for up to {retry_for:g} s (--retry-for)")
                time.sleep(min(backoff.next(), max(retry_for - (time.monotonic() - progress.since), 0)))
                if progress.exhausted():  # no time left for another connection: this is why
                    stop(gave_up, 1)
                address = address if tcp_port else None  # the server may come back on another port
    except KeyboardInterrupt:
        stop(f"interrupted; {progress.acked} of {plural(total, 'line')} acknowledged", 130)
    finally:
        client.close()
    bar.close()
    for line in sorted(errors):
        click.echo(f"{events_path}: {errors[line]}", err=True)
    for e in other:
        click.echo(f"{events_path}: {e}", err=True)
    click.echo(f"cayuga: sent {plural(total - had, 'line')}, {len(errors)} rejected, {progress.acked} acknowledged", err=True)
    sys.exit(1 if errors else 0)


def _send_acked(sender, data: bytes, first: int, total: int, rate, start: float, bar, progress: _Progress) -> int:
    """Send ``data`` from its line ``first + 1`` on, keeping at most
    SEND_WINDOW bytes unacknowledged; returns the line reached (``total``).
    Raises :class:`_Lost` when the server stops acknowledging or reading
    for longer than ``progress`` allows."""
    from collections import deque

    pos = _offset_of_line(data, first)
    line = first
    marks: deque[tuple[int, int]] = deque()  # (line reached, byte offset) at the end of each block not acked
    acked_pos = pos
    bar.n = first
    bar.refresh()
    for block, n in _send_blocks(data, rate, pos):
        if rate:
            delay = start + (line + n) / rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
        while True:
            while marks and marks[0][0] <= sender.acked:
                acked_pos = marks.popleft()[1]
            if not marks or pos - acked_pos <= SEND_WINDOW:
                break
            _await_acks(sender, marks[0][0], progress)
        if sender.ended:  # the server closed the connection (its disk is full, it is stopping): send no more
            raise _Lost(_last_error(sender) or "the server closed the connection")
        progress.sending(line + n)
        sender.set_timeout(progress.patience())
        try:
            sender.send_lines(block, n)
        except TimeoutError:  # the server stopped reading: TCP flow control holds the rest
            raise _stalled(progress) from None
        progress.acknowledged(sender.acked)
        pos += len(block)
        line += n
        marks.append((line, pos))
        bar.update(n)
    return line


def _await_acks(sender, n: int, progress: _Progress) -> None:
    """Wait until the server has acknowledged ``n`` lines, as long as
    ``progress`` allows; :class:`_Lost` if it does not."""
    while sender.acked < n and not sender.ended:
        left = progress.patience()
        if left <= 0:
            raise _stalled(progress)
        progress.acknowledged(sender.wait_for_ack(n, left))
    if sender.acked < n:
        raise _Lost(_last_error(sender) or "the server closed the connection before acknowledging every line")


def _stalled(progress: _Progress) -> _Stalled:
    idle = progress.idle()
    return _Stalled(f"the server has taken no line for {idle:.0f} s (overloaded, shutting down, "
                    "or its journal stuck?)", idle)


def _offset_of_line(data: bytes, k: int) -> int:
    """Byte offset of line ``k + 1`` (after ``k`` lines)."""
    pos = 0
    for _ in range(k):
        nl = data.find(b"\n", pos)
        if nl < 0:
            return len(data)
        pos = nl + 1
    return pos


def _last_error(sender) -> str:
    """The last ``error: ...`` line the server sent before it closed the connection, if any."""
    said = [e for e in sender.errors if e.startswith("error:")]
    return said[-1] if said else ""


def _collect(lines: list[str], errors: dict[int, str], other: list[str]) -> None:
    for e in lines:
        m = re.match(r"error line (\d+):", e)
        if m:
            errors[int(m.group(1))] = e
        elif e not in other and not e.startswith("error:"):
            other.append(e)
    lines.clear()


def _send_blocks(data: bytes, rate: float | None, pos: int = 0, size: int = 1 << 18):
    """``(block, lines)`` pieces of ``data`` from byte ``pos`` on that end at line ends: about
    ``size`` bytes each, or about a hundredth of a second's worth at ``rate``. Views of ``data``,
    not copies (the file was copied twice on its way: the rest after ``pos``, then each block); the
    last line, where it has no newline, is sent with one. (Each block's lines are still counted
    here, a second pass over the file after the count of them all.)"""
    per = max(int(rate / 100), 1) if rate else None
    view = memoryview(data)
    while pos < len(data):
        if per is None:
            end = data.find(b"\n", min(pos + size, len(data)) - 1)
        else:
            end = pos - 1
            for _ in range(per):
                end = data.find(b"\n", end + 1)
                if end < 0:
                    break
        end = len(data) if end < 0 else end + 1
        lines = data.count(b"\n", pos, end)
        if data[end - 1:end] == b"\n":
            yield view[pos:end], lines
        else:
            yield data[pos:end] + b"\n", lines + 1
        pos = end
