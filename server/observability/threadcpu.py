"""The main process's CPU by thread (issue 32): which of its threads carries the
load when the server is at its ceiling, without a profiler.

Every thread of the main process shares one interpreter lock, so the process's
CPU (``process_cpu_seconds_total``) near one core is the ceiling more engine
workers cannot lift; which thread spends it says what would (BENCHMARKS.md,
"Engine workers, round 22"): the engine thread (dealing batches to the workers,
reading their results, numbering and logging witnesses), the TCP connections'
threads (reading, decoding and journaling events), the HTTP and WebSocket event
loop (``MainThread``), the journal's flusher.

Each live thread's CPU clock is read by its ident (``pthread_getcpuclockid``);
a thread made per connection or per backfill adds its own CPU to its role's
total as it ends (:func:`thread_ended`), so a connection's CPU is not lost with
it. Threads are named by role: a per-item thread's name without its item
(``cayuga-tcp-41522`` -> ``cayuga-tcp``).
"""

from __future__ import annotations

import re
import threading
import time
import weakref
from collections import Counter

from prometheus_client.core import CounterMetricFamily

#: Threads made per item (a TCP connection by its port, a backfill by its subscription): one role each.
_PER_ITEM = re.compile(r"^(cayuga-tcp)-\d+$|^(cayuga-backfill)-.")

_lock = threading.Lock()
_ended: Counter = Counter()  # role -> CPU seconds of its threads that have ended
_reported: weakref.WeakSet = weakref.WeakSet()  # threads that added theirs (not read again while they end)


def role(name: str) -> str:
    """A thread's role: its name, less the item of a per-item thread."""
    m = _PER_ITEM.match(name)
    return (m.group(1) or m.group(2)) if m else name


def thread_ended() -> None:
    """Add the calling thread's CPU to its role's total: the last thing a per-item thread does."""
    me = threading.current_thread()
    with _lock:
        _ended[role(me.name)] += time.thread_time()
        _reported.add(me)


def by_role() -> dict[str, float]:
    """CPU seconds of this process's threads so far, by role: the live ones' and the ended ones' that
    said so. A thread running code outside Python's ``threading`` (none here) is not seen."""
    with _lock:
        totals = Counter(_ended)
        reported = set(_reported)
    for t in threading.enumerate():
        if t in reported or t.ident is None:
            continue
        try:
            totals[role(t.name)] += time.clock_gettime(time.pthread_getcpuclockid(t.ident))
        except (OSError, AttributeError):  # it ended since enumerate(), or no such clock on this platform
            pass
    return dict(totals)


class ThreadCpuCollector:
    """``cayuga_thread_cpu_seconds_total{thread=ROLE}`` from :func:`by_role`."""

    def collect(self):
        cpu = CounterMetricFamily("cayuga_thread_cpu_seconds", "CPU time of the server's main process by thread "
                                  "(per-item threads by role: cayuga-tcp is every TCP connection's, ended ones "
                                  "included); all share one interpreter lock: the one near a core is its ceiling",
                                  labels=["thread"])
        for name, seconds in sorted(by_role().items()):
            cpu.add_metric([name], seconds)
        yield cpu
