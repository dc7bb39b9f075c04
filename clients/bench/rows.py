"""Issue 32's 2-core rows as one table, from the JSON files clients/bench/rows.sh leaves in a
folder (``python -m clients.bench.rows DIR``): per row, each run's figure, the target, and in
how many runs it was met. Reads files only; what a missing or failed run lacks is said, not
guessed (a row with no figure is "not measured").

Targets (issue 32, "This kind of machine (2 cores)"): ``bench server --queries rising`` server
over ``cayuga run`` <= 1.0; ``rising,runup`` with 2 watchers >= 100K events/s, every witness
delivered (at the default, 1 engine worker, and at 2: the two queries on a worker each, as
``engine_workers: 2`` places them); 10,000 per-symbol queries, 2 workers over 1 in one run >= 1.5; ``bench latency`` p99
<= 1 ms at 50K events/s and <= 5 ms at 100K, every probe received (the in-process engine,
``engine_workers: 0``, measured in the same minutes beside it).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

from clients.bench.server_e2e import TARGET_EVENTS_PER_SECOND, TARGET_P99_MS

#: Issue 32's target for one query against ``cayuga run`` (issue 22's, ``TARGET_OVER_OFFLINE``, was 1.25)
TARGET_OVER_OFFLINE = 1.0


@dataclass
class Row:
    name: str
    target: str
    figures: list[str] = field(default_factory=list)
    met: list[bool] = field(default_factory=list)
    beside: list[str] = field(default_factory=list)  # figures for comparison, not judged

    def verdict(self) -> str:
        if not self.met:
            return "not measured"
        n = sum(self.met)
        return "yes" if n == len(self.met) else ("no" if n == 0 else f"in {n} of {len(self.met)}")


def _load(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _runs(folder: Path, prefix: str) -> list[dict]:
    """The JSON objects of ``prefix*.json`` in ``folder``, in name order (failed runs left out)."""
    return [d for d in map(_load, sorted(folder.glob(f"{prefix}*.json"))) if d is not None]


def _server(folder: Path, prefix: str, row: Row, key: str, fmt: str, meets) -> Row:
    """``bench server`` runs: ``key``'s figure, met where ``meets`` it and every witness arrived."""
    for d in _runs(folder, prefix):
        figure, ok = d.get(key), d.get("every_witness_delivered")
        if figure is not None:
            row.figures.append(fmt.format(figure) + ("" if ok else " (witnesses missing)"))
            row.met.append(bool(ok) and meets(figure))
    return row


def summarize(folder: Path) -> list[Row]:
    rising = _server(folder, "server_rising", Row("bench server --queries rising, server / cayuga run",
                                                          f"<= {TARGET_OVER_OFFLINE}"),
                     "server_over_offline", "{:.2f}", lambda ratio: ratio <= TARGET_OVER_OFFLINE)
    two = _server(folder, "server_two", Row("bench server --queries rising,runup, 2 watchers, events/s",
                                            f">= {TARGET_EVENTS_PER_SECOND:,}, all delivered"),
                  "events_per_second", "{:,}", lambda eps: eps >= TARGET_EVENTS_PER_SECOND)
    two_w2 = _server(folder, "w2_server_two", Row("the same, engine_workers 2 (one query a worker), events/s",
                                                  f">= {TARGET_EVENTS_PER_SECOND:,}, all delivered"),
                     "events_per_second", "{:,}", lambda eps: eps >= TARGET_EVENTS_PER_SECOND)
    many = Row("10,000 per-symbol queries, engine_workers 2 over 1", ">= 1.5")
    for d in _runs(folder, "workers10k"):
        runs = d.get("runs", [])
        for one, two_ in zip(runs[0::2], runs[1::2]):  # 1,2,1,2: each pair in its own minutes
            if one.get("engine_workers") != 1 or two_.get("engine_workers") != 2:
                continue
            ratio = two_["events_per_second"] / one["events_per_second"]
            many.figures.append(f"{one['events_per_second']:,} -> {two_['events_per_second']:,} ({ratio:.2f})")
            many.met.append(ratio >= 1.5)
    lat = {rate: Row(f"bench latency p99 at {rate // 1000}K events/s, ms", f"<= {limit:g}")
           for rate, limit in TARGET_P99_MS.items()}
    for prefix, judged in (("latency_1", True), ("latency_0", False)):
        for d in _runs(folder, prefix):
            for r in d.get("runs", []):
                row = lat.get(r.get("rate_events_per_s"))
                if row is None or r.get("p99_ms") is None:
                    continue
                whole = r.get("received") == r.get("events")
                text = f"{r['p99_ms']:.2f} (p50 {r['p50_ms']:.2f})" + ("" if whole else " (probes missing)")
                if judged:
                    row.figures.append(text)
                    row.met.append(whole and r["p99_ms"] <= TARGET_P99_MS[r["rate_events_per_s"]])
                else:
                    row.beside.append(text)
    return [rising, two, two_w2, many, *lat.values()]


def table(rows: list[Row]) -> str:
    lines = ["| row | runs | target | met |", "|---|---|---|---|"]
    for r in rows:
        figs = ", ".join(r.figures) or "-"
        if r.beside:
            figs += "; engine_workers 0 in the same minutes: " + ", ".join(r.beside)
        lines.append(f"| {r.name} | {figs} | {r.target} | {r.verdict()} |")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if len(argv) != 1 or not Path(argv[0]).is_dir():
        print("usage: python -m clients.bench.rows DIR   (the folder clients/bench/rows.sh wrote)", file=sys.stderr)
        return 2
    print(table(summarize(Path(argv[0]))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
