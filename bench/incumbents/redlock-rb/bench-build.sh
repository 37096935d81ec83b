#!/usr/bin/env bash
# Builds the redlock-rb incumbent: the redlock gem and the redis gem it runs on.
#   bench-build.sh OUTDIR   (OUTDIR is not used: the gems go to this folder's git-ignored build/)
# Where the RubyGems registry answers, `gem install` puts redlock (with its redis dependency)
# into build/gems (a folder-local GEM_HOME). Where it does not (our machines), it uses the
# vendored redlock 1.3.2 (vendor/README.md) on Debian's ruby-redis, installed with apt-get when
# missing. bench-run.sh uses whichever is there. Idempotent; quick once built.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$here"
if ! command -v ruby >/dev/null 2>&1 || ! command -v gem >/dev/null 2>&1; then
  echo "bench-build.sh: ruby and gem are missing (clients/ruby/setup.sh installs Debian's ruby)" >&2
  exit 1
fi
if GEM_HOME="$here/build/gems" GEM_PATH="$here/build/gems" ruby -e 'require "redlock"; require "redis"' >/dev/null 2>&1; then
  exit 0 # installed from the registry earlier
fi
vendored() { ruby -I vendor/redlock-1.3.2/lib -e 'require "redlock"; Redlock::Client' >/dev/null 2>&1; }
if [[ -f build/vendored ]] && vendored; then
  exit 0 # the registry could not be reached earlier; the vendored gem runs
fi
mkdir -p build
# The registry first (a quick "no" where it cannot be reached), else the vendored gem on
# Debian's ruby-redis.
if timeout 120 gem install --no-document --install-dir "$here/build/gems" redlock >build/gem-install.log 2>&1; then
  exit 0
fi
rm -rf build/gems
if ! ruby -e 'require "redis"' >/dev/null 2>&1; then
  sudo=""
  if [[ "$(id -u)" != 0 ]]; then sudo="sudo"; fi
  if ! { $sudo apt-get -o DPkg::Lock::Timeout=600 update -qq && \
         $sudo apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends --no-upgrade ruby-redis; } >build/apt.log 2>&1; then
    echo "bench-build.sh: the redlock gem cannot be installed (no RubyGems registry) and neither can Debian's ruby-redis (build/apt.log)" >&2
    exit 1
  fi
fi
if ! vendored; then
  echo "bench-build.sh: the vendored redlock 1.3.2 does not load on this ruby-redis" >&2
  exit 1
fi
ruby -c bench.rb >/dev/null
touch build/vendored
