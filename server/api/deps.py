"""Shared dependencies of the API routes."""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import Depends, HTTPException, Request, WebSocket, status

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


async def require_token(request: Request) -> None:
    """When auth tokens are configured, REST calls need ``Authorization: Bearer <token>``."""
    tokens = request.app.state.daemon.settings.auth_tokens
    if not tokens:
        return
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token_ok(token, tokens):
        raise HTTPException(status.HTTP_401_UNAUTHORIZED,
                            detail="missing or wrong token: send 'Authorization: Bearer <token>' "
                                   "with one of the tokens in the server's auth_tokens setting",
                            headers={"WWW-Authenticate": "Bearer"})


def ws_token_ok(ws: WebSocket) -> bool:
    tokens = ws.app.state.daemon.settings.auth_tokens
    if not tokens:
        return True
    header = ws.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    return (scheme.lower() == "bearer" and token_ok(token, tokens)) or token_ok(ws.query_params.get("token"), tokens)


DaemonDep = Annotated[Daemon, Depends(get_daemon)]
