#!/usr/bin/env bash
# The admin page test: a real server with known locks and waiters, the page in Debian's
# headless Chromium (playwright-core drives it; no browser is downloaded), the generator form.
# Installs what is missing: Debian's chromium (apt) and playwright-core (npm, pinned by
# package-lock.json). About 25 s once set up; installing chromium adds about a minute.
# Screenshots go to tests/adminpage/artifacts/ (not committed). follower.test.mjs: a follower's page in a 3-node cluster.
set -euo pipefail
cd "$(dirname "$0")"
root=$(cd ../.. && pwd)

if [ ! -x /usr/bin/chromium ]; then
  echo "installing chromium"
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends --no-upgrade -o DPkg::Lock::Timeout=600 chromium >/dev/null
fi
if [ ! -d node_modules/playwright-core ]; then
  PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 npm ci --no-audit --no-fund --loglevel=error
fi

# The server binary: TICKETING_BIN (make passes bin/ticketing), else built here.
if [ -z "${TICKETING_BIN:-}" ]; then
  mkdir -p "$root/bin"
  (cd "$root" && go build -o bin/ticketing ./cmd/ticketing)
  TICKETING_BIN="$root/bin/ticketing"
fi
mkdir -p artifacts
(cd "$root" && go build -o tests/adminpage/artifacts/fixture ./tests/adminpage/fixture)
export TICKETING_BIN FIXTURE_BIN="$PWD/artifacts/fixture" ARTIFACTS="$PWD/artifacts"
exec node --test --test-concurrency=1 page.test.mjs follower.test.mjs
