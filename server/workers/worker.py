"""An engine worker: a process of its own that owns an engine and is its only
writer (issue 32). The main process decodes events, orders them (the
T-delayed queue), journals them, numbers, logs and delivers witnesses; the
worker runs the automata, on a core of its own, beside the main process's
interpreter lock instead of under it.

It reads messages from its pipe in order (server/workers/codec.py): batches,
which it feeds to the engine and answers with the batch's witnesses already
encoded; commands (install or remove a subscription, declare a stream, counts,
snapshots...), answered in turn. Everything that changes the engine's state
comes through the pipe, in the order the main process decided it: the
worker's engine goes through exactly the states an engine thread's would.

After a batch that ends at a check point of the state budget
(server/budgetcheck.py), the worker checks; if it decides to shed, it sends
the decisions with the batch's result and takes nothing more from the pipe
(later batches wait in it) until the main process has recorded them and says
which to apply (``P``): a shedding is applied only once it is durable.

Snapshots: the worker forks (beside the thread that runs this loop, its watch,
:class:`Watch`, and a writer only while a result waits for the main process to
read it, server/workers/channel.py; neither holds a lock the child takes: a fork
is safe) and the child
writes the whole snapshot file — the main process's part, sent with the
command, and the engine's state — in the format server/durability/snapshot.py
reads, then exits; the worker reports the child's end (``S``).
"""

from __future__ import annotations

import dataclasses
import gc
import logging
import os
import pickle
import signal
import socket
import sys
import threading
import time
import traceback
import warnings
from collections import Counter, deque
from operator import attrgetter
from pathlib import Path

from air.engine import Engine, EngineError, LateEvent
from air.engine.memory import raise_young_threshold
from air.partitioning import KEY_GROUP_FUNCTION, key_group
from server.budgetcheck import COUNT_BUDGET_SECONDS, BudgetCheck, Cap, Counting, Decision
from server.delivery.encoding import LocalNumbers, WitnessEncoder
from server.workers import codec
from server.workers.channel import ResultWriter

log = logging.getLogger("cayuga.worker")
_cpu = time.thread_time
#: Seconds a batch runs before the worker says where its engine is (:class:`Watch`), and how often it looks.
WATCH_SECONDS = 1.0
_STREAM = attrgetter("stream")


class Worker:
    """The worker's state and its handling of each message (see the module's docstring)."""

    def __init__(self, conn, settings: dict, results: ResultWriter) -> None:
        from air.engine.functions import import_functions

        self.conn = conn
        self._send_lock = threading.Lock()  # the watch's messages and the loop's answers share the pipe
        self.results = results  # batches' results and the answers to P: read by the main's engine thread
        functions = import_functions(settings["functions"]).copy()
        functions.register(KEY_GROUP_FUNCTION, key_group, "int", arity=2)  # row-scaled copies' start edges
        self.engine = Engine(functions=functions)
        self.functions = functions
        #: when the batch the engine is on began (time.monotonic(); None between batches): read by the watch
        self.busy_since: float | None = None
        #: CPU seconds of this loop's thread on batches, by part (``codec.CPU_PARTS``): making the batch's events from
        #: its message (and freeing them), the engine's feed, and the witnesses' encoding and the result's (with
        #: the state budget's check, and freeing the emissions): where a worker's time goes, read from /metrics,
        #: not a profiler
        self.cpu_parts = [0.0, 0.0, 0.0]
        self.rows: set[str] = set()  # row-scaled subscriptions: their witnesses go back with their events' places
        self.outbox: list = []
        self.engine.on_emit = self.outbox.append
        #: the engine's running totals as a tuple, in their fields' order (dataclasses.astuple copies each
        #: value deeply: 7 us of a 57-event batch's 85 in this process)
        self._stats = attrgetter(*(f.name for f in dataclasses.fields(self.engine.stats)))
        self.watched: set[str] = set()  # internal streams a client watches (their witnesses are encoded)
        self.encoder = WitnessEncoder(self.engine.schema, lambda owner, stream: stream in self.watched)
        self.numbered = LocalNumbers()  # the subscriptions and streams of its results, as the main process learns them
        # each of N workers holds its share of the server's state budget
        workers = max(settings["engine_workers"], 1)
        self.check = BudgetCheck(self.engine, settings["max_state_bytes"] // workers,
                                 settings["max_instances_per_subscription"],
                                 lambda sid: workers if sid in self.rows else 1)  # a row-scaled one: 1/N of its cap
        self.stream_events: dict[str, int] = {}
        self.held: deque[bytes] = deque()  # messages that wait while decisions wait for the main process
        self.waiting = False  # decisions sent: nothing but their answer is taken
        self.snapshot_child: int | None = None
        #: subscriptions or state were loaded since the last batch (frozen before it: a full collection
        #: walked 10,000 subscriptions' automata again and again, 40% of this process's time)
        self.loaded = False
        self.unchecked = False  # a backfill's engine: no state budget checks (cmd_unchecked)
        self.history = None  # a backfill's engine: the history it reads (cmd_history_open)
        self.shapes: dict[int, object] = {}  # cached CEL shapes by their number (cmd_shape)
        self.side = None  # writes the payloads of its batches beside the witness log (cmd_side_files)
        self.side_failed = False  # the last write of them failed (said once; they go in the result meanwhile)
        #: the pass of instance counts under way (``counts``), made a slice at a time between messages,
        #: and its command's number (for the answer)
        self.counting: Counting | None = None
        self.counting_number = 0
        from server.subscriptions.prepared import Preparer

        self.preparer = Preparer()

    # ------------------------------------------------------------------ the loop

    def run(self) -> None:
        conn = self.conn
        while True:
            if self.counting is not None:  # a slice of the counts when due, messages between
                wait = self.counting.next_at - time.perf_counter()
                if wait <= 0:
                    self._count_slice()
                    wait = None if self.counting is None else self.counting.next_at - time.perf_counter()
                if wait is not None and not (self.held and not self.waiting) and not conn.poll(max(wait, 0)):
                    continue
            if self.held and not self.waiting:
                msg = self.held.popleft()
            else:
                if self.snapshot_child is not None:
                    while not conn.poll(0.02):
                        self._reap()
                        if self.snapshot_child is None:
                            break
                try:
                    msg = conn.recv_bytes()
                except (EOFError, OSError):
                    return  # the main process has gone
                if self.waiting and msg[:1] != codec.APPLY:
                    self.held.append(msg)
                    continue
            tag, body = msg[:1], msg[1:]
            if tag == codec.BATCH:
                self._batch(body)
            elif tag == codec.APPLY:
                self._apply(pickle.loads(body))
            elif tag == codec.COMMAND:
                number, name, args = pickle.loads(body)
                self.loaded |= name.startswith(("add", "import"))
                if name == "stop":
                    self._reap(wait=True)
                    self.send(codec.ANSWER + pickle.dumps((number, True, None)))
                    return
                if name == "counts":  # answered when the pass is done (:class:`Counting`)
                    self._start_counting(number)
                    continue
                try:
                    value, ok = getattr(self, "cmd_" + name)(*args), True
                except Exception as exc:  # noqa: BLE001 - handed to the caller
                    value, ok = _portable(exc), False
                self.send(codec.ANSWER + pickle.dumps((number, ok, value)))
            self._reap()

    def send(self, msg: bytes) -> None:
        """One message on the pipe to the main process (from the loop, or the watch's thread)."""
        with self._send_lock:
            self.conn.send_bytes(msg)

    def _batch(self, body: bytes) -> None:
        parts, start = self.cpu_parts, _cpu()
        batch = codec.decode_batch(body)
        parts[0] += _cpu() - start
        msg = self._feed(*batch)
        start = _cpu()
        del batch  # (its events freed: their part too, 0.2 us an event)
        parts[0] += _cpu() - start
        self.results.send(msg)

    def _feed(self, fed: int, recorded: list, events: list, per_stream: dict[str, int] | None = None) -> bytes:
        """Feed a batch (``per_stream``: its events per stream, when the main process counted them);
        its result (an ``R`` message)."""
        if self.loaded:  # what was added or imported lives long: out of the collector's reach (air/engine/memory.py)
            gc.freeze()
            self.loaded = False
        eng, errors = self.engine, []
        counts = self.stream_events
        marks: list[int] | None = [] if self.rows else None  # emissions made once each event was fed
        outbox, feed = self.outbox, eng.feed
        for stream, n in (Counter(map(_STREAM, events)) if per_stream is None else per_stream).items():
            counts[stream] = counts.get(stream, 0) + n
        self.busy_since = time.monotonic()
        parts, start = self.cpu_parts, _cpu()
        try:
            for ev in events:
                try:
                    feed(ev)
                except LateEvent:
                    pass  # counted by the engine
                except Exception as exc:  # noqa: BLE001 - one event's failure must not stop the worker
                    errors.append(f"{type(exc).__name__}: {exc} (event {ev!r})")
                if marks is not None:
                    marks.append(len(outbox))
        finally:
            self.busy_since = None
        fed_at = _cpu()
        parts[1] += fed_at - start
        ems = self.outbox[:]
        del self.outbox[:]
        # (a row-scaled one's witnesses are merged by groups; the others' grouped by the numbers they keep)
        encoded = self.encoder.encode(ems, flat=not self.rows, local=self.numbered)
        places = _places(ems, marks, self.rows) if marks is not None and ems else []
        outcomes = [tuple(self.check.apply(Decision(*r[:4]))) for r in recorded]
        if any(o[1] for o in outcomes):
            self.check.after_shedding()
        result = None if self.unchecked else self.check.check(fed, counts, _OwnersOf(eng))
        if result is not None and result.decisions:
            self.waiting = True
        msg = codec.encode_result(len(events), encoded, self._stats(eng.stats), eng.epoch, errors, result,
                                  outcomes, places, self.rows, self.numbered,
                                  self._side_write if self.side is not None else None)
        del ems, encoded  # (the emissions freed: their part too)
        parts[2] += _cpu() - fed_at
        return msg

    def _side_write(self, payloads: bytes):
        """A batch's packed payloads into this worker's file beside the witness log (witside.py)."""
        try:
            ref = self.side.write(payloads)
        except OSError as exc:
            if not self.side_failed:
                log.warning("the witnesses' payloads could not be written beside the witness log (%s): "
                            "they go to the main process until they can", exc)
            self.side_failed = True
            raise
        self.side_failed = False
        return ref

    def _apply(self, decisions: list[Decision]) -> None:
        outcomes = [tuple(self.check.apply(d)) for d in decisions]
        if any(o[1] for o in outcomes):
            self.check.after_shedding()
        self.waiting = False
        self.results.send(codec.ANSWER + pickle.dumps((0, True, (outcomes, tuple(self.check.footprint)))))

    # ------------------------------------------------------------------ commands

    def cmd_declare(self, schema) -> None:
        self.engine.declare(schema)

    def cmd_add(self, owner: str, automata, rows: bool = False) -> list[str]:
        got = self.engine.add(automata, owner)
        if rows:
            self.rows.add(owner)
        return got

    def cmd_many(self, changes: list[tuple[str, tuple]]) -> None:
        """Changes the main process sent together (server/workers/mirror.py's ``together``), each made
        as if sent alone, in order; one that fails does not stop the others, and the first failure is
        raised with its place once all were made."""
        failed: list[str] = []
        first: Exception | None = None
        for name, args in changes:
            self.loaded |= name.startswith(("add", "import"))
            try:
                getattr(self, "cmd_" + name)(*args)
            except Exception as exc:  # noqa: BLE001 - said once all are made
                failed.append(f"{name} {args[0] if args else ''}".strip())
                first = first or exc
        if first is not None:
            raise EngineError(f"{len(failed)} of {len(changes)} changes failed, the first ({failed[0]}): {first}")

    def cmd_shape(self, number: int, form: str) -> None:
        """A cached CEL shape (air/cel/shapes.py), as the main process compiled it."""
        from air.cel.shapes import _Shape

        shape = _Shape.load(form)
        if shape is None:
            raise EngineError(f"shape {number} could not be loaded in the engine worker")
        self.shapes[number] = shape

    def cmd_add_bound(self, owner: str, shape: int, values: tuple, names: tuple, prefix: str | None) -> list[str]:
        """A query of a cached shape: installed from this engine's templates, as the main process installed it."""
        from air.cel.shapes import BoundQuery

        return self.preparer.add(self.engine, BoundQuery(self.shapes[shape], values, names, prefix), owner)

    def cmd_side_files(self, directory: str, worker: int) -> None:
        """Write the payloads of batches of several subscriptions to files of this worker's own
        under ``directory`` (the witness log's): the main process writes records that refer to them."""
        from server.durability.witside import SideWriter

        if self.side is not None:
            self.side.close()
        self.side = SideWriter(directory, worker)

    def cmd_remove(self, owner: str) -> None:
        self.engine.remove(owner)
        self.check.forget(owner)
        self.rows.discard(owner)
        self.numbered.forget(owner)

    def cmd_seqs(self, seqs: dict[str, int]) -> None:
        """Where the numbering of these subscriptions stands (their last seq: the main process's,
        with none of their witnesses on their way): the next of each is numbered on from it."""
        self.numbered.seed(seqs)

    def cmd_set_cap(self, sid: str, cap: tuple) -> None:
        self.check.set_cap(sid, Cap(*cap))

    def cmd_watch_streams(self, streams: set[str]) -> None:
        self.watched = set(streams)

    def cmd_state_counts(self, owner: str) -> dict[str, int]:
        return self.engine.state_counts(owner)

    def cmd_instance_count(self, owner: str | None) -> int:
        return self.engine.instance_count(owner)

    def cmd_instances(self, owner: str, pending: bool) -> dict:
        return self.engine.instances(owner, pending)

    def _start_counting(self, number: int) -> None:
        """Command ``counts`` (number ``number``): a pass over every subscription begins; the loop
        makes it a slice at a time (:meth:`_count_slice`) and answers when it is done."""
        if self.counting is not None:  # (the main process asks once a pass: an earlier one is finished first)
            self.counting.step(self.engine, float("inf"))
            self._count_answer()
        self.counting, self.counting_number = Counting(self.engine.owners), number

    def _count_slice(self) -> None:
        if self.counting.step(self.engine, COUNT_BUDGET_SECONDS):
            self._count_answer()

    def _count_answer(self) -> None:
        """The answer to ``counts``: every subscription's instance count, what counting them cost
        (seconds), the garbage collector's collections of each generation so far, and
        :attr:`cpu_parts` (/health, /metrics)."""
        done, self.counting = self.counting, None
        value = (done.counts, done.cost, [g["collections"] for g in gc.get_stats()], list(self.cpu_parts))
        self.send(codec.ANSWER + pickle.dumps((self.counting_number, True, value)))

    def cmd_stats(self) -> tuple:
        return self._stats(self.engine.stats)

    def cmd_import_snapshot(self, path: str) -> dict:
        """Load the engine's part of a snapshot file (the main process loads the rest)."""
        from server.durability.snapshot import decode

        state = decode(Path(path).read_bytes(), path)
        return self.engine.import_state(state["engine"])

    def cmd_import_state(self, state: dict) -> dict:
        return self.engine.import_state(state)

    # a backfill (server/backfill/): this process runs one subscription alone, then hands its state over
    def cmd_export_state(self, pickled: bool = False) -> dict | bytes:
        """The engine's state; ``pickled``: as pickle bytes, which the main process hands on to an
        engine worker's ``import_owner`` without reading them."""
        state = self.engine.export_state()
        return pickle.dumps(state, pickle.HIGHEST_PROTOCOL) if pickled else state

    def cmd_unchecked(self) -> None:
        """No state budget checks here: a backfill's engine (the live budget checks its state
        once handed over; a survey every 4,096 events over a growing state cost it half its time)."""
        self.unchecked = True

    # ------------------------------------------------------------------ a backfill's history

    def cmd_history_open(self, start, first: int) -> None:
        """Read the retained journal from position ``first`` (its events from event time
        ``start`` on) in this process (server/durability/history.py's HistoryReader): the
        main process pins, samples its queue and sends the journal's segments with each
        request (server/backfill/engine.py)."""
        from server.durability.history import HistoryReader, SegmentsView

        self.history = HistoryReader(SegmentsView(), start, first)

    def _history_result(self, events: list) -> tuple:
        """Feed history's ``events``; ``(events, read so far, last position read, the R message or None)``."""
        reader = self.history
        body = self._feed(reader.given, [], events) if events else None
        return len(events), reader.scanned, reader.pos, body

    def cmd_history(self, segments: list, upto: int, last, limit: int) -> tuple:
        """Feed the next ``limit`` events of history with t1 below ``last`` (HistoryReader.below)."""
        self.history.journal.segments = segments
        return self._history_result(self.history.below(upto, last, limit))

    def cmd_history_cut(self, segments: list, upto: int, queued: int) -> tuple:
        """Feed the rest of what the live engine has taken (HistoryReader.take_cut)."""
        self.history.journal.segments = segments
        return self._history_result(self.history.take_cut(upto, queued))

    def cmd_replay(self) -> None:
        """Mark every witness ``"replay": true`` (a backfill's engine: its witnesses are history's)."""
        self.encoder.replay = True

    def cmd_add_unmerged(self, owner: str, automata) -> list[str]:
        """A backfilled subscription joins: nodes of its own (air/engine/handover.py)."""
        from air.engine.handover import unmerged

        with unmerged(self.engine):
            return self.engine.add(automata, owner)

    def cmd_import_owner(self, owner: str, state: dict | bytes) -> dict:
        from air.engine.handover import import_owner

        return import_owner(self.engine, pickle.loads(state) if isinstance(state, bytes) else state, owner)

    def cmd_snapshot(self, tmp: str, main_part: dict, fork: bool) -> int | None:
        """Write a snapshot file: ``main_part`` and the engine's state. Forked:
        the child writes while the worker goes on (its end comes as ``S``);
        else written here, before the answer."""
        from server.durability import snapshot

        if not fork:
            snapshot._write_file(Path(tmp), snapshot.encode({**main_part, "engine": self.engine.export_state()}))
            return None
        if self.snapshot_child is not None:
            raise EngineError("a snapshot is still being written")
        with warnings.catch_warnings():  # (3.12+ warns of any fork beside a thread: see the module's docstring)
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
        if pid == 0:  # the child: never returns
            snapshot._child_main(Path(tmp), lambda: {**main_part, "engine": self.engine.export_state()})
        self.snapshot_child = pid
        return pid

    def _reap(self, wait: bool = False) -> None:
        pid = self.snapshot_child
        if pid is None:
            return
        done, status = os.waitpid(pid, 0 if wait else os.WNOHANG)
        if not done:
            return
        self.snapshot_child = None
        self.send(codec.SNAPSHOT + pickle.dumps(status))


class Watch:
    """Where the engine is while a batch does not end: a thread that looks, once a second,
    whether the batch the worker is on has run :data:`WATCH_SECONDS` or more, and then tells
    the main process (``W``) the registered function on the engine thread's stack and the
    innermost place (``FunctionRegistry.running_in``), again when that changes, and None once
    the batch has ended. A user function that does not return (a lookup without a timeout, a
    loop that never ends) holds its worker: /health then names the function, not only the
    worker (server/workers/restart.py). Costs nothing on a batch's path but the two stores of
    ``busy_since``."""

    def __init__(self, worker: Worker, ident: int | None = None) -> None:
        self.worker = worker
        self.ident = threading.get_ident() if ident is None else ident  # the thread that runs the loop
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cayuga-worker-watch", daemon=True)

    def start(self) -> "Watch":
        self._thread.start()
        return self

    def stop(self, timeout: float = 2.0) -> None:
        self._stop.set()
        self._thread.join(timeout)

    def look(self) -> dict | None:
        """Where the engine is, if its batch has run WATCH_SECONDS or more (else None)."""
        since = self.worker.busy_since
        if since is None or time.monotonic() - since < WATCH_SECONDS:
            return None
        return self.worker.functions.running_in(sys._current_frames().get(self.ident))

    def _run(self) -> None:
        told = None
        while not self._stop.wait(WATCH_SECONDS):
            if _terminated.is_set():  # (set by the SIGTERM handler: said here, not in the handler)
                _terminated.clear()
                log.info("engine worker (pid %d): SIGTERM ignored: the server stops its engine workers itself, "
                         "after its drain and the shutdown snapshot; to stop the server send SIGTERM to it (pid %d). "
                         "A worker ended with SIGKILL is started again from the snapshot and the journal",
                         os.getpid(), os.getppid())
            where = self.look()
            if where != told:
                try:
                    self.worker.send(codec.WHERE + pickle.dumps(where))
                except (OSError, ValueError):
                    return  # the main process has gone
                told = where


class _OwnersOf:
    """An engine's subscriptions, listed when iterated: by a state budget's check that is due, not
    every batch (a list of 10,000 a batch was 1% of the worker's CPU: BENCHMARKS.md, round 34)."""

    __slots__ = ("engine",)

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def __iter__(self):
        return iter(self.engine.owners)


def _places(ems: list, marks: list[int], rows: set[str]) -> list:
    """For each row-scaled subscription with witnesses in the batch: the place in the
    worker's batch of the event that made each of its output witnesses, in the
    encoder's order (``[sid, [place, ...]]``); the main process merges the workers' by
    them (server/workers/dispatch.py)."""
    out: dict[str, list[int]] = {}
    i = 0
    for j, em in enumerate(ems):
        while marks[i] <= j:
            i += 1
        if em[2] == "OUT" and em[3] in rows:
            out.setdefault(em[3], []).append(i)
    return [[sid, places] for sid, places in out.items()]


#: A SIGTERM came and has not been said yet: the watch thread says it, once a second at most.
_terminated = threading.Event()


def _on_sigterm(_signum, _frame) -> None:
    """SIGTERM is ignored (the server stops its workers), and said: a worker that took it
    without a word looked like one that did not hear it."""
    _terminated.set()


def _portable(exc: BaseException) -> BaseException:
    """An exception the main process can unpickle (the engine's own, or one that says what it was)."""
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:  # noqa: BLE001
        return EngineError(f"{type(exc).__name__}: {exc}")


def main(fd: int, results_fd: int) -> None:
    """The worker process's entry point: ``python -m server.workers.worker FD RESULTS_FD``,
    FD its end of the socket pair (the settings come first on it), RESULTS_FD its end
    of the results channel (server/workers/channel.py)."""
    from multiprocessing.connection import Connection

    # the main process stops it: a Ctrl-C reaches the whole process group, and so does systemd's stop
    # (SIGTERM to every process of the unit: KillMode=control-group) or kill -TERM -- -PGID; a worker
    # that ended on it was started again mid-drain and fed the whole journal (its forked snapshot
    # writers inherit this too, and finish the shutdown snapshot). A SIGTERM is said in the log
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _on_sigterm)
    from server.durability.snapshot import PR_SET_PDEATHSIG, _prctl

    if _prctl is not None:  # killed with the main process (kill -9 included): never an orphan holding state
        _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    conn = Connection(fd)
    settings, path = pickle.loads(conn.recv_bytes())
    sys.path[:] = path  # imports as the main process does (user functions: server/config.py)
    logging.basicConfig(level=str(settings.get("log_level", "info")).upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    raise_young_threshold()  # as the main process: a young collection every few hundred events otherwise
    results = ResultWriter(socket.socket(fileno=results_fd))
    worker = Worker(conn, settings, results)
    watch = Watch(worker).start()
    try:
        worker.run()
        watch.stop()
        results.close()
    except (BrokenPipeError, ConnectionResetError, EOFError):
        pass  # the main process has gone (a kill -9: this process is being killed too)
    except BaseException:  # noqa: BLE001 - said, then the main process sees the pipe close
        traceback.print_exc()
        raise


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
