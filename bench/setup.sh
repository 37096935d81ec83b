#!/usr/bin/env bash
# Installs the systems the benchmark compares against, only when they are missing:
# Debian's redis-server (with redis-benchmark) and etcd-server. Idempotent; safe to re-run.
set -euo pipefail
need=()
command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
command -v redis-benchmark >/dev/null 2>&1 || need+=(redis-tools)
command -v etcd >/dev/null 2>&1 || need+=(etcd-server)
if [ ${#need[@]} -eq 0 ]; then
  exit 0
fi
echo "bench/setup.sh: installing ${need[*]}" >&2
sudo=""
if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get -o DPkg::Lock::Timeout=600 update -qq
$sudo apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends --no-upgrade "${need[@]}" >/dev/null
# The Debian packages start their own services; the benchmark starts private instances on free
# ports, so stop the system-wide ones if a service manager started them (ignore failures).
for svc in redis-server etcd; do
  if command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet "$svc" 2>/dev/null; then
    $sudo systemctl stop "$svc" || true
  fi
done
command -v redis-server >/dev/null && command -v redis-benchmark >/dev/null && command -v etcd >/dev/null
