"""``cayuga bench ...`` runs and prints one JSON object with the agreed keys
(the numbers themselves are measured in BENCHMARKS.md, never asserted here)."""

from __future__ import annotations

import json
import os

import pytest
from click.testing import CliRunner

from clients.bench import rows
from clients.cli import main
from server.config import Settings
from server.workers.dispatch import batch_limit

KEYS = {"events_per_second", "events", "subscriptions", "matches", "peak_rss_mb", "wall_s"}


@pytest.mark.parametrize("args, events, subs", [
    (["edbt", "--template", "LinearStat", "--subscriptions", "200", "--events", "300"], 300, 200),
    (["edbt", "--template", "NonDeterministicAgg", "--subscriptions", "100", "--events", "200", "--no-index",
      "--no-merge"], 200, 100),
    (["edbt", "--template", "Filter", "--subscriptions", "100", "--events", "200", "--no-fr-index",
      "--no-instance-index"], 200, 100),
    (["rise", "--events", "2000", "--symbols", "20"], 2000, 1),
    (["runup", "--events", "2000", "--symbols", "20"], 2000, 1),
    (["increasing", "--queries", "20", "--events", "2000"], 2000, 20),
])
def test_bench_command_prints_one_json_summary(args, events, subs):
    result = CliRunner().invoke(main, ["bench", *args])
    assert result.exit_code == 0, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1
    summary = json.loads(lines[0])
    assert KEYS <= set(summary)
    assert summary["events"] == events and summary["subscriptions"] == subs
    assert summary["eval_errors"] == 0


def test_increasing_matches_every_event_after_nine_of_its_symbol():
    result = CliRunner().invoke(main, ["bench", "increasing", "--queries", "5", "--events", "500"])
    summary = json.loads(result.output)
    assert summary["matches"] == 500 - 5 * 9


def test_switches_reach_the_engine():
    result = CliRunner().invoke(main, ["bench", "edbt", "--subscriptions", "50", "--events", "50", "--no-merge",
                                       "--no-fr-index"])
    assert json.loads(result.output)["options"] == {"merge": False, "an_index": True, "instance_index": True,
                                                    "fr_index": False, "sorted_index": True}


def test_sorted_index_switch_reaches_the_engine():
    result = CliRunner().invoke(main, ["bench", "rise", "--events", "500", "--symbols", "5", "--no-sorted-index"])
    assert json.loads(result.output)["options"]["sorted_index"] is False


def test_increasing_sweep_prints_one_summary_per_k():
    result = CliRunner().invoke(main, ["bench", "increasing-sweep", "--ks", "2,5", "--events", "300"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output)
    assert KEYS <= set(summary) and "flatness" in summary
    assert [r["subscriptions"] for r in summary["sweep"]] == [2, 5]
    assert [r["matches"] for r in summary["sweep"]] == [300 - 2 * 9, 300 - 5 * 9]


def test_floor_prints_one_summary_per_k():
    result = CliRunner().invoke(main, ["bench", "floor", "--ks", "2,5", "--events", "300"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output)
    assert {"events_per_second", "flatness", "sweep"} <= set(summary)
    assert [r["matches"] for r in summary["sweep"]] == [300 - 2 * 9, 300 - 5 * 9]


@pytest.mark.parametrize("k", [1, 3, 40])
def test_floor_loop_finds_what_the_engine_finds(k):
    """The floor loop is only a fair yardstick if it does the query's work:
    on prices that fall as well as rise its matches equal the engine's."""
    from air.engine import Engine
    from clients.bench.floor import run_floor
    from clients.testing import STOCK, increasing_query, random_walk, symbols

    events = random_walk(k, 3000, seed=7, down=0.02, up=0.03)
    eng = Engine()
    eng.declare(STOCK)
    for sym in symbols(k):
        eng.add(increasing_query(sym, 4), owner=sym)
    engine_matches = len(eng.run(events))
    floor_matches, _ = run_floor(events, 4)
    assert engine_matches == floor_matches > 0


@pytest.mark.parametrize("k", [1, 4, 50])
def test_rise_floor_loop_finds_the_engines_witnesses(k):
    """The rise floor is a fair yardstick only if it does the query's work: its
    witnesses are the engine's, value for value (prices that fall as well as
    rise, repeated prices, several symbols)."""
    from air.engine import Engine
    from clients.bench.floor import run_rise_floor
    from clients.testing import STOCK, random_walk
    from clients.testing.market import rise_query

    events = random_walk(k, 3000, seed=5, down=0.03, up=0.04)
    events += [type(events[0])("Stock", ev.values, ev.t0 + 3000, ev.t1 + 3000) for ev in events[:40]]  # repeats
    eng = Engine()
    eng.declare(STOCK)
    eng.add(rise_query(), owner="q")
    engine = sorted((em.event.values[0], em.event.values[1], em.event.values[2], em.event.t0, em.event.t1)
                    for em in eng.run(events))
    floor, _ = run_rise_floor(events)
    assert engine == sorted(floor) and len(engine) > 100


def test_rise_floor_prints_both_rates_per_symbol_count():
    result = CliRunner().invoke(main, ["bench", "rise-floor", "--symbols", "2,30", "--events", "2000", "--rounds", "1"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output)
    assert [r["symbols"] for r in summary["runs"]] == [2, 30]
    for r in summary["runs"]:
        assert r["witnesses"] > 0 and r["engine_events_per_second"] > 0 and r["floor_events_per_second"] > 0


def test_churn_replaces_subscriptions_while_events_flow():
    result = CliRunner().invoke(main, ["bench", "churn", "--subscriptions", "30", "--events", "600", "--every", "20"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output)
    assert KEYS <= set(summary)
    assert summary["churn"]["removed"] == 30 and summary["eval_errors"] == 0
    assert summary["network"]["states"] == 30 * 3  # as many subscriptions as before, each of three states


def test_server_scale_registers_sends_and_restores():
    from clients.bench.server_scale import run

    out = run(20, 300, timeout=60)
    assert out["restored"] == 20 and out["processed_all"]
    assert out["GET /subscriptions"]["bytes"] > 0


def test_pause_names_the_process_to_attach_a_profiler_to_before_the_loop():
    result = CliRunner().invoke(main, ["bench", "increasing", "--queries", "3", "--events", "50", "--pause", "0.01"])
    assert result.exit_code == 0, result.output
    assert f"pid {os.getpid()}" in result.stderr
    assert json.loads(result.stdout)["events"] == 50


def test_server_end_to_end_matches_cayuga_run_through_real_processes():
    """cayuga serve, send and watch as separate processes; the watchers' output
    equals cayuga run's on the same file, nobody is cut off."""
    result = CliRunner().invoke(main, ["bench", "server", "--events", "3000", "--symbols", "20",
                                       "--queries", "rising,all", "--watchers", "3"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert out["witnesses_equal_offline"] is True and out["client_drops"] == 0
    assert out["events"] == 3000 and out["send_exit"] == 0
    assert out["witnesses_printed"] > 3000  # all matches every event; two watchers watch it
    assert out["delivered_total"] == out["witnesses_printed"]
    # the worker's batches by part, each something, together within its whole CPU time
    parts = out["workers_cpu_parts_s"]
    assert set(parts) == {"decode", "engine", "witnesses"} and all(v > 0 for v in parts.values())
    assert sum(parts.values()) <= out["workers_cpu_s"] + 0.05
    # and the server's own process by thread: its engine thread's and the (ended) TCP connection's among them
    assert {"cayuga-engine", "cayuga-tcp"} <= set(out["server_threads_cpu_s"])
    # and the CPU of the clients beside it on the same cores (the watchers that stopped at their count),
    # and how long the workers and those threads waited for a core (zero or more: seconds, not a guess)
    assert out["watchers_cpu_s"] > 0 and out["workers_cpu_wait_s"] >= 0
    assert all(v > 0 for v in out["server_threads_cpu_wait_s"].values())


def test_server_two_queries_two_watchers_says_every_witness_was_delivered(tmp_path):
    """Issue 22's row: Rising and the run-up FOLD query (clients/bench/queries/runup.cel),
    one watcher each; the summary names the target and whether it was met, and
    clients/bench/rows.py reads it as issue 32's row."""
    result = CliRunner().invoke(main, ["bench", "server", "--events", "4000", "--symbols", "20",
                                       "--queries", "rising,runup"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert out["queries"] == ["rising", "runup"] and out["watchers"] == 2
    assert out["witnesses_equal_offline"] is True and out["every_witness_delivered"] is True
    assert out["delivered_total"] == out["witnesses_printed"] > 0
    assert out["target"].startswith("events_per_second >= 100,000") and isinstance(out["meets_target"], bool)
    (tmp_path / "server_two_1.json").write_text(result.output)
    two = rows.summarize(tmp_path)[1]
    assert two.figures == [f"{out['events_per_second']:,}"] and two.met == [out["events_per_second"] >= 100_000]


def test_runup_cel_is_the_runup_benchmarks_query(tmp_path):
    """runup.cel says in CEL what `cayuga bench runup` builds as an automaton: the same
    witnesses on the same ticks."""
    from air.engine import Engine
    from clients.bench.server_e2e import QUERIES
    from clients.testing import write_ticks
    from clients.testing.market import STOCK, random_walk, runup_query

    ticks = tmp_path / "ticks.jsonl"
    write_ticks(ticks, 3000, 10, seed=3)
    eng = Engine()
    eng.declare(STOCK)
    got = []
    eng.on_emit = lambda em: got.append((em.event.t0, em.event.t1, *em.event.values))
    eng.add(runup_query(), owner="bench")
    for ev in random_walk(10, 3000, 3):
        eng.feed(ev)
    eng.flush()
    out = tmp_path / "out.jsonl"
    result = CliRunner().invoke(main, ["run", "--query", str(QUERIES / "runup.cel"), "--events", str(ticks),
                                       "--output", str(out)])
    assert result.exit_code == 0, result.output
    cel = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(cel) == len(got) > 0
    assert sorted((w["t0"], w["t1"], w["Name"], w["First"], w["Last"], w["Count"]) for w in cel) == sorted(got)


def test_latency_reports_percentiles_of_every_event(monkeypatch, tmp_path):
    monkeypatch.setattr(os, "getloadavg", lambda: (1.234, 5.0, 6.0))  # the machine's, read as the run starts
    result = CliRunner().invoke(main, ["bench", "latency", "--rates", "400", "--seconds", "0.5"])
    assert result.exit_code == 0, result.output
    (run,) = json.loads(result.output)["runs"]
    assert run["received"] == run["events"] == 200
    assert 0 < run["p50_ms"] <= run["p99_ms"] <= run["max_ms"]
    assert run["target"] == "p99_ms <= 1 (at 50,000 events/s)" and isinstance(run["meets_target"], bool)
    # the latency split at the server's stamp (t1), each part from every witness, and the sender's own delay
    for part in ("to_server", "in_server_and_out", "sender_late"):
        assert run[part]["p50_ms"] <= run[part]["p99_ms"] <= run[part]["max_ms"], part
    assert run["to_server"]["max_ms"] <= run["max_ms"] and run["in_server_and_out"]["max_ms"] <= run["max_ms"]
    assert run["load_average_1m"] == 1.23  # the machine's load as the run started, printed beside its figures
    # where the tail sits: the worst windows of the run, the worst first, each inside the run and its figures
    windows = run["worst_windows"]
    assert 1 <= len(windows) <= 5 and windows[0]["worst_ms"] == run["max_ms"]
    assert all(0 <= w["at_s"] < 0.5 for w in windows) and windows == sorted(windows, key=lambda w: -w["worst_ms"])
    # and what the server did meanwhile: at the default durability (fsync), the journal was synced
    assert run["server_pauses"]["journal_syncs"] >= 1 and run["server_pauses"]["gc_full_collections"] >= 0
    # clients/bench/rows.py judges the run at 1 worker and only shows the one in-process beside it
    at_50k = result.output.replace('"rate_events_per_s": 400', '"rate_events_per_s": 50000')
    (tmp_path / "latency_1_1.json").write_text(at_50k)
    (tmp_path / "latency_0_1.json").write_text(at_50k)
    at50k = rows.summarize(tmp_path)[4]
    assert at50k.figures == at50k.beside == [f"{run['p99_ms']:.2f} (p50 {run['p50_ms']:.2f})"]
    assert at50k.met == [run["p99_ms"] <= 1.0]


def test_worst_windows_find_a_stall_and_when_it_was():
    from clients.bench.server_e2e import _worst_windows

    rate = 1000.0  # 100 probes a window
    total = [0.5] * 1000
    total[450:470] = [40.0 - k for k in range(20)]  # a stall 0.45 s in
    (first, *rest) = _worst_windows(list(range(1000)), total, rate)
    assert first == {"at_s": 0.4, "worst_ms": 40.0, "over_10ms": 20} and len(rest) == 4
    assert all(w["worst_ms"] == 0.5 and w["over_10ms"] == 0 for w in rest)


def test_latency_while_registering_says_when_the_batch_ran_and_the_latency_meanwhile(monkeypatch):
    """The batch goes from a process of its own (from a thread of the sender's, its JSON held the
    sender between a probe's stamp and its write)."""
    from multiprocessing.context import SpawnProcess

    from clients.bench import server_e2e

    started = []
    start = SpawnProcess.start

    def spying(self):
        started.append(self.name)
        start(self)

    monkeypatch.setattr(SpawnProcess, "start", spying)
    monkeypatch.setattr(server_e2e, "REGISTER_AFTER_S", 0.2)
    result = CliRunner().invoke(main, ["bench", "latency", "--rates", "400", "--seconds", "2", "--registering", "60"])
    assert result.exit_code == 0, result.output
    assert sorted(started) == ["cayuga-bench-register", "cayuga-latency-receiver"]
    (run,) = json.loads(result.output)["runs"]
    assert run["received"] == run["events"] == 800
    reg, during = run["registration"], run["during_registration"]
    assert "error" not in reg and 0.2 <= reg["from_s"] < reg["to_s"]
    # (each figure is rounded from the raw one: a difference of rounded figures is off by a last digit at most)
    assert abs(reg["seconds"] - (reg["to_s"] - reg["from_s"])) <= 0.0101
    assert 0 < during["probes"] <= 800 and during["max_ms"] <= run["max_ms"]
    halves = run["worst_ms_each_half_second"]
    assert len(halves) == 4 and abs(max(halves) - run["max_ms"]) <= 0.0501  # (21.95: 22.0 here, 21.9 rounded again)


def test_latency_receiver_is_a_process_of_its_own(monkeypatch):
    """The receiver's stamps never wait for the sender's GIL (nor the sender's for the
    receiver's JSON decoding): it runs in its own process, stamps raw messages and
    decodes them after the run; each witness carries its send time."""
    import threading
    from multiprocessing.context import SpawnProcess

    from clients.bench import server_e2e

    started = []
    start = SpawnProcess.start

    def spying(self):
        started.append(self)
        start(self)

    monkeypatch.setattr(SpawnProcess, "start", spying)
    threads = threading.active_count()
    run = server_e2e.latency(200.0, 0.5)
    assert run["received"] == run["events"] == 100
    assert [p.name for p in started] == ["cayuga-latency-receiver"] and started[0].exitcode == 0
    assert threading.active_count() == threads  # no reader thread left behind in this process


def test_bench_scaling_prints_its_ratio():
    """The figure moved out of tests/engine/test_scaling.py: printed, never judged."""
    result = CliRunner().invoke(main, ["bench", "scaling", "--small", "20", "--large", "200", "--rounds", "1"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output)
    assert summary["benchmark"] == "remove_and_add_scaling" and (summary["small"], summary["large"]) == (20, 200)
    assert summary["ratio"] > 0 and len(summary["ratios"]) == 1


@pytest.mark.parametrize("args, target", [
    (["rise", "--events", "500", "--symbols", "5"], "events_per_second >= 1,200,000"),
    (["increasing", "--queries", "5", "--events", "500"], "events_per_second >= 100,000"),
])
def test_engine_rows_name_their_target(args, target):
    """Issue 22's engine rows print the figure, the target and whether it was met, in one summary."""
    summary = json.loads(CliRunner().invoke(main, ["bench", *args]).output)
    assert summary["target"] == target
    assert summary["meets_target"] is (summary["events_per_second"] >= int(target.split()[-1].replace(",", "")))


def test_backfill_times_a_subscription_over_retained_ticks_against_cayuga_run():
    """Issue 36's rows on a few ticks: the backfill's witnesses equal cayuga run's (their replay
    mark aside), the retained bytes per event, and the live path's percentiles with and without a
    backfill; the figures themselves go to BENCHMARKS.md."""
    result = CliRunner().invoke(main, ["bench", "backfill", "--events", "3000", "--symbols", "20",
                                       "--rate", "400", "--seconds", "0.5"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert out["witnesses_equal_offline"] is True and out["witnesses_offline"] > 0
    assert out["witnesses_replayed"] == out["witnesses_offline"] == out["backfill"]["witnesses"]
    assert out["backfill"]["state"] == "live" and out["backfill"]["events_done"] == 3000
    assert out["retained_bytes_per_event"] > 0 and out["retained"]["bytes"] > 0
    for run in (out["latency_without_backfill"], out["latency_during_backfill"]):
        assert run["received"] == run["events"] == 200
        assert 0 < run["p50_ms"] <= run["p99_ms"] <= run["max_ms"]
    assert out["target"] == "backfill_over_offline >= 0.8 and p99_during_over_without <= 2"
    assert isinstance(out["meets_target"], bool) and isinstance(out["backfill_ran_throughout"], bool)


def test_worker_path_times_both_halves_and_logs_every_witness_the_worker_made():
    """``cayuga bench worker-path``: the worker's batches, then the main process's side of their results;
    the witness log gets every witness the increasing queries make (each symbol's 10th rising quote on)."""
    result = CliRunner().invoke(main, ["bench", "worker-path", "--queries", "40", "--events", "30000"])
    assert result.exit_code == 0, result.output
    (line,) = result.output.strip().splitlines()
    summary = json.loads(line)
    assert summary["worker_cpu_s"] >= 0 and summary["main_cpu_s"] >= 0 and summary["result_bytes"] > 0
    # the payloads of batches of several subscriptions went beside the witness log, as a server's workers
    # write them (server/durability/witside.py), not through the result
    assert summary["side_bytes"] > 0 and summary["log_bytes"] > 0
    from clients.testing.market import increasing_stream, symbols

    names = set(symbols(1000)[:40])
    seen: dict[str, int] = {}
    for e in increasing_stream(1000, 30000, 1):
        seen[e.values[0]] = seen.get(e.values[0], 0) + 1
    assert summary["witnesses"] == sum(max(n - 9, 0) for s, n in seen.items() if s in names) > 0


def test_worker_path_rising_logs_cayuga_runs_witnesses_and_times_each_part():
    """``--workload rising``: the README's Rising on the worker over bench server's random walk;
    the witness log gets as many witnesses as the engine makes of the same events alone, the
    worker's batches are timed by part, and cayuga run's loop over the same events beside them."""
    from air.engine import Engine
    from air.cel import compile_cel
    from clients.bench.workerpath import QUERIES
    from clients.testing.market import STOCK, random_walk

    result = CliRunner().invoke(main, ["bench", "worker-path", "--workload", "rising", "--events", "5000"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output.strip().splitlines()[-1])
    eng = Engine()
    eng.declare(STOCK)
    eng.add(compile_cel((QUERIES / "rising.cel").read_text(), {"Stock": STOCK}).automata, owner="q")
    made: list = []
    eng.on_emit = made.append
    for ev in random_walk(1000, 5000, 1):
        eng.feed(ev)
    eng.flush()
    assert summary["workload"] == "rising" and summary["queries"] == 1
    assert summary["witnesses"] == sum(1 for m in made if m.kind == "OUT") > 0
    assert set(summary["worker_cpu_parts_s"]) == {"decode", "engine", "witnesses"}
    assert summary["offline_loop_cpu_s"] > 0 and summary["worker_cpu_parts_s"]["engine"] > 0
    assert set(summary["offline_loop_parts_s"]) == {"engine", "witnesses"}


def test_ingest_path_takes_every_tick_through_the_queue_and_journal_once():
    """``cayuga bench ingest-path``: the receivers' and the engine thread's half of each tick at the
    shipped settings -- each block one journal record, every tick taken out once and encoded for a
    worker -- with each step's CPU per event adding up to the whole."""
    result = CliRunner().invoke(main, ["bench", "ingest-path", "--events", "20000"])
    assert result.exit_code == 0, result.output
    (line,) = result.output.strip().splitlines()
    out = json.loads(line)
    assert out["events"] == out["events_taken"] == 20000
    assert out["blocks"] == out["journal_records"] > 1  # (20,000 ticks are more than one 256 KiB read)
    assert out["batch_size"] == 1024 and out["batch_bytes"] > 20000
    steps = out["us_per_event"]
    assert set(steps) == {"decode", "limits", "queue_and_journal", "take", "encode", "all"}
    assert all(v >= 0 for v in steps.values()) and steps["all"] > 0
    assert abs(sum(v for k, v in steps.items() if k != "all") - steps["all"]) < 0.01
    assert out["events_per_core_s"] > 0
    assert out["replay_us_per_event"] > 0 and 10 < out["journal_bytes_per_event"] < 100  # (read back: every tick)


def test_ingest_path_crossed_times_what_a_reader_process_would_leave_to_the_main_process():
    """``--crossed`` (the receivers' stage 1): each block's events cross as a worker's batch
    columns and are made again before they are queued; the main process's part is the
    crossing's decoding, the queue and journal, the take and the encoding, not the lines'."""
    result = CliRunner().invoke(main, ["bench", "ingest-path", "--events", "20000", "--crossed"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert out["events"] == out["events_taken"] == 20000 and out["blocks"] == out["journal_records"]
    steps, crossed = out["us_per_event"], out["crossed_us_per_event"]
    assert set(crossed) == {"reader_encode", "crossed_decode"} and all(v > 0 for v in crossed.values())
    main_part = crossed["crossed_decode"] + steps["queue_and_journal"] + steps["take"] + steps["encode"]
    assert abs(out["main_us_per_event"] - main_part) < 0.01
    assert out["main_events_per_core_s"] > 0


def test_ingest_path_blocks_end_at_line_ends():
    from clients.bench.ingestpath import blocks_of

    data = b"".join(b"line %d\n" % i for i in range(1000))
    blocks = blocks_of(data, 100)
    assert b"".join(blocks) == data and len(blocks) > 1
    assert all(b.endswith(b"\n") and len(b) <= 100 for b in blocks)
    assert blocks_of(b"no newline at the end", 8) == [b"no newline at the end"]


def test_bench_workers_says_each_counts_rate_and_the_cores_each_process_used(tmp_path):
    """``cayuga bench workers`` (what clients/bench/device.sh runs at 1 to 16 workers): a
    server per count; each run's events/s, over the first's, and the cores the server's
    process and each worker used while the events went through, and the main process's CPU
    an event with the events/s one core of it would carry at that cost (where the ceiling is);
    with ``--watchers``, what the WebSocket clients got: each of its subscription's witnesses."""
    result = CliRunner().invoke(main, ["bench", "workers", "--workers", "1,2", "--queries", "40",
                                       "--events", "4000", "--symbols", "40", "--watchers", "2"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.output.strip().splitlines()[-1])
    assert [r["engine_workers"] for r in out["runs"]] == [1, 2] and out["runs"][0]["over_first"] == 1.0
    assert out["runs"][0]["taking_over_first"] == 1.0
    for r in out["runs"]:
        assert r["status"] == "ok" and r["events_per_second"] > 0 and sum(r["per_worker_subscriptions"]) == 40
        # and from the first event the server took (the sender's start left out): no longer, no slower
        assert 0 < r["taking_s"] <= r["seconds"] and r["taking_events_per_second"] > 0
        assert r["main_cores"] >= 0 and len(r["worker_cores"]) == r["engine_workers"]
        assert all(c >= 0 for c in r["worker_cores"])
        assert r["reader_cores"] is None or r["reader_cores"] >= 0  # (a reader process: receivers 1)
        assert len(r["worker_waiting"]) == r["engine_workers"] and all(c >= 0 for c in r["worker_waiting"])
        # the main process's CPU an event, and the events/s a core of it carries at that cost
        assert r["main_cpu_us_per_event"] >= 0
        if r["main_cpu_us_per_event"]:
            assert abs(r["main_cpu_us_per_event"] * r["main_events_per_cpu_s"] / 1e6 - 1) < 0.01
        else:  # (no CPU time counted: nothing to divide by)
            assert r["main_events_per_cpu_s"] is None
        assert r["watched"] == r["watched_made"] > 0  # (100 quotes a symbol: some rise ten times in a row)
        # the engine thread's batches: at least an event each, at most the loop's limit (1,024 a worker)
        assert 1 <= r["events_per_batch"] <= batch_limit(Settings().batch_size, r["engine_workers"])
        # the workers' batches by part, an event (what a device run shows beside main_cpu_us_per_event)
        assert set(r["workers_us_per_event"]) == {"decode", "engine", "witnesses"}
        assert r["workers_us_per_event"]["engine"] > 0
        # and the main process's by thread: the engine thread and the (ended) connection's among them
        threads = r["main_threads_us_per_event"]
        assert {"cayuga-engine", "cayuga-tcp"} <= set(threads) and all(v > 0 for v in threads.values())
    (tmp_path / "workers10k.json").write_text(out_line := result.output.strip().splitlines()[-1])
    many = rows.summarize(tmp_path)[3]  # clients/bench/rows.py: 2 over 1, issue 32's row
    one, two = json.loads(out_line)["runs"]
    assert many.met == [two["events_per_second"] / one["events_per_second"] >= 1.5] and len(many.figures) == 1


def test_rows_table_says_per_row_in_how_many_runs_the_target_was_met(tmp_path, capsys):
    """clients/bench/rows.py over what clients/bench/rows.sh leaves: each run's figure, met in
    how many; a run that failed (no JSON) is left out, a row with no run says so, and a run
    whose witnesses did not all arrive is not met whatever its speed."""
    for i, (ratio, ok) in enumerate([(0.95, True), (1.2, True), (0.9, False)], 1):
        (tmp_path / f"server_rising_{i}.json").write_text(
            json.dumps({"server_over_offline": ratio, "every_witness_delivered": ok}))
    (tmp_path / "server_rising_4.json").write_text("")  # a run cut off before it printed
    (tmp_path / "workers10k.json").write_text(json.dumps({"runs": [
        {"engine_workers": 1, "events_per_second": 20000}, {"engine_workers": 2, "events_per_second": 32000},
        {"engine_workers": 1, "events_per_second": 20000}, {"engine_workers": 2, "events_per_second": 28000}]}))
    (tmp_path / "w2_server_two_1.json").write_text(json.dumps({"events_per_second": 116_294,
                                                                "every_witness_delivered": True}))
    rising, two, two_w2, many, at50k, at100k = rows.summarize(tmp_path)
    assert two_w2.figures == ["116,294"] and two_w2.verdict() == "yes"  # (not read as a run at the default)
    assert rising.figures == ["0.95", "1.20", "0.90 (witnesses missing)"] and rising.verdict() == "in 1 of 3"
    assert many.figures == ["20,000 -> 32,000 (1.60)", "20,000 -> 28,000 (1.40)"] and many.verdict() == "in 1 of 2"
    assert two.verdict() == at50k.verdict() == "not measured"
    assert rows.main([str(tmp_path)]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[0] == "| row | runs | target | met |" and len(printed) == 8
    assert "| 0.95, 1.20, 0.90 (witnesses missing) | <= 1.0 | in 1 of 3 |" in printed[2]
    assert rows.main([str(tmp_path / "nowhere")]) == 2
