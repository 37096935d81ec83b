#!/usr/bin/env bash
# Re-measure the baseline on this machine: build an earlier commit's server AND its own harness
# (the protocol changed since, so today's harness cannot drive an older server), run them with
# the settings of `make bench`, and write the run to baseline/previous.json.
#
#   bench/baseline/remeasure.sh [COMMIT]      default: the commit recorded in previous.json
#
# Why: the comparison "each Ticketing figure >= 0.9x the previous median" divides each run's
# Ticketing / reference ratio (reference: the null server, Redis) by the baseline's. That cancels a
# machine's drift, not a change of machine: Ticketing spends more of its time computing than the
# null server (nearly all system calls), so the ratio of the two moves with the CPU. A baseline is
# only worth comparing with when it ran on the machine of the run it is compared with, shortly
# before or after it.
#
# Loopback only; each point is bounded by the harness's own limits. etcd and the later workloads
# (cluster, failover, clients, metrics) are not run: the comparison uses none of them.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
commit="${1:-$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["meta"]["ticketing_commit"].split("+")[0])' "$here/previous.json")}"
commit="$(git -C "$repo" rev-parse --verify "$commit^{commit}")"

bash "$repo/bench/setup.sh" # redis-server for the reference runs

work="$(mktemp -d /tmp/ticketing-baseline-XXXXXX)"
cleanup() {
	git -C "$repo" worktree remove --force "$work/src" >/dev/null 2>&1 || true
	rm -rf "$work"
}
trap cleanup EXIT
git -C "$repo" worktree add --detach "$work/src" "$commit" >/dev/null
(cd "$work/src" && CGO_ENABLED=0 go build -o "$work/ticketing" ./cmd/ticketing)
(cd "$work/src/bench" && go build -o "$work/bench" .)
(cd "$work/src/bench" && "$work/bench" -systems ticketing,redis,null -workloads a,b,c,d \
	-conns 1,4,16,64 -repeat 3 -duration 4s -warmup 1s \
	-ticketing-bin "$work/ticketing" -out "$work/out")
cp "$work/out/latest.json" "$here/previous.json"
echo "baseline: $here/previous.json (commit $commit, measured on this machine)"
