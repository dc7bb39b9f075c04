"""The console's editor in SASE: the language switch, an error marked at its
line and column, a valid query registered, its automaton (the stay edges drawn
as loops) and its one match streaming in from the paper's six events."""

from __future__ import annotations

from tests.conftest import ROOT
from tests.server.conftest import server, start_server  # noqa: F401  (fixtures)
from tests.ui.conftest import expect

QUERY = """EVENT SEQ(Stock a, !(Stock d), Stock b)
WHERE [Name] AND d.Price < a.Price AND b.Price >= 1.05 * a.Price
WITHIN 1 hour
RETURN a.Name, a.Price AS Before, b.Price AS After PUBLISH Rises"""
TYPO = QUERY.replace("d.Price < a.Price", "d.Prize < a.Price")


def test_a_user_switches_to_sase_writes_registers_and_sees_the_match(server, page, shots):
    page.goto(server.base_url + "/")
    expect(page.locator("#streams tbody tr[data-stream=Stock]")).to_be_visible()
    page.locator("#language").select_option("sase")
    expect(page.locator("#query")).to_have_attribute("placeholder", "EVENT SEQ(Stock a, Stock b) WHERE [Name] "
                                                     "AND b.Price > a.Price WITHIN 1 hour")

    page.locator("#query").fill(TYPO)
    column = TYPO.split("\n")[1].index("d.Prize") + 1
    error = page.locator("#errors li.error")
    expect(error).to_have_count(1)
    expect(error).to_contain_text(f"line 2, column {column}: unknown attribute 'd.Prize'; did you mean 'Price'?")
    mark = page.locator("#editor mark.error-mark")
    expect(mark).to_have_text("d.Prize")
    expect(mark).to_have_attribute("data-line", "2")
    expect(page.locator("#register")).to_be_disabled()
    shots("typo")

    page.locator("#query").fill(QUERY)
    expect(page.locator("#validation")).to_have_text("✓ valid SASE; publishes Rises")
    expect(page.locator("#warnings li")).to_have_count(0)
    page.locator("#register").click()
    expect(page.locator("#validation")).to_have_text("registered as s1")
    expect(page.locator("#subscriptions tbody tr[data-sid=s1]")).to_contain_text("Rises")
    graph = page.locator("#graph svg.automaton")
    expect(graph).to_be_visible()
    loops = graph.locator("g.edge[data-kind=forward]").evaluate_all(
        "es => es.filter(e => e.dataset.from === e.dataset.to).map(e => e.dataset.from)")
    assert len(loops) == 1  # the partial match's stay edge
    shots("registered")

    page.locator("#events-input").fill((ROOT / "examples" / "example9.jsonl").read_text())
    page.locator("#send-events").click()
    expect(page.locator("#send-result")).to_have_text("6 accepted, 0 rejected, 0 late")
    rows = page.locator("#matches tbody tr")
    expect(rows).to_have_count(1)  # 85 -> 91 has the dip to 81 between; 90 -> 91 is not 5%
    assert rows.evaluate_all("rs => rs.map(r => [...r.cells].map(c => c.textContent))") == [
        ["Rises", "33660000", "33840000", "IBM", "81", "91"]]
    shots("match")

    # back to CEL: the README example still validates as CEL
    page.locator("#language").select_option("cel")
    page.locator("#example").click()
    expect(page.locator("#validation")).to_contain_text("valid CEL")
