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
it; any other thread that ends (a pool's idle worker) keeps its last reading: each
role's figure is a counter that never goes back. Threads are named by role: a
per-item thread's name without its item (``cayuga-tcp-41522`` -> ``cayuga-tcp``).

Beside each thread's CPU, its **wait for a CPU** (Linux's schedstat "run delay": the
time it was ready to run and no core was free), and the same for each engine
worker process (server/workers/link.py): high beside the CPU, the machine has
fewer free cores than the server's threads and workers (and whatever else runs
there) need; low, a thread that is not running is waiting for work, or for the
interpreter lock (a thread waiting for that sleeps: it is not counted here).
"""

from __future__ import annotations

import os
import re
import threading
import time
import weakref
from collections import Counter

from prometheus_client.core import CounterMetricFamily

#: Threads made per item (a TCP connection by its port, a backfill by its subscription): one role each.
_PER_ITEM = re.compile(r"^(cayuga-tcp)-\d+$|^(cayuga-backfill)-.")
#: The number Python (``Thread-12 (run)``), a thread pool (``ThreadPoolExecutor-0_3``) or asyncio
#: (``asyncio_0``) gives each thread: not part of its role.
_NUMBERED = re.compile(r"-\d+(?:_\d+)?(?= |$)|_\d+$")
#: Roles at most of other threads than the server's own (``cayuga-*``, ``MainThread``: a fixed set)
#: whose ended threads are kept by name; those of more go into ENDED_OTHERS (the series a scrape
#: gives stay bounded however many threads of other names a process has started and ended).
MAX_ENDED_ROLES = 32
ENDED_OTHERS = "(ended, others)"
_OWN = re.compile(r"^cayuga-|^MainThread$")

_lock = threading.Lock()
_reported: weakref.WeakSet = weakref.WeakSet()  # threads that added theirs (not read again while they end)


def role(name: str) -> str:
    """A thread's role: its name, less the item of a per-item thread, and less the number Python,
    a thread pool or asyncio gave it."""
    m = _PER_ITEM.match(name)
    return (m.group(1) or m.group(2)) if m else _NUMBERED.sub("", name)


_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def stat_fields(pid: int) -> list[bytes] | None:
    """The fields of /proc/PID/stat after the command's name (None where there is no /proc, or the
    process has ended)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()
    except OSError:
        return None


def process_cpu(fields: list[bytes]) -> float:
    """CPU seconds (user and system) of a process's :func:`stat_fields`."""
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS  # utime and stime (fields 14 and 15)


def cpu_wait_ns(path: str) -> int | None:
    """Nanoseconds the thread of a ``schedstat`` file (``/proc/PID/task/TID/schedstat``) has waited
    for a CPU while ready to run (its second field); None where there is none (not Linux, a kernel
    without it, or the thread has ended)."""
    try:
        with open(path, "rb") as f:
            return int(f.read().split()[1])
    except (OSError, IndexError, ValueError):
        return None


def cpu_wait(path: str) -> float | None:
    """:func:`cpu_wait_ns` in seconds."""
    ns = cpu_wait_ns(path)
    return None if ns is None else ns / 1e9


class _Kept:
    """Per-thread figures (a CPU clock, a wait) summed by group, as counters that never go back: a
    thread gone since the last reading keeps the figure it had then, and one that took a gone one's
    key is told apart by its smaller figure. Its caller reads one reading at a time (its lock).

    The figures are integer nanoseconds, so a sum is the same in whatever order its parts are added:
    in floating seconds, a gone thread's figure moved from the live threads' sum to the kept one
    could make the total a rounding step smaller than the reading before, and a counter that goes
    back is a reset to Prometheus (rate() would count all of it again)."""

    def __init__(self) -> None:
        self._last: dict = {}  # thread's key -> (group, figure) at the last reading
        self.ended: Counter = Counter()  # group -> what its gone threads had at their last reading

    def add_ended(self, group: str, figure: int) -> None:
        self.ended[group] += figure

    def update(self, now: dict) -> Counter:
        """The totals by group, given each live thread's ``(group, figure)`` by its key now."""
        for key, (group, before) in self._last.items():
            got = now.get(key)
            if got is None or got[1] < before:  # gone (or its key taken by a new thread)
                self.add_ended(group, before)
        self._last = now
        totals = Counter(self.ended)
        for group, figure in now.values():
            totals[group] += figure
        return totals

    def seconds(self, now: dict) -> dict[str, float]:
        """:meth:`update`'s totals in seconds (each the one float nearest its sum: never smaller
        than the reading before)."""
        return {group: ns / 1e9 for group, ns in self.update(now).items()}


class ProcessCpuWait:
    """Seconds the threads of process ``pid`` have waited for a CPU while ready to run, a counter
    that never goes back (an engine worker's results writer comes and goes: :class:`_Kept`). Read
    from any thread."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self._lock = threading.Lock()
        self._kept = _Kept()

    def read(self) -> float | None:
        """The total so far (None where /proc says nothing of the process: not Linux, or it has ended)."""
        try:
            tids = os.listdir(f"/proc/{self.pid}/task")
        except OSError:
            return None
        now = {tid: ("", w) for tid in tids
               if (w := cpu_wait_ns(f"/proc/{self.pid}/task/{tid}/schedstat")) is not None}
        if not now:
            return None
        with self._lock:
            return self._kept.seconds(now)[""]


class _ByRole(_Kept):
    """A per-thread figure of this process's threads summed by role (:class:`_Kept`): a thread
    that ends without saying so (a pool's idle worker, a snapshot's thread) keeps what it had at
    its last reading; one that says so (:func:`thread_ended`) adds its own figure at its end
    instead. Its readings and changes are under _lock."""

    def __init__(self, read) -> None:
        super().__init__()
        self._read = read  # Thread -> its figure now, in nanoseconds (None: not known)

    def add_ended(self, group: str, figure: int) -> None:
        """An ended thread's figure, to its role's (one of other names than the server's own past
        MAX_ENDED_ROLES of them, to ENDED_OTHERS)."""
        if group not in self.ended and not _OWN.match(group):
            if sum(1 for k in self.ended if not _OWN.match(k)) >= MAX_ENDED_ROLES:
                group = ENDED_OTHERS
        super().add_ended(group, figure)

    def forget(self, me: threading.Thread) -> None:
        """``me`` adds its own as it ends: its last reading is not kept too."""
        self._last.pop((me.ident, me.native_id, me.name), None)

    def totals(self) -> dict[str, float]:
        """Seconds by role."""
        with _lock:
            now = {}
            for t in threading.enumerate():
                if t in _reported or t.ident is None:
                    continue
                got = self._read(t)
                if got is not None:
                    now[(t.ident, t.native_id, t.name)] = (role(t.name), got)
            return self.seconds(now)


def _thread_cpu(t: threading.Thread) -> int | None:
    try:
        return time.clock_gettime_ns(time.pthread_getcpuclockid(t.ident))
    except (OSError, AttributeError):  # it ended since enumerate(), or no such clock on this platform
        return None


def _thread_wait(t: threading.Thread) -> int | None:
    return None if t.native_id is None else cpu_wait_ns(f"/proc/{os.getpid()}/task/{t.native_id}/schedstat")


_cpu = _ByRole(_thread_cpu)
_wait = _ByRole(_thread_wait)


def thread_ended() -> None:
    """Add the calling thread's CPU (and its wait for a CPU) to its role's total: the last thing a
    per-item thread does."""
    me = threading.current_thread()
    waited = cpu_wait_ns("/proc/thread-self/schedstat")
    with _lock:
        _cpu.add_ended(role(me.name), time.thread_time_ns())
        if waited is not None:
            _wait.add_ended(role(me.name), waited)
        _reported.add(me)
        _cpu.forget(me)
        _wait.forget(me)


def by_role() -> dict[str, float]:
    """CPU seconds of this process's threads so far, by role: the live ones', and the ended ones'
    (what they said as they ended, or had at their last reading). A thread running code outside
    Python's ``threading`` (none here) is not seen."""
    return _cpu.totals()


def wait_by_role() -> dict[str, float]:
    """Seconds this process's threads have waited for a CPU while ready to run, by role (as
    :func:`by_role`); empty where /proc says nothing of it."""
    return _wait.totals()


class ThreadCpuCollector:
    """``cayuga_thread_cpu_seconds_total{thread=ROLE}`` from :func:`by_role`, and
    ``cayuga_thread_cpu_wait_seconds_total{thread=ROLE}`` from :func:`wait_by_role`."""

    FAMILIES = (
        ("cayuga_thread_cpu_seconds", "CPU time of the server's main process by thread (per-item threads by "
         "role: cayuga-tcp is every TCP connection's, ended ones included); all share one interpreter lock: "
         "the one near a core is its ceiling", by_role),
        ("cayuga_thread_cpu_wait_seconds", "Time a thread of the server's main process was ready to run and "
         "waited for a CPU (Linux's schedstat run delay; by role, as cayuga_thread_cpu_seconds): high beside "
         "its CPU, the machine has fewer free cores than the server needs. A wait for the interpreter lock is "
         "not in it", wait_by_role),
    )

    def collect(self):
        for name, doc, totals in self.FAMILIES:
            family = CounterMetricFamily(name, doc, labels=["thread"])
            for thread, seconds in sorted(totals().items()):
                family.add_metric([thread], seconds)
            yield family
