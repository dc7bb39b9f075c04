"""Why the event queue uses heapq: push/pop timing against SortedList (see server/ingest/queue.py;
the figures are in BENCHMARKS.md, "The event queue: heapq against SortedList")."""
import heapq, itertools, random, time
from sortedcontainers import SortedList
N=1_000_000
rng=random.Random(1)
ts=[i + rng.randint(0, 50) for i in range(N)]  # nearly ordered, as arrivals are
def run_heap():
    h=[]; c=itertools.count(); t=time.perf_counter()
    for x in ts:
        heapq.heappush(h,(x,next(c),None))
        if len(h)>1000: heapq.heappop(h)
    while h: heapq.heappop(h)
    return time.perf_counter()-t
def run_sl():
    s=SortedList(); c=itertools.count(); t=time.perf_counter()
    for x in ts:
        s.add((x,next(c),None))
        if len(s)>1000: s.pop(0)
    while s: s.pop(0)
    return time.perf_counter()-t
print("heapq", min(run_heap() for _ in range(3)))
print("sortedlist", min(run_sl() for _ in range(3)))
