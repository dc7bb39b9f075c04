"""The FastAPI application: wiring and lifespan only."""

from __future__ import annotations

import threading
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.gzip import GZipMiddleware
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException as StarletteHTTPException

from server.api.bodies import with_bodies
from server.api.bodylimit import BodyLimit
from server.api import automaton, console, events, security, stats, streams, subscriptions, system, ws
from server.config import Settings
from server.daemon import Daemon, LimitReached, ServerStarting
from server.durability.diskfull import DiskFull
from server.observability.counters import Count
from server.security import AuthRefused
from server.version import version


#: Responses at least this large are gzip-compressed for a client that accepts it (the
#: Swagger UI's 1.7 MB bundle goes out as about 0.5 MB); small API answers are sent as they are.
GZIP_MIN_BYTES = 4096


DESCRIPTION = (
    "Complex event processing: register CEL or AIR subscriptions, send events, receive matches over "
    "WebSockets (`/ws/subscriptions/{id}`, `/ws/streams/{name}`: see the README).\n\n"
    "Every error answer is JSON with a `detail` saying what went wrong and what to do (the `ErrorOut` schema). "
    "When the server has `auth_tokens`, every operation but /health, /livez and /readyz needs "
    "`Authorization: Bearer <token>`, and a token with the scope the operation names (its security requirement, "
    "and **Scope** in its description: ingest, watch, manage, metrics or admin; admin has them all): without a "
    "token, or with a wrong one, 401; with a token that lacks the scope (or does not reach the subscription), "
    "403 naming it (`missing_scope`); from an address that sent too many wrong tokens, 429 with Retry-After. "
    "Below the operations, any request may also get 408 (its headers or body did not arrive in time) or 503 "
    "(the server holds max_http_connections connections), with the same body.")


def operation_id(route: APIRoute) -> str:
    """An operation's id in the OpenAPI document: its function's name (``create_subscription``), stable
    for client generators."""
    return route.name


#: The answer to each reason a token is refused (server/security: AuthRefused).
_REFUSED = {"missing": 401, "wrong": 401, "scope": 403, "throttled": 429}
UNAUTHENTICATED = ("missing or wrong token: send 'Authorization: Bearer <token>' with one of the tokens in the "
                   "server's auth_tokens setting")


def _finish_document(app: FastAPI) -> None:
    """Say in each operation's description which scope its token needs (its security requirement says it too),
    and put the bodies the API parses itself in the components (server/api/bodies.py)."""
    build = app.openapi

    def openapi() -> dict:
        if app.openapi_schema is None:
            doc = with_bodies(build())
            for ops in doc.get("paths", {}).values():
                for op in ops.values():
                    for requirement in op.get("security", ()):
                        scopes = requirement.get("bearerAuth")
                        if scopes is None:
                            continue
                        need = (f"**Scope:** `{scopes[0]}` (or `admin`)." if scopes else
                                "**Scope:** none: any token of the server.")
                        op["description"] = (op.get("description", "").rstrip() + "\n\n" + need).lstrip()
        return app.openapi_schema

    app.openapi = openapi


def _problem(e: dict, content_type: str) -> dict:
    """One problem of a refused request (422), in words that say what to send instead."""
    where, problem = ".".join(str(p) for p in e["loc"]), e["msg"]
    if e["type"] == "json_invalid":  # FastAPI's "JSON decode error", the position in the loc
        where, problem = "body", (f"not JSON: {e.get('ctx', {}).get('error', 'cannot be read')} at character "
                                  f"{e['loc'][-1]} of the body")
    elif e["loc"] == ("body",) and e["type"] in ("model_attributes_type", "model_type", "dict_type", "missing"):
        problem = ("the body must be a JSON object, sent with content-type: application/json" + (
            f" (this one came as {content_type or 'no content-type'})" if "json" not in content_type else
            " (this one is empty)" if e["type"] == "missing" else ""))
    # pydantic starts a validator's own message with "Value error, ": the message is ours, the prefix noise
    return {"where": where, "problem": problem.removeprefix("Value error, ")}


def create_app(settings: Settings, daemon: Daemon | None = None) -> FastAPI:
    """The app for ``settings``. The daemon starts with the app (lifespan) unless
    the caller passes one it manages itself (``cayuga serve`` does, to drain on
    SIGTERM before the HTTP server stops)."""
    owned = daemon is None
    d = daemon or Daemon(settings)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        d.start()
        try:
            yield
        finally:
            if owned:
                d.stop()

    # docs_url=None: /docs is served by the console router from vendored files (no CDN); ReDoc needs one
    app = FastAPI(title="Cayuga", version=version(), lifespan=lifespan, docs_url=None, redoc_url=None,
                  description=DESCRIPTION, generate_unique_id_function=operation_id)
    app.state.daemon = d
    app.state.draining = threading.Event()  # set by the HTTP server (server/serve.py) when a graceful stop begins

    @app.exception_handler(RequestValidationError)
    async def _bad_body(request: Request, exc: RequestValidationError):
        problems = [_problem(e, request.headers.get("content-type", "")) for e in exc.errors()]
        summary = "; ".join(f"{p['where']}: {p['problem']}" for p in problems)
        return JSONResponse(status_code=422, content={"detail": f"invalid request body: {summary}",
                                                      "errors": problems})

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException):
        # starlette's own words for a path or method no route has ("Not Found") say what to do instead
        hint = {404: f"no such endpoint: {request.method} {request.url.path}",
                405: f"{request.method} is not an operation of {request.url.path}"}.get(exc.status_code)
        if hint is not None and exc.detail in ("Not Found", "Method Not Allowed"):
            exc = StarletteHTTPException(exc.status_code, f"{hint}; GET /docs lists the API's operations",
                                         exc.headers)
        return await http_exception_handler(request, exc)

    @app.exception_handler(ServerStarting)
    async def _starting(request: Request, exc: ServerStarting):
        return JSONResponse(status_code=503, content={"detail": str(exc)}, headers={"Retry-After": "5"})

    @app.exception_handler(DiskFull)
    async def _disk_full(request: Request, exc: DiskFull):
        d.counters.add(Count.DISK_FULL_REFUSALS_HTTP)
        return JSONResponse(status_code=507, headers={"Retry-After": "5"}, content={
            "detail": f"{exc}: {request.method} {request.url.path} changed nothing; {exc.hint}, then retry",
            "disk_full": {"part": exc.part, "path": exc.path, "reason": exc.reason}})

    @app.exception_handler(AuthRefused)
    async def _refused(request: Request, exc: AuthRefused):
        status = _REFUSED[exc.reason]
        if status == 401:
            return JSONResponse(status_code=401, content={"detail": UNAUTHENTICATED},
                                headers={"WWW-Authenticate": "Bearer"})
        if status == 429:
            return JSONResponse(status_code=429, headers={"Retry-After": str(exc.retry_after)}, content={
                "detail": f"{exc}: the server slows down an address that sends wrong tokens; check the token "
                          "(one of the server's auth_tokens)"})
        return JSONResponse(status_code=403, content={"detail": str(exc), "missing_scope": exc.scope})

    @app.exception_handler(LimitReached)
    async def _limit(request: Request, exc: LimitReached):
        return JSONResponse(status_code=403, content={"detail": str(exc)})

    for r in (streams.router, subscriptions.router, automaton.router, events.router, system.router, stats.router,
              security.router, ws.router, console.router):
        app.include_router(r)
    app.mount(console.STATIC_URL, console.static_files(), name="console")
    _finish_document(app)
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes, counters=d.counters)
    # HTTP only: WebSockets pass through untouched. Level 6: most of 9's gain at a fraction of its
    # time, on the event loop (/metrics is compressed too when Prometheus asks: a few KB, microseconds)
    app.add_middleware(GZipMiddleware, minimum_size=GZIP_MIN_BYTES, compresslevel=6)
    return app
