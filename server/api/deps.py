"""Shared dependencies of the API routes."""

from __future__ import annotations

import base64
import binascii
import hmac
from typing import Annotated

from fastapi import Depends, HTTPException, Request, WebSocket, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from server.daemon import Daemon


# Both are async so that FastAPI runs them on the event loop: a plain def would
# take a worker thread, and with every worker waiting (POST /events on a full
# queue) even /metrics and /health would wait for one.


async def get_daemon(request: Request) -> Daemon:
    return request.app.state.daemon


def token_ok(token: str | None, tokens) -> bool:
    """Whether ``token`` is one of ``tokens``, compared in constant time (no timing
    tells a client how much of a guess was right)."""
    if not token:
        return False
    given = token.encode()
    return any(hmac.compare_digest(given, t.encode()) for t in tokens)


#: The bearer scheme, as the OpenAPI document declares it (``securitySchemes``); it only
#: reads the header: :func:`require_token` decides, and answers 401 with what to do.
bearer = HTTPBearer(auto_error=False, scheme_name="bearerAuth",
                    description="One of the server's auth_tokens, sent as 'Authorization: Bearer <token>'. "
                                "Needed only when auth_tokens is set; /health, /livez and /readyz never need it")


async def require_token(request: Request,
                        credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]) -> None:
    """When auth tokens are configured, REST calls need ``Authorization: Bearer <token>``."""
    tokens = request.app.state.daemon.settings.auth_tokens
    if not tokens:
        return
    if credentials is None or not token_ok(credentials.credentials, tokens):
        raise HTTPException(status.HTTP_401_UNAUTHORIZED,
                            detail="missing or wrong token: send 'Authorization: Bearer <token>' "
                                   "with one of the tokens in the server's auth_tokens setting",
                            headers={"WWW-Authenticate": "Bearer"})


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


def ws_token_ok(ws: WebSocket) -> bool:
    """A WebSocket's token: ``Authorization: Bearer`` (clients), a ``cayuga.bearer.``
    subprotocol (browsers), or ``?token=`` (older clients; logs show it as ``***``)."""
    tokens = ws.app.state.daemon.settings.auth_tokens
    if not tokens:
        return True
    header = ws.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    return ((scheme.lower() == "bearer" and token_ok(token, tokens)) or token_ok(_subprotocol_token(ws), tokens)
            or token_ok(ws.query_params.get("token"), tokens))


DaemonDep = Annotated[Daemon, Depends(get_daemon)]
