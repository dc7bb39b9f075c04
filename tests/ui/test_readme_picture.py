"""The README's picture of the console matches the product (issue 35: it showed
"python engine" and "epoch lag 56.9 y"). tests/ui/readme_screenshot.py writes
what the page showed into the PNG; the committed picture must have been taken
so, of the console as it is now, with the compiled engine, a healthy server and a
lag in seconds at most."""

from __future__ import annotations

import re

from tests.conftest import ROOT
from tests.ui.readme_screenshot import console_digest, main, read_facts


def test_the_readme_picture_was_taken_by_the_script_with_what_an_install_runs():
    facts = read_facts(ROOT / "docs" / "console.png")
    assert facts is not None, "docs/console.png was not taken by python -m tests.ui.readme_screenshot"
    assert re.fullmatch(r"ok · compiled engine · \d+ clients?", facts["health"]), facts
    assert facts["lag"] == "idle" or re.fullmatch(r"[\d.]+ (µs|ms|s)", facts["lag"]), facts
    assert facts.get("console") == console_digest(), (
        "the console's files changed since docs/console.png was taken: retake it with "
        "python -m tests.ui.readme_screenshot (the compiled engine built)")


def test_the_script_writes_what_the_page_showed_into_the_picture(browser, tmp_path):
    """The script itself, briefly, into a file of the test's (``browser``: chromium is there)."""
    out = tmp_path / "console.png"
    facts = main(str(out), seconds=1.0, require_compiled=False, browser=browser)
    assert read_facts(out) == facts and out.read_bytes().startswith(b"\x89PNG")
    assert facts["health"].startswith("ok · ")
