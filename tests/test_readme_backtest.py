"""The README's "Backtest, then go live" block, run by bash as written (issue 36), on
a server in the state the first walkthrough leaves (Rising registered as s1, the six
quotes of examples/example9.jsonl sent): it must print the witnesses the README shows,
history first, and say on standard error what the README says it says."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from clients.client import CayugaClient
from clients.testing import RISING, wait_until
from tests.conftest import ROOT
from tests.server.conftest import server, start_server  # noqa: F401  (fixtures)


def backtest_block() -> tuple[str, list[dict]]:
    """(the bash block, the witnesses its comments show, in order)."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("### Backtest, then go live", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
    return block, [json.loads(line[2:]) for line in block.splitlines() if line.startswith("# {")]


def test_the_backtest_walkthrough_runs_as_written(server, tmp_path):
    block, shown = backtest_block()
    assert len(shown) == 5 and [w.get("replay") for w in shown] == [None, True, None, None, None]
    with CayugaClient(server.base_url) as c:  # where the first walkthrough leaves the server
        assert c.subscribe(cel=RISING)["id"] == "s1"
        c.post_events([json.loads(x) for x in (ROOT / "examples" / "example9.jsonl").read_text().splitlines()])
        wait_until(lambda: c.preview({"cel": RISING}, "retained")["events"] == 6, 30, what="the quotes retained")
        env = {k: v for k, v in os.environ.items() if not k.startswith("CAYUGA_")}
        env.update(CAYUGA_URL=server.base_url, PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}")
        done = subprocess.run(["bash", "-e", "-c", block], cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == 0, done.stderr
        printed = [json.loads(x) for x in done.stdout.splitlines() if x.startswith("{")]
        assert printed == shown
        assert "s2 jumps.cel" in done.stdout.splitlines()
        assert "cayuga: 1 witness over 6 events (t1 = 33000000 to 33840000)" in done.stderr
        assert ('cayuga: replay ended: witnesses #1-#1 were history ("replay": true); those after are live'
                in done.stderr)
        table = [line.split(None, 6) for line in done.stdout.splitlines() if re.match(r"(ID|s\d)  ", line)]
        assert table[0] == ["ID", "NAME", "LANGUAGE", "OUTPUTS", "INSTANCES", "EXACT", "BACKFILL"]
        assert table[1][:3] == ["s1", "-", "cel"] and table[1][6] == "-"
        assert table[2][:4] == ["s2", "jumps", "cel", "Jumps"]
        assert table[2][6] == "live (1 witness replayed from t1 = 33000000)"  # register --wait waited for it
