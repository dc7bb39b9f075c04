"""Take the README's screenshot of the console (docs/console.png):

    python -m tests.ui.readme_screenshot [docs/console.png]

A real server on a free loopback port, Debian's chromium: the README example
typed in from the page (query, registration, the six events), a second
subscription that reads its output (a resubscription link in the drawing), and
half a minute of random Stock events so that the charts have something to show.
"""

from __future__ import annotations

import random
import sys
import tempfile
import time
from pathlib import Path

from playwright.sync_api import expect, sync_playwright

from clients.client import CayugaClient
from server.serve import RunningServer
from tests.server.conftest import make_settings
from tests.ui.conftest import ARGS, CHROMIUM


def traffic(rnd: random.Random, t: int, n: int) -> list[dict]:
    names = ["IBM", "MSFT", "Dell", "HP"]
    return [{"stream": "Stock", "t0": t + i, "t1": t + i, "Name": rnd.choice(names),
             "Price": round(rnd.uniform(60, 100), 1), "Volume": rnd.randint(100, 9000)} for i in range(n)]


def main(out: str = "docs/console.png", seconds: float = 30.0) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        srv = RunningServer(make_settings(Path(tmp))).start()
        try:
            with sync_playwright() as p, CayugaClient(srv.base_url) as c:
                browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
                page = browser.new_page(viewport={"width": 1400, "height": 980})
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
                page.screenshot(path=out)
                browser.close()
        finally:
            srv.stop()


if __name__ == "__main__":
    main(*sys.argv[1:2])
