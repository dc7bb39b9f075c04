"""Browser tests: playwright drives Debian's chromium (/usr/bin/chromium) headless
against a real server on loopback. No browser is ever downloaded.

Without chromium or playwright these tests fail under CI (CI=true, as .ci/run
sets) and are skipped with the reason elsewhere. Every page is offline: a
request to anything but the test server is refused and fails the test.
Screenshots of each step go to tests/ui/artifacts/<test>/ (not committed).
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.server.conftest import server, start_server  # noqa: F401  (fixtures)

try:
    from playwright.sync_api import expect, sync_playwright
except ImportError:  # reported by the browser fixture: a failure under CI, else a skip
    expect = sync_playwright = None

CHROMIUM = os.environ.get("CAYUGA_CHROMIUM", "/usr/bin/chromium")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]
ARTIFACTS = Path(__file__).parent / "artifacts"
TIMEOUT_MS = 15_000  # every wait in these tests


def _unavailable(reason: str):
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"browser tests cannot run in CI: {reason}", pytrace=False)
    pytest.skip(f"{reason} (set CI=true to make this a failure; .ci/run installs it)")


@pytest.fixture(scope="session")
def browser():
    if not Path(CHROMIUM).is_file():
        _unavailable(f"no chromium at {CHROMIUM}: apt-get install chromium")
    if sync_playwright is None:
        _unavailable("playwright is not installed: pip install -e '.[test]'")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, timeout=TIMEOUT_MS)
        yield b
        b.close()


class Shots:
    """Numbered screenshots of one test's steps."""

    def __init__(self, page, directory: Path) -> None:
        self.page = page
        self.dir = directory
        self.n = 0
        shutil.rmtree(directory, ignore_errors=True)
        directory.mkdir(parents=True)

    def __call__(self, step: str) -> Path:
        self.n += 1
        path = self.dir / f"{self.n:02d}-{step}.png"
        self.page.screenshot(path=str(path), full_page=True)
        return path


@pytest.fixture
def page(browser, request):
    """A fresh page that may only talk to 127.0.0.1; fails the test on a JS error."""
    context = browser.new_context(viewport={"width": 1500, "height": 1000})
    context.set_default_timeout(TIMEOUT_MS)
    outside: list[str] = []
    errors: list[str] = []

    def only_loopback(route):
        host = urlsplit(route.request.url).hostname
        if route.request.url.startswith("data:") or host == "127.0.0.1":
            route.continue_()
        else:
            outside.append(route.request.url)
            route.abort()

    context.route("**/*", only_loopback)
    pg = context.new_page()
    pg.on("pageerror", lambda exc: errors.append(str(exc)))
    yield pg
    context.close()
    assert outside == [], "the page reached outside the server"
    assert errors == [], "JavaScript errors on the page"


@pytest.fixture
def shots(page, request) -> Shots:
    return Shots(page, ARTIFACTS / re.sub(r"[^\w.-]", "_", request.node.name))
