"""Take the README's screenshot of the console (docs/console.png):

    python -m tests.ui.readme_screenshot [docs/console.png]

A real server on a free loopback port, Debian's chromium: the README example
typed in from the page (query, registration, the six events), a second
subscription that reads its output (a resubscription link in the drawing), and
half a minute of random Stock events so that the charts have something to show.

The picture shows what an install runs: it is refused with the pure-Python
engine (build the compiled one first: ``cayuga build-engine``) and with an
epoch lag in years. What the page showed (its header and epoch lag) and a
digest of the console's files are written into the PNG as a text chunk,
``cayuga-console``, which
tests/ui/test_readme_picture.py reads (issue 35: the picture showed "python
engine" and "epoch lag 56.9 y").
"""

from __future__ import annotations

import json
import random
import struct
import sys
import tempfile
import time
import zlib
from pathlib import Path

from playwright.sync_api import expect, sync_playwright

from clients.client import CayugaClient
from server.serve import RunningServer
from tests.server.conftest import make_settings
from tests.ui.conftest import ARGS, CHROMIUM

#: The PNG text chunk's keyword for what the page showed.
KEYWORD = b"cayuga-console"
#: The console's own files (not its vendored ones): the picture is of them.
CONSOLE = Path(__file__).resolve().parents[2] / "server" / "console" / "static"


def console_digest() -> str:
    """A digest of the console's page, styles and scripts: the picture shows this console."""
    import hashlib

    h = hashlib.sha256()
    for f in sorted([*CONSOLE.glob("*.html"), *CONSOLE.glob("*.css"), *CONSOLE.glob("js/*.js")]):
        h.update(f.relative_to(CONSOLE).as_posix().encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def write_facts(path: str | Path, facts: dict) -> None:
    """Add ``facts`` (JSON) to the PNG at ``path`` as a tEXt chunk before its end."""
    data = Path(path).read_bytes()
    end = data.rindex(b"IEND") - 4  # the IEND chunk's length field
    body = b"tEXt" + KEYWORD + b"\0" + json.dumps(facts, sort_keys=True).encode("latin-1")
    chunk = struct.pack(">I", len(body) - 4) + body + struct.pack(">I", zlib.crc32(body))
    Path(path).write_bytes(data[:end] + chunk + data[end:])


def read_facts(path: str | Path) -> dict | None:
    """What :func:`write_facts` wrote into the PNG at ``path``, or None."""
    data = Path(path).read_bytes()
    pos = 8  # after the signature
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos:pos + 4])
        kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + length]
        if kind == b"tEXt" and body.startswith(KEYWORD + b"\0"):
            return json.loads(body[len(KEYWORD) + 1:].decode("latin-1"))
        pos += 12 + length
    return None


def traffic(rnd: random.Random, t: int, n: int) -> list[dict]:
    names = ["IBM", "MSFT", "Dell", "HP"]
    return [{"stream": "Stock", "t0": t + i, "t1": t + i, "Name": rnd.choice(names),
             "Price": round(rnd.uniform(60, 100), 1), "Volume": rnd.randint(100, 9000)} for i in range(n)]


def main(out: str = "docs/console.png", seconds: float = 30.0, require_compiled: bool = True,
         browser=None) -> dict:
    """Take the picture (with ``browser``, else a chromium of its own); what the page showed
    (also written into the PNG)."""
    from air.engine import BUILD

    if require_compiled and BUILD != "compiled":
        raise SystemExit("the README's picture shows what an install runs, the compiled engine; this one runs "
                         f"the {BUILD} engine: build it first (cayuga build-engine, or pip install -e .)")
    if browser is None:
        with sync_playwright() as p:
            own = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
            try:
                return main(out, seconds, require_compiled, own)
            finally:
                own.close()
    with tempfile.TemporaryDirectory() as tmp:
        srv = RunningServer(make_settings(Path(tmp))).start()
        page = browser.new_page(viewport={"width": 1400, "height": 980})
        try:
            with CayugaClient(srv.base_url) as c:
                page.set_default_timeout(15_000)
                page.goto(srv.base_url + "/")
                page.click("#example")
                page.fill("#sub-name", "rising")
                expect(page.locator("#register")).to_be_enabled()
                page.click("#register")
                expect(page.locator("#match-status")).to_contain_text("live")
                page.click("#send-events")
                expect(page.locator("#send-result")).to_have_text("6 accepted, 0 rejected, 0 late")
                c.subscribe(cel="SELECT * FROM FILTER{After > 90}(Rising) PUBLISH BigRise", name="big")
                rnd = random.Random(1)
                t = 34_000_000
                deadline = time.monotonic() + seconds
                while time.monotonic() < deadline:
                    n = rnd.randint(100, 400)
                    c.post_events(traffic(rnd, t, n))
                    t += n
                    time.sleep(0.5)  # the subject: traffic paced over `seconds`, so the console charts fill
                lag = page.locator("#chart-lag output")
                expect(lag).not_to_have_text("–")
                facts = {"health": page.locator("#health").text_content(), "lag": lag.text_content(),
                         "console": console_digest()}
                if facts["lag"].endswith(" y"):
                    raise SystemExit(f"the epoch lag reads {facts['lag']}: not a picture for the README")
                page.screenshot(path=out)
                write_facts(out, facts)
        finally:
            page.close()
            srv.stop()
    return facts


if __name__ == "__main__":
    print(main(*sys.argv[1:2]))
