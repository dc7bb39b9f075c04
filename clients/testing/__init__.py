"""Helpers for testing Cayuga queries and the code around them: servers on
free loopback ports, seeded Stock events, waiting on a condition, and
collecting witnesses.

- :mod:`clients.testing.servers`: :func:`running_server` (a server in this
  process), :class:`ServerProcess` (``cayuga serve`` as a child process, to
  kill and restart), :func:`cayuga_command` and :func:`cayuga_env` for other
  ``cayuga`` commands, :func:`free_ports`, :func:`stop_process` (SIGTERM, then
  SIGKILL after a timeout: every child process a test starts ends);
- :mod:`clients.testing.market`: the ``Stock`` stream (:data:`STOCK`), the
  README's first query (:data:`RISING`), one event
  as JSON (:func:`stock`), seeded generators (:func:`random_walk`,
  :func:`increasing_stream`, :func:`write_ticks`), ready-made automata and
  their CEL (:func:`increasing_cel`, :func:`write_queries`);
- :mod:`clients.testing.witnesses`: :func:`collect` (the first n witnesses of
  a watch), :func:`logged_witnesses` (numbered, from the witness log);
- :mod:`clients.testing.waiting`: :func:`wait_until` instead of a fixed sleep;
- :mod:`clients.testing.tls`: :func:`make_tls_files` (CAs and certificates made
  on the spot, for servers with TLS and mutual TLS).

A query tested end to end, in a dozen lines:

>>> import tempfile
>>> from clients.client import CayugaClient
>>> from clients.testing import collect, running_server, stock
>>> RISING = ("SELECT Name, Price_1 AS Before, Price AS After FROM Stock "
...           "NEXT{$1.Name = $2.Name AND $2.Price >= 1.05 * $1.Price} Stock PUBLISH Rising")
>>> with tempfile.TemporaryDirectory() as tmp, running_server(tmp) as srv, CayugaClient(srv.base_url) as client:
...     sub = client.subscribe(cel=RISING)
...     with client.watch(sub["id"], timeout=10) as matches:
...         _ = client.post_events([stock("IBM", 80.0, 100, 1), stock("IBM", 90.0, 100, 2)])
...         print(collect(matches, 1))
[{'stream': 'Rising', 't0': 1, 't1': 2, 'Name': 'IBM', 'Before': 80.0, 'After': 90.0}]

Names are imported on first use: ``from clients.testing import random_walk``
loads the generators only (what ``cayuga bench`` takes), not the HTTP and
WebSocket clients, and nothing here imports the server until a server is
started in this process.
"""

from __future__ import annotations

import importlib

#: Each public name and the submodule that defines it.
_SOURCES = {
    **dict.fromkeys(("UP", "ServerProcess", "cayuga_command", "cayuga_env", "free_port", "free_ports",
                     "running_server", "server_settings", "stop_process"), "servers"),
    **dict.fromkeys(("RISING", "STOCK", "increasing_cel", "increasing_query", "increasing_stream", "random_walk", "rise_query",
                     "runup_query", "stock", "symbols", "write_queries", "write_ticks"), "market"),
    **dict.fromkeys(("WaitTimeout", "wait_until"), "waiting"),
    **dict.fromkeys(("collect", "logged_witnesses"), "witnesses"),
    **dict.fromkeys(("TlsFiles", "make_tls_files"), "tls"),
}

__all__ = sorted(_SOURCES)


def __getattr__(name: str):
    module = _SOURCES.get(name)
    if module is None:
        raise AttributeError(f"module 'clients.testing' has no attribute {name!r}; it has {', '.join(__all__)}")
    value = getattr(importlib.import_module(f"clients.testing.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
