#!/usr/bin/env bash
# Issue 32's many-core figures in one run, for the `device` machine (16 cores; ../shared/DEVICE.md):
#
#   bash clients/bench/device.sh "$OUT"       # there, after `source .devkit/setup`
#   SMALL=1 PYTHON=.venv/bin/python bash clients/bench/device.sh /tmp/out   # a dry run here, small loads
#
# Each benchmark's JSON goes to <name>.json and its stderr to <name>.err, log.txt says when each
# ran and its exit code, machine.txt what ran them: all in WORK (/tmp/cayuga-device by default),
# packed after each step into OUT/device.tgz, with a copy of log.txt beside it. (The device tool
# brings back only a few files from OUT: 17 loose ones were left there, and lost, on 2026-11-28.)
# At full size it takes about five minutes on 16 cores (each command is cut at LIMIT seconds, 240
# by default):
#   workers16    the 10,000 per-symbol queries at 1, 2, 4, 8, 16 workers (target: >= 10x at 16)
#                (each count's main_cpu_us_per_event and main_events_per_cpu_s: the main process's ceiling)
#   rising8      the README's Rising, row-scaled, at 1, 2, 4, 8 workers (target: >= 5x at 8); on 16 cores
#                the TCP lines are read in a reader process (receivers: auto = 1 from 4 cores)
#   rising8_threads  the same with receivers: 0 (a reader thread a connection): what the reader process gives
#   latency_1    TCP in -> WebSocket out at the default (1 worker)   (target: p99 <= 5 ms at 50K/s)
#   latency_auto the same with engine_workers: auto (the cores but one)
#   latency_write the default with durability: write (no journal fdatasync): whether the syncs make the tail
#   server       bench server --queries rising at the default, against cayuga run
#   latency_spy  latency at 10K/s again, with py-spy recording every thread of the server and its
#                worker (--idle --subprocesses, speedscope: each thread's samples in time order) from
#                the server's start: what each was doing during a stall (`worst_windows` says when)
#   main16       where the main process spends its lock at 16 workers: py-spy (--gil, raw) of
#                `cayuga serve` while `cayuga send` runs, in main16.raw (needs py-spy: carry
#                it with `bash ../shared/tools/devkit.sh py-spy`; skipped without it)
#   main_rising4 (not run by default) the same for the README's Rising row-scaled over 4 workers
#   columns16    (not run by default) the 10,000 queries at 1, 2, 4, 8, 16 workers with row_scaling off:
#                column scaling alone, every worker sent every event (one message made once for all)
# SPY_MODE (default --gil: who holds the lock) is --idle for every thread's samples, waits included
# (whether the engine thread waits for events or for the workers).
# MAINW (16) is main16's worker count.
# STEPS (names above, space-separated; default: all but main_rising4 and columns16) picks the steps, COUNTS the
# worker counts of workers16 (0,1,2,4,8,16), EVENTS its events (200000), TICKS rising's (1000000).
# BUDGET (seconds, default unlimited) stops starting benchmarks once spent, and cuts each to what is
# left, so a device run that must end by a deadline still brings back what finished.
set -u
DEST=${1:?usage: bash clients/bench/device.sh OUT_DIR}
OUT=${WORK:-/tmp/cayuga-device}
PY=${PYTHON:-python3}
LIMIT=${LIMIT:-240}
BUDGET=${BUDGET:-1000000}
mkdir -p "$OUT" "$DEST"
pack() {  # what is done so far, in two files of DEST
  tar czf "$DEST/device.tgz.part" -C "$OUT" . && mv "$DEST/device.tgz.part" "$DEST/device.tgz"
  cp "$OUT/log.txt" "$DEST/log.txt" 2>/dev/null
}
if [ "${SMALL:-0}" = 1 ]; then
  QUERIES=200 EVENTS=${EVENTS:-5000} TICKS=${TICKS:-20000} PER_RATE=1
else
  QUERIES=10000 EVENTS=${EVENTS:-200000} TICKS=${TICKS:-1000000} PER_RATE=5
fi
STEPS=${STEPS:-workers16 rising8 rising8_threads latency_1 latency_write latency_spy main16 server latency_auto}
COUNTS=${COUNTS:-0,1,2,4,8,16}
{ echo "cores: $(nproc)"; "$PY" --version; uname -a; uptime; } > "$OUT/machine.txt" 2>&1

left() {  # seconds this run may still take, at most LIMIT
  local l=$((BUDGET - SECONDS))
  [ "$l" -gt "$LIMIT" ] && l=$LIMIT
  echo "$l"
}

run() {  # run NAME [ENV=VALUE ...] -- BENCH ARGS...
  local name=$1 rc cut
  cut=$(left)
  if [ "$cut" -lt 30 ]; then echo "== $name skipped: budget spent" >> "$OUT/log.txt"; return; fi
  shift
  local envs=()
  while [ "$1" != "--" ]; do envs+=("$1"); shift; done
  shift
  echo "== $name start $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)" >> "$OUT/log.txt"
  env ${envs[@]+"${envs[@]}"} timeout "$cut" "$PY" -m clients.cli bench "$@" > "$OUT/$name.json" 2> "$OUT/$name.err"
  rc=$?
  echo "== $name rc=$rc end $(date -u +%T)" >> "$OUT/log.txt"
  pack
}

profile() {  # profile NAME BENCH ARGS...: the main process's lock holders while `cayuga send` runs
  local name=$1 spy cut bench serve i
  shift
  spy=$(command -v py-spy || find /tmp/site -name py-spy -type f 2>/dev/null | head -1)
  cut=$(left)
  if [ -z "$spy" ] || [ "$cut" -lt 60 ]; then echo "== $name skipped (py-spy '$spy', ${cut}s left)" >> "$OUT/log.txt"; return; fi
  echo "== $name start $(date -u +%T)" >> "$OUT/log.txt"
  timeout "$cut" "$PY" -m clients.cli bench "$@" > "$OUT/$name.json" 2> "$OUT/$name.err" &
  bench=$!
  for i in $(seq 1 $((cut * 20))); do pgrep -f "clients.cli send" > /dev/null && break; sleep 0.05; done
  serve=$(pgrep -f "clients.cli serve" | head -1)
  if [ -n "$serve" ]; then
    # shellcheck disable=SC2086  # (SPY_MODE: words)
    timeout 30 "$spy" record --pid "$serve" --rate 200 ${SPY_MODE:---gil} --threads --format raw --nonblocking \
      --duration "${SPY_SECONDS:-6}" --output "$OUT/$name.raw" > "$OUT/$name.spy" 2>&1
  fi
  wait "$bench"
  echo "== $name rc=$? end $(date -u +%T)" >> "$OUT/log.txt"
  pack
}

spy_latency() {  # latency_spy: see above
  local spy cut bench serve i
  spy=$(command -v py-spy || find /tmp/site -name py-spy -type f 2>/dev/null | head -1)
  cut=$(left)
  if [ -z "$spy" ] || [ "$cut" -lt 60 ]; then echo "== latency_spy skipped (py-spy '$spy', ${cut}s left)" >> "$OUT/log.txt"; return; fi
  echo "== latency_spy start $(date -u +%T)" >> "$OUT/log.txt"
  timeout "$cut" "$PY" -m clients.cli bench latency --rates 10000 --seconds "$PER_RATE" \
    > "$OUT/latency_spy.json" 2> "$OUT/latency_spy.err" &
  bench=$!
  for i in $(seq 1 $((cut * 50))); do serve=$(pgrep -f "clients.cli serve" | head -1); [ -n "$serve" ] && break; sleep 0.02; done
  if [ -n "$serve" ]; then
    timeout "$((PER_RATE + 40))" "$spy" record --pid "$serve" --rate 100 --idle --threads --subprocesses \
      --nonblocking --format speedscope --output "$OUT/latency_spy.speedscope.json" > "$OUT/latency_spy.spy" 2>&1
  fi
  wait "$bench"
  echo "== latency_spy rc=$? end $(date -u +%T)" >> "$OUT/log.txt"
  pack
}

wants() { [[ " $STEPS " == *" $1 "* ]]; }
wants workers16 && run workers16 -- workers --workers "$COUNTS" --queries "$QUERIES" --events "$EVENTS"
wants columns16 && run columns16 -- workers --workers "${COUNTS#0,}" --queries "$QUERIES" --events "$EVENTS" \
  --row-scaling off
wants rising8 && run rising8 -- workers --query rising --queries 1 --workers 1,2,4,8 --events "$TICKS"
wants rising8_threads && run rising8_threads CAYUGA_RECEIVERS=0 -- workers --query rising --queries 1 \
  --workers 1,2,4,8 --events "$TICKS"
wants latency_1 && run latency_1 -- latency --rates 10000,50000,100000 --seconds "$PER_RATE"
wants latency_write && run latency_write CAYUGA_DURABILITY=write -- latency --rates 10000,50000,100000 --seconds "$PER_RATE"
wants latency_spy && spy_latency
wants main16 && profile main16 workers --workers ${MAINW:-16} --queries "$QUERIES" --events "$EVENTS"
wants main_rising4 && profile main_rising4 workers --query rising --queries 1 --workers 4 --events "$TICKS"
wants server && run server -- server --queries rising --events "$TICKS"
wants latency_auto && run latency_auto CAYUGA_ENGINE_WORKERS=auto -- latency --rates 10000,50000,100000 --seconds "$PER_RATE"
echo "done $(date -u +%T)" >> "$OUT/log.txt"
pack
