"""The server: it wires the rooms (docs/architecture.md)."""

import os

# numpy (the per-subscription arrays of server/durability/seqmap.py) does no linear algebra here; left
# to itself, its OpenBLAS starts a thread per core, and the server then stalled 20-80 ms now and then
# (BENCHMARKS.md, "Engine workers, round 3"). A user's own setting is kept.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
