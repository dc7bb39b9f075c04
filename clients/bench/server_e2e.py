"""The whole server, end to end, as a user runs it: ``cayuga serve``, ``cayuga
send`` and ``cayuga watch`` as separate processes on loopback, and ``cayuga
run`` over the same file in the same run.

``throughput``: writes a file of random-walk ticks (or uses ``--file``),
runs ``cayuga run`` on it with the queries, then starts a server with its
default settings (free ports, a temporary data directory), registers the same
queries over REST, starts one ``cayuga watch --count N`` per watcher (N = the
witnesses ``cayuga run`` found for that query) and times ``cayuga send FILE``
from its start until the last watcher has printed its last witness. Every
watcher's output must equal ``cayuga run``'s witnesses of its query as a
multiset; disconnections and drops are read from ``/metrics``.

``latency``: one subscription that matches every event; events are sent over
TCP at a fixed rate (in groups each millisecond), each carrying the sender's
clock, and received over a WebSocket by a process of its own that stamps each
message as it arrives; the latency of an event is receive time minus the send
time the witness carries.

    cayuga bench server --events 1000000 --queries rising              # target: server_over_offline <= 1.25
    cayuga bench server --events 1000000 --queries rising,runup        # target: >= 100K events/s, all delivered
    cayuga bench latency --rates 50000,100000 --seconds 5              # target: p99 <= 1 ms, <= 5 ms

Each prints its figure, the target (``target``) and whether it was met
(``meets_target``) in one JSON object.

``--tls on`` runs ``throughput`` with TLS on both ports (certificates made for
the run: clients/testing/tls.py, trustme), the clients given ``--cacert``;
``--tls both`` runs it without and then with TLS on the same ticks in one
invocation and reports both and what TLS cost (``tls_cost``):

    cayuga bench server --events 1000000 --queries rising --tls both
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import platform
import resource
import subprocess
import tempfile
import time
from array import array
from pathlib import Path
from typing import Callable

import msgspec

from clients.bench.runner import metric, metric_by, percentile, worker_cpu_parts
from clients.client import CayugaClient
from clients.testing import cayuga_command, cayuga_env, free_ports, write_ticks

QUERIES = Path(__file__).resolve().parent / "queries"
#: Issue 22's targets on a 2-core machine: one query, one watcher, end to end against `cayuga run` ...
TARGET_OVER_OFFLINE = 1.25
#: ... two queries, two watchers (events/s end to end) ...
TARGET_EVENTS_PER_SECOND = 100_000
#: ... and p99 latency TCP in -> WebSocket out (ms) at these rates (events/s).
TARGET_P99_MS = {50_000: 1.0, 100_000: 5.0}


@contextlib.contextmanager
def server_process(data_dir: Path, tls=None, **settings):
    """``cayuga serve`` in a child process on free loopback ports; yields a client.
    ``tls``: :class:`clients.testing.TlsFiles`, TLS on both ports (the client trusts its CA)."""
    http, tcp = free_ports(2)
    env = {**cayuga_env(), "CAYUGA_LOG_LEVEL": "warning", **(tls.env() if tls is not None else {}),
           **{f"CAYUGA_{k.upper()}": str(v) for k, v in settings.items()}}
    proc = subprocess.Popen(cayuga_command("serve", "--http-port", str(http), "--tcp-port", str(tcp), "--data-dir",
                                           str(data_dir)), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    client = CayugaClient(f"{'https' if tls is not None else 'http'}://127.0.0.1:{http}", timeout=60,
                          cacert=str(tls.ca) if tls is not None else None)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if client.health().get("status") in ("ok", "warning"):  # up (a warning is about load)
                    break
            except Exception:  # noqa: BLE001 - not up yet
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the server did not start: " + proc.stderr.read().decode()[-2000:])
            time.sleep(0.05)
        yield client
    finally:
        client.close()
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def _canonical(lines) -> list[str]:
    return sorted(json.dumps(json.loads(x), sort_keys=True) for x in lines if x.strip())


def throughput_tls(events: int = 1_000_000, symbols: int = 1000, queries: tuple[str, ...] = ("rising",),
                   watchers: int | None = None, file: str | None = None, seed: int = 1, tls: str = "off") -> dict:
    """:func:`throughput` without TLS (``off``), with it (``on``), or both on the same ticks (``both``:
    one after the other, with what TLS cost: ``tls_cost``, end-to-end time with over without)."""
    if tls != "both":
        return throughput(events, symbols, queries, watchers, file, seed, tls=tls == "on")
    with tempfile.TemporaryDirectory(prefix="cayuga-bench-") as tmp:
        if not file:
            file = str(Path(tmp) / "ticks.jsonl")
            write_ticks(Path(file), events, symbols, seed)
        plain = throughput(events, symbols, queries, watchers, file, seed)
        secure = throughput(events, symbols, queries, watchers, file, seed, tls=True)
    return {"benchmark": "server_end_to_end_tls", "plain": plain, "tls": secure,
            "tls_cost": round(secure["end_to_end_s"] / plain["end_to_end_s"], 3),
            "send_tls_cost": round(secure["send_s"] / plain["send_s"], 3),
            "server_cpu_tls_cost": round(secure["server_cpu_s"] / plain["server_cpu_s"], 3),
            "send_cpu_tls_cost": round(secure["send_cpu_s"] / plain["send_cpu_s"], 3)}


def throughput(events: int = 1_000_000, symbols: int = 1000, queries: tuple[str, ...] = ("rising",),
               watchers: int | None = None, file: str | None = None, seed: int = 1, tls: bool = False) -> dict:
    watchers = watchers or len(queries)
    perf = time.perf_counter
    with tempfile.TemporaryDirectory(prefix="cayuga-bench-") as tmp:
        tmp = Path(tmp)
        ticks = Path(file) if file else tmp / "ticks.jsonl"
        if not file:
            write_ticks(ticks, events, symbols, seed)
        events = sum(1 for line in open(ticks, "rb") if line.strip())
        qfiles = [QUERIES / f"{q}.cel" for q in queries]

        # offline, the same file and queries, whole process; one run per query for its own witnesses
        before_offline = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = perf()
        offline = subprocess.run(cayuga_command("run", *[a for q in qfiles for a in ("--query", str(q))],
                                                "--events", str(ticks), "--output", str(tmp / "offline.jsonl")),
                                 env=cayuga_env(), capture_output=True, text=True)
        offline_s = perf() - start
        after_offline = resource.getrusage(resource.RUSAGE_CHILDREN)
        offline_cpu = (after_offline.ru_utime + after_offline.ru_stime
                       - before_offline.ru_utime - before_offline.ru_stime)
        if offline.returncode != 0:
            raise RuntimeError(offline.stderr[-2000:])
        expected: dict[str, list[str]] = {}
        for line in open(tmp / "offline.jsonl", encoding="utf-8"):
            expected.setdefault(json.loads(line)["stream"], []).append(line)

        # the shipped defaults (Rising holds ~22,500 instances at the end of 1M ticks over 1,000 symbols,
        # below max_instances_per_subscription: the server evicts nothing, as `cayuga run`)
        files = None
        if tls:
            from clients.testing import make_tls_files

            files = make_tls_files(tmp / "tls")
        tls_args = ["--cacert", str(files.ca)] if files is not None else []
        with server_process(tmp / "data", tls=files) as client:
            subs = [client.subscribe(cel=q.read_text()) for q in qfiles]
            watch_procs = []
            for i in range(watchers):
                sub = subs[i % len(subs)]
                want = sum(len(expected.get(o, ())) for o in sub["outputs"])
                out = open(tmp / f"watch{i}.jsonl", "wb")
                count = ("--count", str(want)) if want else ()  # a watcher of nothing runs until the end
                p = subprocess.Popen(cayuga_command("watch", sub["id"], "--url", client.base_url, *count, *tls_args),
                                     env=cayuga_env(), stdout=out, stderr=subprocess.PIPE)
                watch_procs.append((p, out, sub, want))
            deadline = time.monotonic() + 30
            while metric(client, "cayuga_clients") < watchers:
                if time.monotonic() > deadline:
                    raise RuntimeError("the watchers did not connect")
                time.sleep(0.02)
            cpu_before = metric(client, "process_cpu_seconds_total")
            workers_before = metric(client, "cayuga_engine_worker_cpu_seconds_total")
            waits_before = metric(client, "cayuga_engine_worker_cpu_wait_seconds_total")
            thread_waits_before = metric_by(client, "cayuga_thread_cpu_wait_seconds_total", "thread")
            parts_before = metric_by(client, "cayuga_engine_worker_batch_cpu_seconds_total", "part")
            threads_before = metric_by(client, "cayuga_thread_cpu_seconds_total", "thread")
            children = resource.getrusage(resource.RUSAGE_CHILDREN)
            start = perf()
            send = subprocess.run(cayuga_command("send", str(ticks), "--url", client.base_url, *tls_args),
                                  env=cayuga_env(),
                                  capture_output=True, text=True)
            sent_s = perf() - start
            after = resource.getrusage(resource.RUSAGE_CHILDREN)  # only cayuga send ended and was waited for
            send_cpu = after.ru_utime + after.ru_stime - children.ru_utime - children.ru_stime
            done = [sent_s]
            for p, out, sub, want in watch_procs:
                if want:
                    p.wait(max(600 - (perf() - start), 1))
                    done.append(perf() - start)
            e2e_s = max(done)
            # the watchers that stop at their count have ended and been waited for: their CPU
            watched = resource.getrusage(resource.RUSAGE_CHILDREN)
            watch_cpu = watched.ru_utime + watched.ru_stime - after.ru_utime - after.ru_stime
            deadline = time.monotonic() + 10  # the server has processed everything before the idle watchers stop
            while metric(client, "cayuga_events_processed_total") < events and time.monotonic() < deadline:
                time.sleep(0.05)
            for p, out, sub, want in watch_procs:
                if not want:
                    p.terminate()
                    p.wait(10)
                out.close()
            server_cpu = metric(client, "process_cpu_seconds_total") - cpu_before
            workers_cpu = metric(client, "cayuga_engine_worker_cpu_seconds_total") - workers_before
            workers_wait = metric(client, "cayuga_engine_worker_cpu_wait_seconds_total") - waits_before
            thread_waits = {k: v - thread_waits_before.get(k, 0.0)
                            for k, v in metric_by(client, "cayuga_thread_cpu_wait_seconds_total", "thread").items()}
            parts = worker_cpu_parts(client)
            parts = {k: round(v - parts_before.get(k, 0.0), 4) for k, v in parts.items()}
            threads = {k: v - threads_before.get(k, 0.0)
                       for k, v in metric_by(client, "cayuga_thread_cpu_seconds_total", "thread").items()}
            drops = metric(client, "cayuga_client_drops_total")
            delivered = metric(client, "cayuga_witnesses_delivered_total")
            health = client.health()
        all_equal = True
        witnesses = wanted = 0
        for i, (p, _out, sub, want) in enumerate(watch_procs):
            got = (tmp / f"watch{i}.jsonl").read_text(encoding="utf-8").splitlines()
            witnesses += len(got)
            wanted += want
            exp = [x for o in sub["outputs"] for x in expected.get(o, ())]
            all_equal &= (p.returncode == 0 or not want) and _canonical(got) == _canonical(exp)
    return {
        "benchmark": "server_end_to_end",
        "tls": tls,
        "queries": list(queries),
        "watchers": watchers,
        "events": events,
        "witnesses_printed": witnesses,
        "send_exit": send.returncode,
        "send_s": round(sent_s, 3),
        # CPU seconds, less bent by the machine's load than the times: the server's from the start of
        # cayuga send until every event was processed, and cayuga send's own
        "server_cpu_s": round(server_cpu, 2),
        # its engine workers' (engine_workers; 0 with none), and the whole of `cayuga run`'s: what the
        # two cores had to find room for beside the time the run took
        "workers_cpu_s": round(workers_cpu, 2),
        # of that, their batches by part (decode: the events made from each message; engine: the feed;
        # witnesses: theirs and the result's encoding), at a count after the last batch: beside
        # offline_cpu_s, what the workers spend that `cayuga run` does not
        "workers_cpu_parts_s": parts,
        # the server's own process by thread (its threads share one interpreter lock: the engine
        # thread's, the TCP connection's, the event loop's for HTTP and the WebSocket frames)
        "server_threads_cpu_s": {k: round(v, 3) for k, v in sorted(threads.items(), key=lambda kv: -kv[1]) if v > 0},
        # how long the workers, and each of those threads, were ready to run and waited for a core (Linux's
        # schedstat): the workers' wait beside their CPU is what the two cores' sharing cost them
        "workers_cpu_wait_s": round(workers_wait, 3),
        "server_threads_cpu_wait_s": {k: round(v, 3) for k, v in sorted(thread_waits.items(), key=lambda kv: -kv[1])
                                      if round(v, 3) > 0},
        "send_cpu_s": round(send_cpu, 2),
        # the watchers' that stopped at their count (cayuga watch: WebSocket frames read, each
        # witness printed as a JSON line)
        "watchers_cpu_s": round(watch_cpu, 2),
        "offline_cpu_s": round(offline_cpu, 2),
        "end_to_end_s": round(e2e_s, 3),
        "events_per_second": round(events / e2e_s),
        "witnesses_per_second": round(witnesses / e2e_s),
        "offline_run_s": round(offline_s, 3),
        "server_over_offline": round(e2e_s / offline_s, 2),
        "witnesses_equal_offline": all_equal,
        "every_witness_delivered": all_equal and witnesses == wanted and not drops,
        # issue 22's rows: one query and one watcher within 1.25x of `cayuga run`; two queries
        # (rising,runup) and two watchers at 100K events/s or more, every witness delivered
        "target": (f"server_over_offline <= {TARGET_OVER_OFFLINE}" if len(queries) == 1 else
                   f"events_per_second >= {TARGET_EVENTS_PER_SECOND:,} and every witness delivered"),
        "meets_target": (e2e_s / offline_s <= TARGET_OVER_OFFLINE if len(queries) == 1 else
                         events / e2e_s >= TARGET_EVENTS_PER_SECOND) and all_equal and witnesses == wanted,
        "client_drops": drops,
        "delivered_total": delivered,
        "engine_build": health.get("engine_build"),
        "python": platform.python_version(),
    }


def _latency_target(rate: float, p99: float | None, all_received: bool) -> dict:
    """The p99 target of the nearest rate at or above ``rate`` (none above the highest)."""
    due = [r for r in sorted(TARGET_P99_MS) if rate <= r]
    if not due:
        return {}
    target = TARGET_P99_MS[due[0]]
    return {"target": f"p99_ms <= {target:g} (at {due[0]:,} events/s)",
            "meets_target": p99 is not None and p99 <= target and all_received}


#: A latency probe as the sender writes it: a ``Stock`` event whose ``Price`` carries the
#: sender's clock (``time.time()`` when the block was made, in seconds, exactly: ``repr``)
#: and ``Volume`` its index. The witness gives both back, with the server's ``t1``.
PROBE = b'{"stream": "Stock", "Name": "IBM", "Price": %s, "Volume": %d}\n'
#: Witnesses per WebSocket message the receiver asks for (as ``cayuga watch``).
RECEIVER_BATCH = 1000
#: The receiver gives up this many seconds after the last message (events lost).
RECEIVER_IDLE_SECONDS = 30.0


class _Probe(msgspec.Struct):
    """What the receiver reads back from a witness (the other fields are ignored)."""
    t1: float
    Price: float
    Volume: int


def _receive(url: str, n: int, time_unit_ms: float, conn) -> None:
    """The receiver, in a process of its own (nothing else holds its GIL): reads
    raw WebSocket messages, stamps each with ``time.time()`` as it arrives and
    decodes them only after the last one. Sends back, per witness, its index
    and the milliseconds from the sender's stamp to the server's ``t1`` and to
    the receiver's stamp (arrays of doubles, as bytes)."""
    import asyncio

    from websockets.asyncio.client import connect

    async def run() -> list[tuple[float, bytes]]:
        frames: list[tuple[float, bytes]] = []
        clock = time.time
        async with connect(url, max_size=None, compression=None, open_timeout=10) as ws:
            conn.send("connected")
            got = 0
            while got < n:
                try:
                    msg = await asyncio.wait_for(ws.recv(decode=False), RECEIVER_IDLE_SECONDS)
                except TimeoutError:
                    break
                frames.append((clock(), msg))
                got += msg.count(b"\n") + 1
        return frames

    frames = asyncio.run(run())
    decode = msgspec.json.Decoder(_Probe).decode_lines
    index, to_server, total = array("q"), array("d"), array("d")
    ms_per_unit = time_unit_ms
    for received, msg in frames:
        for w in decode(msg):
            index.append(w.Volume)
            to_server.append(w.t1 * ms_per_unit - w.Price * 1000.0)
            total.append((received - w.Price) * 1000.0)
    conn.send((index.tobytes(), to_server.tobytes(), total.tobytes()))


def _spread(values: list[float]) -> dict:
    ordered = sorted(values)
    return {f"p{p}_ms": round(percentile(ordered, p), 3) for p in (50, 90, 99)} | {
        "max_ms": round(ordered[-1], 3) if ordered else None}



def probe_round(client, sub_id: str, rate: float, n: int, unit_ms: float, ctx,
                clients_before: int = 0, on_sending: Callable[[float], None] | None = None
                ) -> tuple[bytes, bytes, bytes, list[float]]:
    """``n`` probes sent over TCP at ``rate`` and read back on ``sub_id``'s WebSocket by a
    receiver process of its own (started once the WebSocket is registered, so no witness
    goes unseen): the receiver's ``(index, to_server, total)`` arrays and the sender's lag.
    ``on_sending(start)``: called as the first probe is due (``time.perf_counter``)."""
    ours, theirs = ctx.Pipe()
    receiver = ctx.Process(target=_receive, args=(client.ws_url(sub_id, batch=RECEIVER_BATCH), n, unit_ms, theirs),
                           name="cayuga-latency-receiver")
    receiver.start()
    try:
        if not ours.poll(60) or ours.recv() != "connected":
            raise RuntimeError("the latency receiver did not connect")
        deadline = time.monotonic() + 30
        while metric(client, "cayuga_clients") <= clients_before:  # registered: no witness goes unseen
            if time.monotonic() > deadline or not receiver.is_alive():
                raise RuntimeError("the latency receiver's WebSocket was not registered")
            time.sleep(0.02)
        lag = _send_at_rate(client, rate, n, on_sending)
        if not ours.poll(RECEIVER_IDLE_SECONDS + 60):
            raise RuntimeError("the latency receiver sent no result")
        index, to_server, total = ours.recv()
    finally:
        receiver.join(10)
        if receiver.is_alive():
            receiver.terminate()
            receiver.join(10)
    return index, to_server, total, lag

def latency(rate: float, seconds: float, delay: float = 0.0, registering: int = 0) -> dict:
    """One subscription matching every event; p50/p90/p99 of TCP in -> WebSocket out.

    The sender (this process) and the receiver (a process of its own) share no
    GIL: each event carries its send time (:data:`PROBE`), the receiver stamps a
    message when it arrives and decodes it after the run, so neither stamp waits
    for the other side's work. Both stamps and the server's ``t1`` are
    ``time.time()``, one clock for every process of the machine, so a latency
    also splits into the part before the server stamped the event (the
    sender's write, TCP, the server's read) and the part after (queue, engine,
    delivery, the WebSocket).

    ``registering``: that many per-symbol queries (``increasing_cel``, ten steps) are
    registered in one request while the probes flow, from a process of its own (from a
    thread of this one, its JSON — 9 MB out, 46 MB back — held the sender between a
    probe's stamp and its write: 100-150 ms counted as the server's); ``registration``
    says when it ran (seconds into the round) and ``during_registration`` the latency
    of the probes sent meanwhile: what a large registration holds the live events."""
    n = int(rate * seconds)
    unit_ms = 1.0
    load = os.getloadavg()[0]  # the machine's, as the run starts: the figures depend on it
    ctx = multiprocessing.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="cayuga-bench-") as tmp:
        with server_process(Path(tmp), delay=delay, time_unit_ms=unit_ms) as client:
            sub = client.subscribe(cel="SELECT * FROM FILTER{Volume >= 0}(Stock) PUBLISH All")
            before = _pauses(client)
            registration: dict = {}
            reg = _Registrar(ctx, client, registering) if registering else None

            def sending(start: float) -> None:
                registration["sending"] = start
                reg.go()

            try:
                index, to_server, total, lag = probe_round(client, sub["id"], rate, n, unit_ms, ctx,
                                                           on_sending=sending if reg is not None else None)
            finally:
                if reg is not None:
                    registration.update(reg.result(registration.get("sending")))
            after = _pauses(client)
    index = array("q", index).tolist()
    received = len(set(index))
    total, to_server = array("d", total).tolist(), array("d", to_server).tolist()
    whole = _spread(total)
    return {
        "benchmark": "latency_tcp_to_websocket",
        "rate_events_per_s": rate,
        "events": n,
        "received": received,
        "delay_T_ms": delay,
        "load_average_1m": round(load, 2),
        **whole,
        # the same latency split at the server's stamp (t1): sender's write, TCP and the server's read ...
        "to_server": _spread(to_server),
        # ... and the queue, the engine, delivery and the WebSocket
        "in_server_and_out": _spread([a - b for a, b in zip(total, to_server)]),
        # how late the sender wrote its blocks against the schedule (its own delay, not the server's)
        "sender_late": _spread(lag),
        # where the tail sits in the run (its start, or all along), and what the server did meanwhile
        "worst_windows": _worst_windows(index, total, rate),
        "server_pauses": {k: after[k] - before[k] for k in after},
        **(_during(registration, index, total, rate) if registering else {}),
        **_latency_target(rate, whole["p99_ms"] if total else None, received == n),
        "python": platform.python_version(),
    }


#: Seconds into the probes a ``registering`` batch is sent (the probes flowing steadily by then).
REGISTER_AFTER_S = 0.5


class _Registrar:
    """The ``registering`` batch, sent by a process of its own: it makes the queries and connects
    first, then waits for :meth:`go` and registers them ``REGISTER_AFTER_S`` later."""

    def __init__(self, ctx, client: CayugaClient, n: int) -> None:
        self.ours, theirs = ctx.Pipe()
        self.go_event = ctx.Event()
        self.process = ctx.Process(target=_register_during, name="cayuga-bench-register",
                                   args=(client.base_url, client.token, n, REGISTER_AFTER_S, self.go_event, theirs))
        self.process.start()
        if not self.ours.poll(120) or self.ours.recv() != "ready":
            self.process.terminate()
            raise RuntimeError("the registering process did not get ready")

    def go(self) -> None:
        self.go_event.set()

    def result(self, sending: float | None) -> dict:
        """When it began and ended, in this process's ``time.perf_counter`` (``sending``: its time
        when :meth:`go` was called), or its error."""
        self.go_event.set()  # (the probes failed: let it end)
        try:
            self.ours.send("result")
        except OSError:  # it has ended
            pass
        got = self.ours.recv() if self.ours.poll(600) else {"error": "the registering process sent no result"}
        self.process.join(10)
        if self.process.is_alive():
            self.process.terminate()
            self.process.join(10)
        if sending is not None and "went" in got:  # its clock is time.monotonic(), the machine's, as this one's
            shift = sending - got.pop("went")
            got.update({k: got[k] + shift for k in ("began", "ended") if k in got})
        return got


def _register_during(base_url: str, token: str | None, n: int, after: float, go, conn) -> None:
    """(A process of its own: :class:`_Registrar`.) Register ``n`` per-symbol queries in one request,
    ``after`` seconds after ``go`` is set; sends back when it was set and when the request began
    and ended (``time.monotonic``), or its error. The body is made before, and the answer read
    after the parent asks for it: on two cores, making the 9 MB request and reading the 46 MB
    answer as the request went took a core from the server for 50-300 ms (the client's work, not
    the server's)."""
    from clients.testing.market import increasing_cel, symbols
    body = json.dumps({"subscriptions": [{"cel": increasing_cel(s, 10)} for s in symbols(n)]}).encode()
    out: dict = {}
    with CayugaClient(base_url, token=token, timeout=600) as c:
        conn.send("ready")
        go.wait()
        out["went"] = time.monotonic()
        time.sleep(after)
        out["began"] = time.monotonic()
        try:
            answer = c.http.post("/subscriptions/batch", content=body, headers={"content-type": "application/json"})
        except Exception as exc:  # noqa: BLE001 - reported in the result
            out["error"], answer = repr(exc), None
        out["ended"] = time.monotonic()
        conn.recv()  # the parent asks for the result: the probes are done
        if answer is not None and answer.status_code != 201:
            out["error"] = f"HTTP {answer.status_code}: {answer.text[:500]}"
        elif answer is not None and len(answer.json()["subscriptions"]) != n:
            out["error"] = f"{len(answer.json()['subscriptions'])} subscriptions registered of {n}"
    conn.send(out)


def _during(registration: dict, index: list[int], total: list[float], rate: float) -> dict:
    """The registration's span (seconds after the first probe was due) and the latency of the probes due in it."""
    start = registration.get("sending")
    began, ended = registration.get("began"), registration.get("ended")
    if start is None or began is None or ended is None:
        return {"registration": registration}
    a, b = began - start, ended - start
    inside = [t for i, t in zip(index, total) if a <= i / rate <= b]
    worst: dict[int, float] = {}  # the worst latency of the probes due in each half second of the round
    for i, t in zip(index, total):
        k = int(i / rate * 2)
        worst[k] = max(worst.get(k, 0.0), t)
    return {"registration": {"from_s": round(a, 2), "to_s": round(b, 2), "seconds": round(b - a, 2),
                             **({"error": registration["error"]} if "error" in registration else {})},
            "during_registration": {"probes": len(inside), **(_spread(inside) if inside else {})},
            "worst_ms_each_half_second": [round(worst.get(k, 0.0), 1) for k in range(max(worst, default=-1) + 1)]}


#: The tail's place in time: the run cut in windows of this many seconds of the send schedule ...
TAIL_WINDOW_S = 0.1
#: ... of which the worst are reported.
TAIL_WINDOWS = 5


def _worst_windows(index: list[int], total: list[float], rate: float) -> list[dict]:
    """The :data:`TAIL_WINDOWS` windows of the run (by when their probes were due) with the
    highest latency: when each began (seconds after the first probe), its worst latency and
    how many of its probes took over 10 ms. One stall at the start (a worker still starting)
    and a pause every few seconds (a collection, a sync) read differently."""
    windows: dict[int, list[float]] = {}
    width = rate * TAIL_WINDOW_S
    for i, ms in zip(index, total):
        windows.setdefault(int(i // width), []).append(ms)
    worst = sorted(windows.items(), key=lambda kv: -max(kv[1]))[:TAIL_WINDOWS]
    return [{"at_s": round(w * TAIL_WINDOW_S, 1), "worst_ms": round(max(v), 3),
             "over_10ms": sum(1 for x in v if x > 10.0)} for w, v in worst]


def _pauses(client) -> dict[str, float]:
    """What in the server can stop it for a while, so far (from ``/metrics``): full
    collections of the cyclic garbage collector, journal syncs, and those of over 50 ms."""
    from prometheus_client.parser import text_string_to_metric_families

    buckets, out = {}, {"gc_full_collections": 0.0, "journal_syncs": 0.0, "journal_syncs_over_50ms": 0.0}
    for family in text_string_to_metric_families(client.http.get("/metrics").text):
        for sample in family.samples:
            if sample.name == "python_gc_collections_total" and sample.labels.get("generation") == "2":
                out["gc_full_collections"] = sample.value
            elif sample.name == "cayuga_journal_sync_seconds_bucket":
                buckets[sample.labels["le"]] = sample.value
    if buckets:
        out["journal_syncs"] = buckets["+Inf"]
        out["journal_syncs_over_50ms"] = buckets["+Inf"] - buckets.get("0.05", 0.0)
    return out


def _send_at_rate(client: CayugaClient, rate: float, n: int, on_start: Callable[[float], None] | None = None
                  ) -> list[float]:
    """Write ``n`` probes over TCP at ``rate`` a second: every millisecond the
    ones due by then, in one write, stamped just before it. Returns how late
    each write was against the schedule (ms)."""
    clock, perf = time.time, time.perf_counter
    lag: list[float] = []
    with client.sender() as s:
        start = perf()
        if on_start is not None:
            on_start(start)
        i = 0
        while i < n:
            now = perf()
            due = min(n, int((now - start) * rate) + 1)
            if due > i:
                stamp = repr(clock()).encode()
                s.send_lines(b"".join([PROBE % (stamp, k) for k in range(i, due)]), due - i)
                lag.append((now - start - i / rate) * 1000.0)
                i = due
            time.sleep(0.001)
    return lag
