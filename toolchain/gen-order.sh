#!/usr/bin/env bash
# Regenerates cmd/ticketing/textorder.txt, the functions a single node runs, which the release
# build places at the front of the binary (README.md). Run it after a change to what the server
# runs at start or on its request path; a stale list still builds (names it no longer finds are
# skipped, new functions land behind the front), it only maps more of the binary.
#
#   toolchain/gen-order.sh          (about 2 minutes; needs the bench harness's Go module)
#
# 1. A coverage build of the server (go build -cover -coverpkg=all, the release compiler flags)
#    runs the bench harness's workloads (a) to (e) and the /metrics scrapes of "metrics" at 1 to
#    64 connections, each on a fresh server, writing which functions ran.
#    Then a 3-node cluster of the coverage build runs the cluster workload: what its nodes run
#    beyond that is the list's second tier, after the single node's front.
# 2. genorder maps those functions to the release binary's symbols (with the runtime, every
#    package initialiser, closures, generic instances and assembly helpers).
# 3. Where perf is available: the ordered binary starts under `perf record -e page-faults`, then
#    runs (a) at 1 and 64 connections and the /metrics scrapes with perf attached, and every
#    function that faults a page of code behind the front is added, until none is new (each round
#    finds the first function touched in each 64 KiB behind the front; 6 rounds at most).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$here")"
cd "$root"
tmp="$(mktemp -d /tmp/ticketing-textorder-XXXXXX)"
trap 'rm -rf "$tmp"' EXIT
mapfile -t gcflags < <(grep -v '^#' cmd/ticketing/gcflags.txt | grep -v '^[[:space:]]*$')

echo "gen-order: building the coverage and the plain server" >&2
CGO_ENABLED=0 go build -cover -coverpkg=all "${gcflags[@]}" -o "$tmp/cover-server" ./cmd/ticketing
TICKETING_LINK_ORDER=off "$here/go-build.sh" -o "$tmp/plain" ./cmd/ticketing
mkdir -p "$tmp/cover"
echo "gen-order: running the workloads on the coverage build" >&2
(cd bench && go build -o "$tmp/bench" . && "$tmp/bench" -systems ticketing -workloads a,b,c,d,e,metrics \
  -conns 1,4,16,64 -repeat 1 -duration 2s -warmup 1s -ticketing-bin "$tmp/cover-server" \
  -ticketing-env "GOCOVERDIR=$tmp/cover" -out "$tmp/bench-out" >/dev/null)
# A cluster's nodes, for the second tier: what a cluster node runs beyond a single node's code
# follows the front (the cluster workload: 3 nodes on 127.0.0.x, acquires through the leader).
mkdir -p "$tmp/cover-cluster"
(cd bench && "$tmp/bench" -systems ticketing -workloads cluster -repeat 1 -duration 2s -warmup 1s \
  -ticketing-bin "$tmp/cover-server" -ticketing-env "GOCOVERDIR=$tmp/cover-cluster" -out "$tmp/bench-cluster" >/dev/null)
touch "$tmp/faults"
go run ./toolchain/genorder -bin "$tmp/plain" -cover "$tmp/cover" -o "$tmp/order"

if perf record -q -e page-faults -o /dev/null -- true 2>/dev/null; then
  for round in 1 2 3 4 5 6; do
    TICKETING_LINK_TEXT_ORDER="$tmp/order" "$here/go-build.sh" -o "$tmp/ordered" ./cmd/ticketing
    mkdir -p "$tmp/data$round"
    perf record -q -e page-faults -c 1 -d -o "$tmp/pf.data" -- "$tmp/ordered" server --addr 127.0.0.1:0 \
      --admin-addr 127.0.0.1:0 --data-dir "$tmp/data$round" >/dev/null 2>&1 &
    pid=$!
    sleep 2
    pkill -TERM -P "$pid" || true
    wait "$pid" || true
    perf script -i "$tmp/pf.data" -F addr 2>/dev/null > "$tmp/pf.txt"
    # Under load: the harness starts this wrapper as its server; perf attaches to the real one
    # (perf record does not pass a SIGTERM on to a program it started).
    cat > "$tmp/perf-server" <<WRAP
#!/usr/bin/env bash
trap 'kill -TERM "\$pid" 2>/dev/null' TERM INT
"$tmp/ordered" "\$@" &
pid=\$!
perf record -q -e page-faults -c 1 -d -p "\$pid" -o "$tmp/pf-load.\$pid.data" >/dev/null 2>&1 &
perf=\$!
while kill -0 "\$pid" 2>/dev/null; do wait "\$pid"; done
kill -INT "\$perf" 2>/dev/null
wait "\$perf"
WRAP
    chmod +x "$tmp/perf-server"
    rm -f "$tmp"/pf-load.*.data
    (cd bench && "$tmp/bench" -systems ticketing -workloads a,metrics -conns 1,64 -repeat 1 -duration 2s \
      -warmup 1s -ticketing-bin "$tmp/perf-server" -out "$tmp/bench-perf" >/dev/null)
    for f in "$tmp"/pf-load.*.data; do
      perf script -i "$f" -F addr 2>/dev/null >> "$tmp/pf.txt" || true
    done
    go run ./toolchain/genorder -faults-of "$tmp/pf.txt" -ordered "$tmp/ordered" -order "$tmp/order" > "$tmp/new"
    echo "gen-order: round $round: $(wc -l < "$tmp/new") functions faulted behind the front" >&2
    [[ -s "$tmp/new" ]] || break
    cat "$tmp/new" >> "$tmp/faults"
    go run ./toolchain/genorder -bin "$tmp/plain" -cover "$tmp/cover" -faults "$tmp/faults" -o "$tmp/order"
  done
else
  echo "gen-order: perf cannot record page faults here: the list is the coverage data's alone" >&2
fi
# The single node's front is settled (the rounds above built without the second tier, so that
# what a single node faults in behind its front is found): the cluster's tier goes after it.
go run ./toolchain/genorder -bin "$tmp/plain" -cover "$tmp/cover" -faults "$tmp/faults" -then "$tmp/cover-cluster" -o "$tmp/order"
cp "$tmp/order" cmd/ticketing/textorder.txt
echo "gen-order: wrote cmd/ticketing/textorder.txt ($(grep -vc '^#' cmd/ticketing/textorder.txt) functions)" >&2
