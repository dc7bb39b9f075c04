#!/usr/bin/env bash
# Issue 32's 2-core rows in one run, on this kind of machine (2 cores), at the defaults (1 engine
# worker), with the in-process engine (engine_workers: 0) measured beside the latency in the same
# minutes; then the table against the targets (python -m clients.bench.rows):
#
#   bash clients/bench/rows.sh /tmp/rows              # about 6 minutes on 2 cores (2026-12-03)
#   SMALL=1 bash clients/bench/rows.sh /tmp/rows      # a dry run, small loads (the figures mean nothing)
#
# Each benchmark's JSON goes to OUT/<name>.json and its stderr to OUT/<name>.err; OUT/log.txt says
# when each ran, the load average before it, and its exit code. Run it with nothing else running:
# every row shares the two cores with the sender and the watchers.
#   server_rising_{1,2,3}  bench server --queries rising (target: server / cayuga run <= 1.0)
#   server_two_{1,2}       bench server --queries rising,runup, 2 watchers (>= 100K events/s)
#   w2_server_two_{1,2}    the same at engine_workers 2 (a query a worker), each after one at 1
#   workers10k             10,000 per-symbol queries at engine_workers 1,2,1,2 (2 over 1 >= 1.5)
#   latency_{1,0}_{1,2}    bench latency at 50K and 100K events/s, 1 worker and in-process,
#                          alternating (p99 <= 1 ms at 50K, <= 5 ms at 100K at 1 worker)
set -u
OUT=${1:?usage: bash clients/bench/rows.sh OUT_DIR}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
if [ "${SMALL:-0}" = 1 ]; then
  QUERIES=200 EVENTS=5000 TICKS=20000 PER_RATE=1
else
  QUERIES=10000 EVENTS=200000 TICKS=1000000 PER_RATE=5
fi
{ echo "cores: $(nproc)"; "$PY" --version; uname -a; uptime; git -C "$(dirname "$0")" rev-parse --short HEAD 2>/dev/null; } \
  > "$OUT/machine.txt" 2>&1

run() {  # run NAME [ENV=VALUE ...] -- BENCH ARGS...
  local name=$1 rc
  shift
  local envs=()
  while [ "$1" != "--" ]; do envs+=("$1"); shift; done
  shift
  echo "== $name start $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)" >> "$OUT/log.txt"
  env ${envs[@]+"${envs[@]}"} "$PY" -m clients.cli bench "$@" > "$OUT/$name.json" 2> "$OUT/$name.err"
  rc=$?
  echo "== $name rc=$rc end $(date -u +%T)" >> "$OUT/log.txt"
}

for i in 1 2; do
  run "latency_1_$i" -- latency --rates 50000,100000 --seconds "$PER_RATE"
  run "latency_0_$i" CAYUGA_ENGINE_WORKERS=0 -- latency --rates 50000,100000 --seconds "$PER_RATE"
done
for i in 1 2 3; do
  run "server_rising_$i" -- server --queries rising --events "$TICKS"
done
for i in 1 2; do
  run "server_two_$i" -- server --queries rising,runup --watchers 2 --events "$TICKS"
  run "w2_server_two_$i" CAYUGA_ENGINE_WORKERS=2 -- server --queries rising,runup --watchers 2 --events "$TICKS"
done
run workers10k -- workers --workers 1,2,1,2 --queries "$QUERIES" --events "$EVENTS"
echo "done $(date -u +%T)" >> "$OUT/log.txt"
"$PY" -m clients.bench.rows "$OUT" | tee "$OUT/table.md"
