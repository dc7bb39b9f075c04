"""What row scaling costs the main process (server/workers/rows.py): dealing a
4,096-event batch of 1,000 symbols by key value (``rows.split``) against by
stream alone (the column path), and merging a batch's witnesses of two workers
(``rows.Merge``). ``python -m clients.bench.rowcost``; BENCHMARKS.md, "Engine
workers, row scaling"."""

from __future__ import annotations

import time

from air.cel import compile_cel
from clients.testing.market import STOCK, RISING, random_walk
from server.workers.placement import Placement
from server.workers import rows
def main() -> None:
    ev = random_walk(1000, 4096, seed=1)
    p = Placement(2, schema={"Stock": STOCK}.get)
    autos = compile_cel(RISING, [STOCK]).automata
    p.place("r", {"Stock"}, {"Rising"}, 2, automata=autos)
    col = Placement(2, schema={"Stock": STOCK}.get, rows="off")
    col.place("r", {"Stock"}, {"Rising"}, 2, automata=autos)
    def column(batch, pl):
        parts = {}
        for e in batch:
            for w in pl.readers(e.stream):
                parts.setdefault(w, []).append(e)
        return parts
    def best(f, n=30):
        ts = []
        for _ in range(n):
            t = time.perf_counter(); f(); ts.append(time.perf_counter() - t)
        return min(ts)
    a = best(lambda: column(ev, col)); b = best(lambda: rows.split(ev, p))
    print(f"deal 4096 events: by stream {a/4096*1e6:.3f} us/event, by key {b/4096*1e6:.3f} us/event")
    parts, places = rows.split(ev, p)
    groups = {w: [["r", ["Rising"] * len(parts[w]), [b"x" * 80] * len(parts[w])]] for w in parts}
    wplaces = {w: [["r", list(range(len(parts[w])))]] for w in parts}
    def merge():
        m = rows.Merge()
        for w in sorted(parts):
            m.take(w, groups[w], wplaces[w], places[w])
        m.batch()
    c = best(merge)
    print(f"merge 4096 witnesses of 2 workers: {c/4096*1e6:.3f} us/witness")


if __name__ == "__main__":
    main()
