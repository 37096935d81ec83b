#!/usr/bin/env bash
# Builds the Java client (core, Kotlin module, conformance driver) and runs all of its tests on a
# fresh machine: unit tests against protocol/vectors.json and constants.json, fake-server tests of
# the failure paths, integration tests against the real server (the java.util.concurrent.locks.Lock
# adapter's too), and the Kotlin coroutine tests; then packages the artifacts (package.sh) and runs
# the README's example in a fresh Maven project that depends on them.
# The server binary is $TICKETING_BIN, else built here once from the repository root.
# Set MAVEN_REPO=<dir> to use a separate local Maven repository. Exits non-zero on any failure.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
cd "$here"

# Debian packages: a JDK 17 and Maven (preinstalled on our machines), openssl for the TLS tests.
pkgs=(openjdk-17-jdk-headless maven openssl)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if (( ${#missing[@]} )); then
  echo "test.sh: installing ${missing[*]}"
  apt-get update
  apt-get install -y --no-install-recommends --no-upgrade -o DPkg::Lock::Timeout=600 "${missing[@]}"
fi

tmp=""
if [[ -z "${TICKETING_BIN:-}" ]]; then
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  (cd "$root" && go build -o "$tmp/ticketing" ./cmd/ticketing)
  export TICKETING_BIN="$tmp/ticketing"
fi

# One Maven run builds, tests and packages (package.sh: jars, sources and javadoc jars into
# <repo>/dist/java/maven-repo, no warnings allowed, the registry's checks).
log="$(mktemp)"
status=0
PACKAGE_RUN_TESTS=1 ./package.sh 2>&1 | tee "$log" || status=$?
# The totals of every module (Surefire prints a line per module).
read -r passed failed skipped < <(
  grep -E '^\[(INFO|ERROR|WARNING)\] Tests run: [0-9]+, Failures: [0-9]+, Errors: [0-9]+, Skipped: [0-9]+$' "$log" |
    awk -F'[ ,:]+' '{ run += $4; failed += $6 + $8; skipped += $10 }
      END { printf "%d %d %d\n", run - failed - skipped, failed, skipped }')
rm -f "$log"

# The fresh-project test: a new Maven project in a temporary folder depends on the packaged
# artifacts (from dist/java/maven-repo, as the README's "from a checkout" says) and runs the
# README's example, extracted from the README, against a real server. Offline: its own empty local
# repository, fed only from file:// repositories (dist and this machine's Maven cache).
fresh_project() {
  local dir cache srv_pid="" rc=0
  dir="$(mktemp -d /tmp/java-fresh.XXXXXX)"
  cache="${MAVEN_REPO:-$HOME/.m2/repository}"
  mkdir -p "$dir/src/main/java" "$dir/data"
  # The README's ten lines, as written there.
  awk '/<!-- example:start/ { on = 1; next } /<!-- example:end -->/ { on = 0 } on' README.md |
    sed -e '/^```/d' > "$dir/src/main/java/Example.java"
  grep -q 'class Example' "$dir/src/main/java/Example.java" || { echo "fresh project: no example in README.md"; return 1; }
  cat > "$dir/settings.xml" <<XML
<settings>
  <profiles>
    <profile>
      <id>cache</id>
      <repositories>
        <repository><id>central</id><url>file://$cache</url></repository>
      </repositories>
      <pluginRepositories>
        <pluginRepository><id>central</id><url>file://$cache</url></pluginRepository>
      </pluginRepositories>
    </profile>
  </profiles>
  <activeProfiles><activeProfile>cache</activeProfile></activeProfiles>
</settings>
XML
  # The README's dependency block and repository, as a user's pom.xml.
  cat > "$dir/pom.xml" <<XML
<?xml version="1.0" encoding="UTF-8"?>
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>example</groupId>
  <artifactId>fresh</artifactId>
  <version>1</version>
  <properties>
    <maven.compiler.release>17</maven.compiler.release>
    <project.build.sourceEncoding>UTF-8</project.build.sourceEncoding>
  </properties>
  <repositories>
    <repository><id>ticketing-checkout</id><url>file://$root/dist/java/maven-repo</url></repository>
  </repositories>
  <dependencies>
    <dependency>
      <groupId>io.ticketing</groupId>
      <artifactId>ticketing-client</artifactId>
      <version>$(tr -d '[:space:]' < "$root/VERSION")</version>
    </dependency>
    <dependency>
      <groupId>io.ticketing</groupId>
      <artifactId>ticketing-kotlin</artifactId>
      <version>$(tr -d '[:space:]' < "$root/VERSION")</version>
    </dependency>
  </dependencies>
  <build>
    <plugins>
      <plugin><artifactId>maven-resources-plugin</artifactId><version>3.3.1</version></plugin>
      <plugin><artifactId>maven-compiler-plugin</artifactId><version>3.14.0</version></plugin>
    </plugins>
  </build>
</project>
XML
  (
    # (set -e does not apply inside a function called from an if: every step checks itself)
    fail() { echo "fresh project: $*"; exit 1; }
    cd "$dir" || fail "no $dir"
    # -o with file:// allowed: nothing is fetched from a network.
    mvn -B -ntp -q -Dstyle.color=never -o -Daether.offline.protocols=file -s settings.xml -Dmaven.repo.local="$dir/m2" compile ||
      fail "mvn compile failed"
    jar_file="$(ls "$dir"/m2/io/ticketing/ticketing-client/*/ticketing-client-*.jar)" || fail "no ticketing-client jar"
    grep -q 'ticketing-checkout' "$(dirname "$jar_file")/_remote.repositories" ||
      fail "ticketing-client did not come from dist/java/maven-repo"
    ls "$dir"/m2/org/jetbrains/kotlinx/kotlinx-coroutines-core-jvm/*/*.jar >/dev/null ||
      fail "the Kotlin module's dependencies did not resolve"

    : >"$dir/server.log" # before the server starts: the loop below reads it at once
    TICKETING_STARTUP_GRACE=0 TICKETING_ADDR=127.0.0.1:0 TICKETING_DATA_DIR="$dir/data" \
      "$TICKETING_BIN" server >/dev/null 2>>"$dir/server.log" &
    echo $! > "$dir/server.pid"
    endpoint=""
    for _ in $(seq 1 200); do
      endpoint="$(sed -n 's/.*msg=listening addr=\([0-9.]*:[0-9]*\).*/\1/p' "$dir/server.log" | head -1)"
      [[ -n "$endpoint" ]] && break
      sleep 0.05
    done
    [[ -n "$endpoint" ]] || { cat "$dir/server.log"; fail "the server did not start"; }
    out="$(TICKETING_ENDPOINT="$endpoint" java -cp "target/classes:$jar_file" Example 2>&1)" ||
      fail "the example failed: $out"
    echo "fresh project: $out"
    [[ "$out" =~ ^holding\ report-2024\ with\ fencing\ token\ [1-9][0-9]*$ ]] || fail "unexpected output"
  ) || rc=$?
  if [[ -f "$dir/server.pid" ]]; then
    srv_pid="$(cat "$dir/server.pid")"
    kill "$srv_pid" 2>/dev/null || true
    for _ in $(seq 1 100); do kill -0 "$srv_pid" 2>/dev/null || break; sleep 0.05; done
  fi
  rm -rf "$dir"
  return "$rc"
}

if (( status == 0 )); then
  if fresh_project; then
    echo "fresh project: the README's example ran against the packaged artifacts"
    passed=$((passed + 1))
  else
    echo "fresh project: FAILED"
    failed=$((failed + 1))
    status=1
  fi
fi
echo "java: $passed passed, $failed failed, $skipped skipped"
exit "$status"
