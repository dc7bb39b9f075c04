"""docs/protocol.md stays true to the receiver: every header word and every
reply the receiver (server/ingest/tcp.py, server/ingest/connection.py) and its limits
(server/ingest/limits.py) can send is described there, word for word apart from the values filled in; and
the doc's example session, replayed on a real server over a loopback socket,
gets the replies the doc shows."""

from __future__ import annotations

import ast
import re
import socket
from pathlib import Path

from clients.testing import wait_until
import server.ingest.connection as connection
import server.ingest.limits as limits
import server.ingest.tcp as tcp
from server.ingest.protocol import HEADERS
from tests.server.test_acks import Raw, tcp_port

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "protocol.md"

#: Functions of the receiver whose string argument becomes a line sent to the client.
SENDERS = {"_reject", "_protocol_error", "_refuse", "sendall"}


def _doc() -> str:
    return " ".join(DOC.read_text().split())


def _fragments(node: ast.AST) -> list[str]:
    """The literal parts of every string in ``node`` (an f-string's text
    between its fields, not what its fields compute), whitespace-normalised."""
    if isinstance(node, ast.JoinedStr):
        parts = [v.value for v in node.values if isinstance(v, ast.Constant)]
    elif isinstance(node, ast.Constant) and isinstance(node.value, str):
        parts = [node.value]
    elif isinstance(node, ast.FormattedValue):
        parts = []
    else:
        return [f for child in ast.iter_child_nodes(node) for f in _fragments(child)]
    return [" ".join(p.split()) for p in parts]


def _sent_fragments(module) -> set[str]:
    """Literal text of each reply ``module`` writes: string arguments of the
    calls that send a line, strings that are encoded (``f"...".encode()``),
    and the reasons :func:`limits.refusals` returns."""
    tree = ast.parse(Path(module.__file__).read_text())
    found: set[str] = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        if name in SENDERS:
            for arg in node.args:
                found.update(_fragments(arg))
        elif name == "encode" and isinstance(func, ast.Attribute):
            found.update(_fragments(func.value))
    return found


def _refusal_fragments() -> set[str]:
    tree = ast.parse(Path(limits.__file__).read_text())
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "refusals")
    reasons = [n.value for n in ast.walk(fn) if isinstance(n, ast.Assign) and isinstance(n.targets[0], ast.Subscript)]
    reasons += [n.args[1] for n in ast.walk(fn)
                if isinstance(n, ast.Call) and getattr(n.func, "attr", "") == "setdefault"]
    return {f for r in reasons for f in _fragments(r)}


def _meaningful(fragment: str) -> bool:
    """A fragment worth finding in the doc (not "-", ")" or "\\n")."""
    return len(fragment.strip(" \n;:()-")) >= 3


def test_every_header_line_is_described():
    doc = DOC.read_text()
    for word in (*[h.decode() for h in HEADERS], "#token"):
        assert f"### `{word} " in doc or f"### `{word}`" in doc, f"docs/protocol.md has no section for {word}"


def test_every_reply_the_receiver_sends_is_in_the_doc():
    doc = _doc()
    fragments = {f for f in _sent_fragments(tcp) | _sent_fragments(connection) | _refusal_fragments() if _meaningful(f)}
    # the probe must see the replies it is meant to check, or it checks nothing
    for known in ("#resume", "#ack", "error line", "too many connections; try again later", "is beyond the"):
        assert any(known in f for f in fragments), f"the probe no longer finds {known!r} in the receiver"
    missing = sorted(f for f in fragments if f.strip() not in doc)
    assert not missing, f"replies of server/ingest/tcp.py, connection.py or limits.py not in docs/protocol.md: {missing}"


def test_every_refusal_reason_and_limit_constant_is_in_the_doc():
    doc = _doc()
    for reason in tcp.REFUSALS:
        assert f'reason="{reason}"' in doc, reason
    assert f"{tcp.AUTH_SECONDS:g} s" in doc
    assert f"{tcp.POLL:g} s" in doc
    assert f"up to {tcp.FINAL_ACK_SECONDS:g} s" in doc
    assert f"up to {tcp.DISK_FULL_DRAIN_SECONDS:g} s" in doc
    assert f"up to {tcp.RECV_BYTES >> 10} KiB" in doc


def _session() -> list[tuple[str, str]]:
    """The doc's example session: (who, line) pairs, in order."""
    text = DOC.read_text().split("## A session", 1)[1]
    return [(m.group(1), m.group(2)) for m in re.finditer(r"^    (client|server): (.*)$", text, re.M)]


def test_the_example_session_is_what_a_server_answers(start_server):
    srv = start_server(auth_tokens=["s3cret"])
    session = _session()
    assert session, "docs/protocol.md has no example session"
    client = [line for who, line in session if who == "client" and not line.startswith("(")]
    server = [line for who, line in session if who == "server" and not line.startswith("(")]
    headers = [line for line in client if line.startswith("#")]
    data = [line for line in client if not line.startswith("#")]
    last_ack = int(server[-1].split()[1])
    assert server[-1].startswith("#ack ")

    c = Raw(tcp_port(srv))
    try:
        c.send("".join(line + "\n" for line in headers))
        assert c.line() == server[0]  # "#resume 0"
        c.send("".join(line + "\n" for line in data))
        got = c.until_ack(last_ack)
        c.sock.shutdown(socket.SHUT_WR)
        got += c.rest()
    finally:
        c.close()
    # acks may come per block (TCP splits the lines as it likes): the other lines exactly, the last ack last
    assert [x for x in got if not x.startswith("#ack ")] == [x for x in server[1:] if not x.startswith("#ack ")]
    acks = [int(x.split()[1]) for x in got if x.startswith("#ack ")]
    assert acks == sorted(acks) and acks[-1] == last_ack

    # "the same client reconnects with the same header lines, reads #resume 3"
    wait_until(lambda: srv.daemon.receiver.connections == 0, what="the first connection to end")
    c = Raw(tcp_port(srv))
    try:
        c.send("".join(line + "\n" for line in headers))
        assert c.line() == f"#resume {last_ack}"
        assert f"`#resume {last_ack}`" in DOC.read_text().split("## A session", 1)[1]
    finally:
        c.close()
