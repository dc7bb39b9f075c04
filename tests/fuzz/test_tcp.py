"""The TCP receiver over a real socket, fed random lines in random chunks.
What it proves, for every exchange: each good event line gets in (the
server's count of events received over TCP grows by exactly their number),
each other non-blank line is answered with exactly one ``error line N`` for
its own number (in order, nothing else is sent), blank lines are skipped, the
connection survives to a last sentinel line, and the server stays healthy."""

from __future__ import annotations

import json
import socket

import pytest
from hypothesis import given
from hypothesis import strategies as st

from clients.testing import wait_until
from tests.fuzz.conftest import FUZZ_NET, healthy

SENTINEL = b'{"stream": "Sentinel", "t1": 1}'
GOOD = json.dumps({"stream": "Stock", "t1": 1, "Name": "IBM", "Price": 1.5, "Volume": 3}).encode()

line = st.one_of(st.just(GOOD), st.just(b'{"stream": "Stock", "Price": NaN}'), st.just(b"[" * 5000),
                 st.binary(max_size=200).map(lambda b: b.replace(b"\n", b"")),
                 st.sampled_from([b"", b"   ", b"\r", b"#format csv", b"\xff\xfe", b"{}", b"[]", b"null",
                                  b'{"stream": "Stock", "t1": 1e400}', b'{"t1": 99999999999999999999999}']))


@pytest.fixture(scope="module")
def server(fuzz_server):
    return fuzz_server(max_line_bytes=4096, max_connections_per_address=64)


def _exchange(port: int, data: bytes, chunk: int) -> list[str]:
    with socket.create_connection(("127.0.0.1", port), timeout=20) as s:
        for i in range(0, len(data), chunk):
            s.sendall(data[i:i + chunk])
        s.shutdown(socket.SHUT_WR)
        out = b""
        while piece := s.recv(65536):
            out += piece
    return out.decode().splitlines()


@FUZZ_NET
@given(st.lists(line, max_size=40), st.integers(1, 300), st.binary(max_size=5000).map(lambda b: b.replace(b"\n", b"")))
def test_random_lines_in_random_chunks(server, lines, chunk, long_tail):
    body = [b"{}"] + lines + [long_tail * 2, SENTINEL]  # {}: no #format on the first line; long_tail may be over 4 KB
    good = sum(1 for x in body if x == GOOD)
    counters = server.daemon.counters
    before = counters.get("received_tcp")
    answers = _exchange(server.tcp_port, b"\n".join(body) + b"\n", chunk)
    assert all(a.startswith("error line ") for a in answers), answers
    numbers = [int(a.split(":")[0].removeprefix("error line ")) for a in answers]
    # JSON lines: a line of whitespace only is blank (skipped), every other line not GOOD is refused
    assert numbers == [n for n, x in enumerate(body, 1) if x != GOOD and x.rstrip(b"\r").strip()], answers
    assert answers[-1] == f"error line {len(body)}: unknown stream 'Sentinel'; declare it first"
    wait_until(lambda: counters.get("received_tcp") >= before + good, what=f"{good} good events received")
    assert counters.get("received_tcp") == before + good
    healthy(server.base_url)
