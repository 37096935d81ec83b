#!/usr/bin/env bash
# bench-run.sh OUTDIR --addr HOST:PORT --callers N --seconds S: execs the program that
# bench-build.sh built (the harness measures the program's own CPU; no shell stays between).
[ $# -ge 1 ] || { echo "usage: bench-run.sh OUTDIR --addr HOST:PORT --callers N --seconds S" >&2; exit 2; }
out=$1
shift
exec "$out/redsync-bench" "$@"
