"""The web console at ``/`` and Swagger UI at ``/docs``, both from files
shipped in the package (``server/console/static``): no CDN, no network.

Pages and assets hold no data, so they are served without a token; every
data call the console makes goes through the other routers (and their auth).
"""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, Request
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import FileResponse, HTMLResponse
from fastapi.staticfiles import StaticFiles

import server.console

STATIC_DIR = Path(server.console.__file__).resolve().parent / "static"
#: Where the static files are mounted (see :func:`static_files`).
STATIC_URL = "/console"

router = APIRouter(include_in_schema=False)


def static_files() -> StaticFiles:
    """The console's files, for ``app.mount(STATIC_URL, ...)``."""
    return StaticFiles(directory=STATIC_DIR)


@router.get("/")
def console_page() -> FileResponse:
    return FileResponse(STATIC_DIR / "index.html", headers={"Cache-Control": "no-cache"})


@router.get("/docs")
def swagger_ui(request: Request) -> HTMLResponse:
    vendor = f"{STATIC_URL}/vendor/swagger-ui"
    return get_swagger_ui_html(openapi_url=request.app.openapi_url, title=f"{request.app.title} API",
                               swagger_js_url=f"{vendor}/swagger-ui-bundle.js",
                               swagger_css_url=f"{vendor}/swagger-ui.css",
                               swagger_favicon_url=f"{vendor}/favicon-32x32.png")
