#!/usr/bin/env bash
# Run fuzz targets two at a time for SECONDS each (default 600), from already-built binaries
# (`cargo +nightly fuzz build -O`), logging to artifacts/<target>.log. Usage: run-fuzz.sh [SECONDS] TARGET...
set -u
cd "$(dirname "$0")"
secs=${1:-600}; shift
bin=target/x86_64-unknown-linux-gnu/release
run() {
  local t=$1
  mkdir -p corpus/$t artifacts/$t
  nice -n 15 "$bin/$t" -max_total_time="$secs" -print_final_stats=1 -artifact_prefix="artifacts/$t/" \
    corpus/$t > artifacts/$t.log 2>&1
  echo "$t: exit $? $(grep -E 'stat::number_of_executed_units' artifacts/$t.log | tail -1)"
}
set -- "$@"
while [ $# -gt 0 ]; do
  run "$1" & 
  if [ $# -gt 1 ]; then run "$2" & shift; fi
  shift
  wait
done
