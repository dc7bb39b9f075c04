"""`cayuga run` end to end, as a user runs it: a real subprocess, real files."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import AIR_DIR, ROOT

STOCK_DECL = "Stock(Name string, Price float, Volume int)"


def cayuga(*args, stdin: str | None = None):
    return subprocess.run([sys.executable, "-m", "clients.cli", *args], input=stdin, capture_output=True,
                          text=True, timeout=120, cwd=ROOT)


def test_bundled_example_prints_the_papers_witness():
    r = cayuga("run", "--stream", STOCK_DECL, "--query", "examples/example9.xml",
               "--events", "examples/example9.jsonl")
    assert r.returncode == 0, r.stderr
    assert [json.loads(x) for x in r.stdout.splitlines()] == [
        {"stream": "RisingAfterDecline", "t0": 33000000, "t1": 33840000, "Name": "IBM",
         "MaxPrice": 90.0, "MinPrice": 81.0, "FinalPrice": 91.0}]
    assert "6 events, 1 witness, 0 rejected lines" in r.stderr  # one: singular (issue 23)


@pytest.mark.parametrize("fmt, text", [
    ("jsonl", '{"stream": "Stock", "t0": 1, "t1": 1, "Name": "IBM", "Price": 1.5, "Volume": 10}\n'
              '{"stream": "Stock", "t1": 2, "Name": "IBM", "Price": 2.5, "Volume": 20}\n'),
    ("cayuga", "IBM, 1.5, 10, Stock, 1, 1\nIBM, 2.5, 20, Stock, 2, 2,\n"),
    ("csv", "stream,t0,t1,Name,Price,Volume\nStock,1,1,IBM,1.5,10\nStock,2,2,IBM,2.5,20\n"),
])
def test_event_formats(tmp_path, fmt, text):
    events = tmp_path / f"events.{fmt}"
    events.write_text(text)
    out = tmp_path / "w.jsonl"
    r = cayuga("run", "--stream", STOCK_DECL, "--query", str(AIR_DIR / "T5.xml"), "--events", str(events),
               "--format", fmt, "--output", str(out))
    assert r.returncode == 0, r.stderr
    assert [json.loads(x) for x in out.read_text().splitlines()] == [
        {"stream": "T5", "t0": 1, "t1": 2, "Name_1": "IBM", "Price_1": 1.5, "Volume_1": 10,
         "Name": "IBM", "Price": 2.5, "Volume": 20}]


def test_bad_lines_are_reported_with_line_numbers_and_the_run_goes_on(tmp_path):
    events = tmp_path / "e.jsonl"
    events.write_text("\n".join([
        '{"stream": "Stock", "t0": 1, "t1": 1, "Name": "IBM", "Price": 1, "Volume": 1}',
        '{"stream": "Stock", "t1": 2, "Name": "IBM", "Price": "cheap", "Volume": 1}',
        '{"stream": "Bond", "t1": 2}',
        'not json',
        '{"stream": "Stock", "t1": 3, "Name": "IBM", "Price": 3, "Volume": 1, "Extra": 1}',
        '{"stream": "Stock", "t0": 5, "t1": 4, "Name": "IBM", "Price": 3, "Volume": 1}',
        '{"stream": "Stock", "t1": 6, "Name": "IBM", "Price": 6, "Volume": 1}',
    ]) + "\n")
    r = cayuga("run", "--stream", STOCK_DECL, "--query", str(AIR_DIR / "T5.xml"), "--events", str(events))
    assert r.returncode == 1
    errs = [line for line in r.stderr.splitlines() if "rejected:" in line]
    assert errs == [
        f"{events}:2: rejected: attribute 'Price' must be float, got 'cheap'",
        f"{events}:3: rejected: unknown stream 'Bond'; declare it first",
        f"{events}:4: rejected: invalid JSON: expected a JSON object at column 1",
        f"{events}:5: rejected: stream Stock has no attribute 'Extra' "
        "(its schema: Stock(Name string, Price float, Volume int))",
        f"{events}:6: rejected: t0 (5) is after t1 (4); an event needs t0 <= t1",
    ]
    assert [json.loads(x)["t1"] for x in r.stdout.splitlines()] == [6]


def test_original_schema_file_and_resubscription_chain(tmp_path):
    schema = tmp_path / "stock.xml"
    schema.write_text('<StreamType Name="Stock"><AttrNameType Name="Name" Type="string"/>'
                      '<AttrNameType Name="Price" Type="float"/><AttrNameType Name="Volume" Type="int"/>'
                      '</StreamType>')
    lines = ["IBM, 90, 1, Stock, 1, 1", "MSFT, 5, 1, Stock, 2, 2", "IBM, 70, 1, Stock, 3, 3"]
    events = tmp_path / "e.txt"
    events.write_text("\n".join(lines) + "\n")
    r = cayuga("run", "--schema", str(schema), "--query", str(AIR_DIR / "IBMStock.xml"),
               "--query", str(AIR_DIR / "IBM_MSFT_PAIR.xml"), "--events", str(events), "--format", "cayuga")
    assert r.returncode == 0, r.stderr
    assert [json.loads(x) for x in r.stdout.splitlines()] == [
        {"stream": "IBMStock", "t0": 1, "t1": 1, "IBMPrice": 90.0},
        {"stream": "IBM_MSFT_PAIR", "t0": 1, "t1": 2, "IBMPrice": 90.0, "MSFTPrice": 5.0},
    ]


def test_resub_streams_are_hidden_unless_asked_for(tmp_path):
    events = tmp_path / "e.txt"
    events.write_text("IBM, 1, 20000, Stock, 1, 1\nIBM, 2, 1, Stock, 2, 2\n")
    args = ["run", "--stream", STOCK_DECL, "--query", str(AIR_DIR / "94.xml"), "--events", str(events),
            "--format", "cayuga"]
    assert cayuga(*args).stdout == ""
    r = cayuga(*args, "--include-resub")
    assert [json.loads(x)["cnt"] for x in r.stdout.splitlines()] == [2]


def test_bad_query_is_a_clear_error_not_a_traceback(tmp_path):
    q = tmp_path / "q.xml"
    q.write_text((AIR_DIR / "T5.xml").read_text().replace('Destination="2"', 'Destination="7"'))
    events = tmp_path / "e.jsonl"
    events.write_text("")
    r = cayuga("run", "--stream", STOCK_DECL, "--query", str(q), "--events", str(events))
    assert r.returncode == 2
    assert "Traceback" not in r.stderr
    assert "line 24: <ForwardEdge Destination=\"7\">: no node has NodeID '7'" in r.stderr


def test_bad_stream_declaration():
    r = cayuga("run", "--stream", "Stock(Name strin)", "--query", str(AIR_DIR / "T1.xml"), "--events", "-",
               stdin="")
    assert r.returncode == 2
    assert "unknown attribute type 'strin'" in r.stderr


def test_compile_prints_air_that_runs_like_the_original(tmp_path):
    out = tmp_path / "t5.xml"
    r = cayuga("compile", "tests/conformance/cel/test5.cel", "--stream", STOCK_DECL, "-o", str(out))
    assert r.returncode == 0, r.stderr
    events = tmp_path / "e.txt"
    events.write_text("IBM, 1, 1, Stock, 1, 1\nMSFT, 2, 1, Stock, 2, 2\nIBM, 3, 1, Stock, 3, 3\n")
    ours = cayuga("run", "--stream", STOCK_DECL, "--query", str(out), "--events", str(events), "--format", "cayuga")
    orig = cayuga("run", "--stream", STOCK_DECL, "--query", str(AIR_DIR / "T5.xml"), "--events", str(events),
                  "--format", "cayuga")
    assert ours.returncode == orig.returncode == 0
    assert ours.stdout == orig.stdout != ""


def test_run_accepts_cel_and_reports_cel_errors_with_a_caret(tmp_path):
    q = tmp_path / "q.cel"
    q.write_text("SELECT Name\nFROM FILTER{Prize > 1}(Stock)\nPUBLISH P\n")
    r = cayuga("run", "--stream", STOCK_DECL, "--query", str(q), "--events", "examples/example9.jsonl")
    assert r.returncode == 2
    assert f"{q}: line 2, column 13: unknown attribute 'Prize' in FILTER" in r.stderr
    assert "FROM FILTER{Prize > 1}(Stock)\n" in r.stderr and "            ^" in r.stderr
    q.write_text("SELECT Name FROM FILTER{Price > 84}(Stock) PUBLISH P\n")
    r = cayuga("run", "--stream", STOCK_DECL, "--query", str(q), "--events", "examples/example9.jsonl")
    assert [json.loads(x)["Name"] for x in r.stdout.splitlines()] == ["IBM", "IBM", "IBM"]


def test_a_directory_of_per_symbol_queries_loads_in_name_order_with_one_shape(tmp_path):
    """`--query DIR` takes the directory's .cel and .xml files in name order;
    queries that differ only in constants are bound from one compiled shape
    and give each its own witnesses."""
    from clients.testing import increasing_cel, write_queries

    d = tmp_path / "q"
    write_queries(d, 30, length=3)
    (d / "README").write_text("not a query")
    lines = []
    for t in range(1, 5):  # S00007 rises three times in a row, S00012 does not
        lines.append({"stream": "Stock", "t1": t, "Name": "S00007", "Price": float(t), "Volume": 1})
        lines.append({"stream": "Stock", "t1": t, "Name": "S00012", "Price": float(5 - t), "Volume": 1})
    events = tmp_path / "e.jsonl"
    events.write_text("".join(json.dumps(x) + "\n" for x in lines))
    r = cayuga("run", "--stream", STOCK_DECL, "--query", str(d), "--events", str(events))
    assert r.returncode == 0, r.stderr
    got = [json.loads(x) for x in r.stdout.splitlines()]
    assert got == [{"stream": "Up_S00007", "t0": 1, "t1": 3, "First": 1.0, "Last": 3.0},
                   {"stream": "Up_S00007", "t0": 2, "t1": 4, "First": 2.0, "Last": 4.0}]
    assert "Up_S00007" in increasing_cel("S00007")


def test_run_warns_of_a_next_without_a_time_bound_and_runs_it(tmp_path):
    r = cayuga("run", "--stream", STOCK_DECL, "--query", "examples/rising.cel", "--events", "examples/example9.jsonl")
    assert r.returncode == 0, r.stderr
    assert len(r.stdout.splitlines()) == 2  # the README's two witnesses: a warning stops nothing
    line3 = (ROOT / "examples" / "rising.cel").read_text().split("\n")[2]
    column = line3.index("NEXT") + 1
    assert (f"examples/rising.cel: line 3, column {column}: warning: NEXT keeps each partial match until a later "
            "Stock event satisfies its condition") in r.stderr
    assert "NEXT{... AND DUR < 1 HOUR}" in r.stderr
    assert f"  {line3}\n  {' ' * (column - 1)}^\n" in r.stderr
    bounded = tmp_path / "bounded.cel"
    bounded.write_text((ROOT / "examples" / "rising.cel").read_text().replace("$1.Price}", "$1.Price AND DUR < 1 HOUR}"))
    r = cayuga("run", "--stream", STOCK_DECL, "--query", str(bounded), "--events", "examples/example9.jsonl")
    assert r.returncode == 0, r.stderr
    assert "warning" not in r.stderr


def test_arithmetic_at_the_edges_of_the_int_and_float_ranges(tmp_path):
    """Issue 34: ``FILTER{Volume % 7 = 1}`` matched ``Volume = 2^60 + 1`` (the
    remainder went through a float: it is 2); a product beyond 64 bits was
    written into an int column, and a float overflow as ``null``. Now such an
    operation fails (docs/design/semantics.md#arithmetic-and-comparison): no witness."""
    events = tmp_path / "e.jsonl"
    events.write_text("".join(json.dumps({"stream": "Stock", "t1": t, "Name": "A", "Price": p, "Volume": v}) + "\n"
                              for t, (p, v) in enumerate([(1e308, 2 ** 60 + 1), (1.5, 8), (2.0, 2 ** 62 + 5)])))
    queries = {"mod": ("FILTER{Volume % 7 = 1}(Stock)", [8]),
               "square": ("SELECT Volume * Volume AS v FROM Stock", [64]),
               "big": ("SELECT Price * 10 AS v FROM Stock", [15.0, 20.0])}
    for name, (text, want) in queries.items():
        q = tmp_path / f"{name}.cel"
        q.write_text(f"SELECT * FROM {text} PUBLISH Out" if text.startswith("FILTER") else f"{text} PUBLISH Out")
        r = cayuga("run", "--stream", STOCK_DECL, "--query", str(q), "--events", str(events))
        assert r.returncode == 0, r.stderr
        got = [json.loads(x) for x in r.stdout.splitlines()]
        assert [w["Volume" if name == "mod" else "v"] for w in got] == want, name


@pytest.mark.parametrize("name, text, said", [
    # issue 35: CEL in q.txt was read as AIR: "AIR document is not well-formed XML: Start tag expected"
    ("q.txt", "SELECT Name FROM Stock PUBLISH X", "q.txt: a query file's suffix says its language (.cel for CEL, "
                                                  ".xml for AIR XML, .sase for SASE), and .txt says none (it looks "
                                                  "like CEL: rename it q.cel)"),
    ("q", "<NFA/>", "q: a query file's suffix says its language (.cel for CEL, .xml for AIR XML, .sase for SASE), and "
                    "no suffix says none (it looks like AIR XML: rename it q.xml)"),
    ("q.query", "-- rises\nEVENT SEQ(Stock a, Stock b) WHERE [Name] WITHIN 1 hour",
     "q.query: a query file's suffix says its language (.cel for CEL, .xml for AIR XML, .sase for SASE), and "
     ".query says none (it looks like SASE: rename it q.sase)"),
    ("q.xml", "SELECT Name FROM Stock", "q.xml: a .xml file is read as AIR XML, and this one does not start with '<' "
                                        "(it looks like CEL: rename it q.cel)"),
    ("q.cel", "\n  <NFA/>", "q.cel: a .cel file is read as CEL, and this one starts with '<' (it looks like AIR XML: "
                            "rename it q.xml)"),
])
def test_a_query_file_whose_suffix_names_no_language_or_the_other_one_says_what_to_rename(tmp_path, name, text, said):
    (tmp_path / name).write_text(text)
    r = subprocess.run([sys.executable, "-m", "clients.cli", "run", "--query", name, "--events",
                        str(ROOT / "examples" / "example9.jsonl")], capture_output=True, text=True, timeout=120,
                       cwd=tmp_path, env=_here())
    assert (r.returncode, r.stdout, r.stderr) == (2, "", f"cayuga: {said}\n")


def test_compile_declares_the_bundled_streams_like_run(tmp_path):
    (tmp_path / "q.cel").write_text("SELECT Name FROM Stock PUBLISH Names")
    r = cayuga("compile", str(tmp_path / "q.cel"))
    assert r.returncode == 0, r.stderr  # it said "unknown stream 'Stock' (declared streams: DUAL)"
    assert r.stdout.startswith("<NFA")


def _here() -> dict:
    import os

    return {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
