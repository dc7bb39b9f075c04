"""The console after the README walkthrough, as a newcomer meets it (issue 23):
the example sent twice explains its late events, registering the identical
query again is flagged, the epoch lag is behind the newest event (not
"56.9 y" for 1970's quotes: "idle" once all is processed), the editor wraps a long line with its line
numbers beside it, and long names are cut with the whole name on hover."""

from __future__ import annotations

import re

import httpx

from tests.ui.conftest import expect

#: 33,840,000 ms, the last of the README example's times.
LAST = "t1 = 33840000 (1970-01-01T09:24:00Z)"


def test_the_readme_example_twice_explains_late_events_flags_the_duplicate_and_lags_in_stream_time(
        server, page, shots):
    page.goto(server.base_url + "/")
    expect(page.locator("#streams tbody tr[data-stream=Stock]")).to_be_visible()
    page.locator("#example").click()
    expect(page.locator("#validation")).to_contain_text("valid CEL")
    page.locator("#register").click()
    expect(page.locator("#validation")).to_have_text("registered as s1")
    page.locator("#send-events").click()
    expect(page.locator("#send-result")).to_have_text("6 accepted, 0 rejected, 0 late")
    expect(page.locator("#matches tbody tr")).to_have_count(2)
    lag = page.locator("#chart-lag")
    expect(lag.locator("figcaption")).to_have_text("epoch lag")
    # behind the newest event, not the clock: not the 56.9 years since 1970; everything processed: idle
    expect(lag.locator("output")).to_have_text("idle")
    shots("first-run")

    # "Try the README example" again on the same server
    page.locator("#example").click()
    expect(page.locator("#validation")).to_contain_text("valid CEL")
    page.locator("#register").click()
    v = page.locator("#validation")
    expect(v).to_contain_text("registered as s2, identical to s1: the same query, so the same witnesses twice")
    expect(v).to_have_class("status warning")
    page.locator("#send-events").click()
    result = page.locator("#send-result")
    # the one at 33840000 is not behind the stream (ties are on time): the "1 accepted, 5 late", explained
    expect(result).to_contain_text("1 accepted, 0 rejected, 5 late")
    expect(result).to_contain_text("These 5 events were late: dropped, because their times are behind the "
                                   f"stream's: the server has already processed events up to {LAST}. The events sent start at "
                                   "t1 = 33000000 (1970-01-01T09:10:00Z).")
    expect(result).to_contain_text("Send events with later times, or leave out t0 and t1 so the server stamps "
                                   "them with its clock.")
    expect(result).to_have_class("status warning")
    shots("second-run-explained")


def test_an_idle_server_with_clock_stamped_events_shows_idle_not_a_growing_lag(server, page):
    """Issue 35: after clock-stamped events, an idle server's epoch lag grew with the clock (7.4 s,
    then 35.9 s), as if the engine fell behind."""
    page.goto(server.base_url + "/")
    expect(page.locator("#chart-events output")).to_have_text("0")  # two polls before the event
    with httpx.Client(base_url=server.base_url) as http:
        r = http.post("/events", json=[{"stream": "Stock", "Name": "IBM", "Price": 1.0, "Volume": 1}])
        assert r.json()["accepted"] == 1
    # a poll that saw the event come in (events/s neither "–" nor "0"), then later ones
    expect(page.locator("#chart-events output")).to_have_text(re.compile(r"^(?!0$)(?!–$).+"))
    expect(page.locator("#chart-lag output")).to_have_text("idle")
    expect(page.locator("#chart-events output")).to_have_text("0")  # a poll later: nothing since, still idle
    expect(page.locator("#chart-lag output")).to_have_text("idle")


def test_long_lines_wrap_and_long_names_are_cut_with_the_whole_name_on_hover(server, page, shots):
    long_stream = "S" + "x" * 199  # the longest name the rule allows
    attrs = {f"A{i:03d}_{'y' * 150}": "int" for i in range(60)}  # a schema of some 10 KB
    with httpx.Client(base_url=server.base_url) as http:
        assert http.post("/streams", json={"name": long_stream, "schema": attrs}).status_code == 201
        r = http.post("/subscriptions", json={"cel": f"SELECT * FROM {long_stream} PUBLISH Out",
                                              "name": "n" * 200})
        assert r.status_code == 201, r.text
    page.goto(server.base_url + "/")
    row = page.locator(f"#streams tbody tr[data-stream={long_stream}]")
    expect(row).to_be_visible()
    expect(page.locator("#subscriptions tbody tr[data-sid=s1]")).to_be_visible()
    width = page.evaluate("() => [document.documentElement.scrollWidth, window.innerWidth]")
    assert width[0] <= width[1], f"the page is {width[0]} px wide in a {width[1]} px window"
    name = row.locator("td.name")
    expect(name).to_have_attribute("title", long_stream)
    assert name.evaluate("td => td.scrollWidth > td.clientWidth")  # cut (the ellipsis), the whole name on hover
    sub_name = page.locator("#subscriptions tbody tr[data-sid=s1] td").nth(1)
    expect(sub_name).to_have_attribute("title", "n" * 200)
    shots("long-names")

    # a one-line query far wider than the editor, then a typo on line 2: it wraps, never scrolls sideways,
    # and line 2's number stands beside line 2
    one_line = "SELECT Name, Price_1 AS Before, Price AS After FROM Stock NEXT{$1.Name = $2.Name AND " \
               + " AND ".join(f"$2.Price >= {k}.0" for k in range(1, 30)) + "} Stock PUBLISH Rising"
    page.locator("#query").fill(one_line + "\nSELECT Nme FROM Stock PUBLISH X")
    expect(page.locator("#errors li.error")).not_to_have_count(0)
    editor = page.locator("#query")
    assert editor.evaluate("t => t.scrollWidth <= t.clientWidth"), "the editor scrolls sideways"
    tops = page.evaluate("""() => {
        const lines = document.querySelectorAll('#editor .backdrop .line');
        const nums = document.querySelectorAll('#editor .gutter > div');
        return [lines.length, nums.length, lines[0].offsetHeight, lines[1].getBoundingClientRect().top,
                nums[1].getBoundingClientRect().top, nums[1].textContent];
    }""")
    n_lines, n_nums, first_height, line2_top, num2_top, num2 = tops
    assert (n_lines, n_nums, num2) == (2, 2, "2")
    assert first_height > 18 * 2  # the first line wraps over several rows
    assert abs(line2_top - num2_top) < 1, tops
    mark = page.locator("#editor mark.error-mark")
    expect(mark).to_have_attribute("data-line", "2")
    assert abs(mark.bounding_box()["y"] - line2_top) < 18, "the error mark is not on line 2's row"
    shots("editor-wraps")


def test_the_identical_query_registered_again(server):
    """Through the API: unnamed (or another name), a second subscription flagged with same_as; with the
    name of the identical one, that one back (200), nothing new."""
    q = {"cel": "SELECT * FROM Stock PUBLISH All"}
    with httpx.Client(base_url=server.base_url) as http:
        first = http.post("/subscriptions", json={**q, "name": "all"})
        assert first.status_code == 201 and first.json()["same_as"] == [] and first.json()["registered_now"]
        again = http.post("/subscriptions", json={**q, "name": "all"})
        assert again.status_code == 200, again.text
        assert again.json()["id"] == first.json()["id"] and again.json()["registered_now"] is False
        unnamed = http.post("/subscriptions", json={"cel": "  SELECT * FROM Stock PUBLISH All\n"})
        assert unnamed.status_code == 201 and unnamed.json()["same_as"] == [first.json()["id"]]
        other = http.post("/subscriptions", json={**q, "name": "other"})
        assert other.status_code == 201
        assert other.json()["same_as"] == [first.json()["id"], unnamed.json()["id"]]
        assert len(http.get("/subscriptions").json()) == 3
