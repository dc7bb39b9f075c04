"""Shared dependencies of the API routes."""

from __future__ import annotations

import base64
import binascii
from typing import Annotated

from fastapi import Depends, Request, Security, WebSocket
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer, SecurityScopes
from starlette.requests import HTTPConnection

from server.daemon import Daemon
from server.security import Principal


# They are async so that FastAPI runs them on the event loop: a plain def would
# take a worker thread, and with every worker waiting (POST /events on a full
# queue) even /metrics and /health would wait for one.


async def get_daemon(request: Request) -> Daemon:
    return request.app.state.daemon


#: The bearer scheme, as the OpenAPI document declares it (``securitySchemes``); it only
#: reads the header: :func:`authorize` decides. Each operation's security requirement names
#: the scope it needs (``{"bearerAuth": ["watch"]}``; an empty list: any token of the server).
bearer = HTTPBearer(auto_error=False, scheme_name="bearerAuth",
                    description="One of the server's auth_tokens, sent as 'Authorization: Bearer <token>'. "
                                "Needed only when auth_tokens is set; /health, /livez and /readyz never need it. "
                                "Each operation names the scope its token needs (ingest, watch, manage, metrics; "
                                "admin has them all); a token without it gets 403 naming it")


def client_address(conn: HTTPConnection) -> str:
    return conn.client.host if conn.client is not None else "unknown"


def operation(conn: HTTPConnection) -> str:
    """``METHOD /route/{param}`` of a request (``WS /ws/...`` of a WebSocket), for messages and the audit log."""
    route = conn.scope.get("route")
    method = conn.scope.get("method", "WS")
    return f"{method} {getattr(route, 'path', None) or conn.url.path}"


async def authorize(security_scopes: SecurityScopes, request: Request,
                    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]) -> Principal:
    """Who sent the request, once it is known to have the scopes the operation
    declares; raises :class:`AuthRefused` (401, 403 or 429: server/app.py)."""
    sec = request.app.state.daemon.security
    address, what = client_address(request), operation(request)
    who = sec.authenticate(credentials.credentials if credentials is not None else None, address, "http", what)
    for scope in security_scopes.scopes:
        sec.authorize(who, scope, address, "http", what)
    return who


def needs(scope: str | None):
    """The dependency of an operation that needs ``scope`` (None: any token the
    server knows); it gives the :class:`Principal` and declares the scope in the
    OpenAPI document."""
    return Security(authorize, scopes=[scope] if scope else [])


#: What a scoped operation may answer besides its own: no or a wrong token, a scope or reach it lacks,
#: an address that sent too many wrong tokens.
AUTH_ERRORS = (401, 403, 429)

Ingest = Annotated[Principal, needs("ingest")]
Watch = Annotated[Principal, needs("watch")]
Manage = Annotated[Principal, needs("manage")]


def require_reach(conn: HTTPConnection, who: Principal, sub) -> None:
    """Raise :class:`AuthRefused` (403) unless ``who`` reaches subscription ``sub``."""
    sec = conn.app.state.daemon.security
    if not sec.reaches(who, sub):
        sec.refuse(who, client_address(conn), "http", operation(conn), None,
                   f"token {who.name} reaches only {who.reach_text()}, not subscription {sub.id}; use a token "
                   "that reaches it (admin reaches every one)")


#: The WebSocket subprotocol the server picks when a client offers it (the console does).
WS_SUBPROTOCOL = "cayuga"
#: A subprotocol carrying the token, base64url-encoded: how a browser, which cannot send
#: an Authorization header on a WebSocket, authenticates without putting the token in the URL.
WS_BEARER_PREFIX = "cayuga.bearer."


def ws_subprotocol(ws: WebSocket) -> str | None:
    """The subprotocol to accept ``ws`` with: ``cayuga`` when it is offered, else none."""
    return WS_SUBPROTOCOL if WS_SUBPROTOCOL in ws.scope.get("subprotocols", ()) else None


def _subprotocol_token(ws: WebSocket) -> str | None:
    for offered in ws.scope.get("subprotocols", ()):
        if offered.startswith(WS_BEARER_PREFIX):
            encoded = offered[len(WS_BEARER_PREFIX):]
            try:
                return base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4)).decode()
            except (binascii.Error, UnicodeDecodeError):
                return None
    return None


def ws_principal(ws: WebSocket, scope: str) -> Principal:
    """Who opened a WebSocket, once it is known to have ``scope``: its token from
    ``Authorization: Bearer`` (clients), a ``cayuga.bearer.`` subprotocol
    (browsers), or ``?token=`` (older clients; logs show it as ``***``).
    Raises :class:`AuthRefused`."""
    sec = ws.app.state.daemon.security
    header = ws.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    given = (token.strip() if scheme.lower() == "bearer" else None) or _subprotocol_token(ws) \
        or ws.query_params.get("token")
    address, what = client_address(ws), operation(ws)
    who = sec.authenticate(given, address, "http", what)
    sec.authorize(who, scope, address, "http", what)
    return who


DaemonDep = Annotated[Daemon, Depends(get_daemon)]
