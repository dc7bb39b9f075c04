"""The FastAPI application: wiring and lifespan only."""

from __future__ import annotations

import threading
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.gzip import GZipMiddleware
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute

from server.api.bodylimit import BodyLimit
from server.api import automaton, console, events, stats, streams, subscriptions, system, ws
from server.config import Settings
from server.daemon import Daemon, LimitReached, ServerStarting
from server.durability.diskfull import DiskFull
from server.observability.counters import Count
from server.version import version


#: Responses at least this large are gzip-compressed for a client that accepts it (the
#: Swagger UI's 1.7 MB bundle goes out as about 0.5 MB); small API answers are sent as they are.
GZIP_MIN_BYTES = 4096


DESCRIPTION = (
    "Complex event processing: register CEL or AIR subscriptions, send events, receive matches over "
    "WebSockets (`/ws/subscriptions/{id}`, `/ws/streams/{name}`: see the README).\n\n"
    "Every error answer is JSON with a `detail` saying what went wrong and what to do (the `ErrorOut` schema). "
    "When the server has `auth_tokens`, every operation but /health, /livez and /readyz needs "
    "`Authorization: Bearer <token>`. Below the operations, any request may also get 408 (its headers or body "
    "did not arrive in time) or 503 (the server holds max_http_connections connections), with the same body.")


def operation_id(route: APIRoute) -> str:
    """An operation's id in the OpenAPI document: its function's name (``create_subscription``), stable
    for client generators."""
    return route.name


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
        problems = [{"where": ".".join(str(p) for p in e["loc"]), "problem": e["msg"]} for e in exc.errors()]
        summary = "; ".join(f"{p['where']}: {p['problem']}" for p in problems)
        return JSONResponse(status_code=422, content={"detail": f"invalid request body: {summary}",
                                                      "errors": problems})

    @app.exception_handler(ServerStarting)
    async def _starting(request: Request, exc: ServerStarting):
        return JSONResponse(status_code=503, content={"detail": str(exc)}, headers={"Retry-After": "5"})

    @app.exception_handler(DiskFull)
    async def _disk_full(request: Request, exc: DiskFull):
        d.counters.add(Count.DISK_FULL_REFUSALS_HTTP)
        return JSONResponse(status_code=507, headers={"Retry-After": "5"}, content={
            "detail": f"{exc}: {request.method} {request.url.path} changed nothing; {exc.hint}, then retry",
            "disk_full": {"part": exc.part, "path": exc.path, "reason": exc.reason}})

    @app.exception_handler(LimitReached)
    async def _limit(request: Request, exc: LimitReached):
        return JSONResponse(status_code=403, content={"detail": str(exc)})

    for r in (streams.router, subscriptions.router, automaton.router, events.router, system.router, stats.router,
              ws.router, console.router):
        app.include_router(r)
    app.mount(console.STATIC_URL, console.static_files(), name="console")
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes, counters=d.counters)
    # HTTP only: WebSockets pass through untouched. Level 6: most of 9's gain at a fraction of its
    # time, on the event loop (/metrics is compressed too when Prometheus asks: a few KB, microseconds)
    app.add_middleware(GZipMiddleware, minimum_size=GZIP_MIN_BYTES, compresslevel=6)
    return app
