#!/usr/bin/env bash
# Prints the path of the ordering linker: Go's own linker (cmd/link, from this machine's Go
# installation) with one addition, textorder.go.txt, which places the functions named in
# $TICKETING_LINK_TEXT_ORDER at the front of the text section. Built once per Go version and
# linker source into ${XDG_CACHE_HOME:-~/.cache}/ticketing-link/ (a few seconds); see README.md.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
goroot="$(go env GOROOT)"
src="$goroot/src/cmd/link/internal/ld"
# The addition runs where -randlayout shuffles the same list, just before the first of these lines
# of textaddress() in data.go, and its FIPS block move just before the second (after the sort by
# symbol type).
anchor='	// Sort the text symbols by type, so that FIPS symbols are'
anchor2='	text := ctxt.xdefine("runtime.text", sym.STEXT, 0)'
if [[ ! -f "$src/data.go" ]] || ! grep -qxF "$anchor" "$src/data.go" || ! grep -qxF "$anchor2" "$src/data.go"; then
  echo "toolchain/linker.sh: $(go env GOVERSION)'s linker source ($src/data.go) lacks the lines the text order goes before;" >&2
  echo "  update toolchain/linker.sh for this Go, or build with TICKETING_LINK_ORDER=off (the standard linker: about 3 MB more resident per node)" >&2
  exit 1
fi
key="$(cat "$src/data.go" "$here/textorder.go.txt" "$here/linker.sh" | sha256sum | cut -c1-16)"
dir="${XDG_CACHE_HOME:-$HOME/.cache}/ticketing-link/$(go env GOVERSION)-$key"
if [[ ! -x "$dir/link" ]]; then
  # Each build writes its own overlay and renames the linker into place, so that two builds at
  # once (make test runs several) never see each other's half-written files.
  mkdir -p "$dir"
  work="$(mktemp -d "$dir/src.XXXXXX")"
  trap 'rm -rf "$work"' EXIT
  awk -v a="$anchor" -v b="$anchor2" '
    $0 == a { print "\tapplyTextOrder(ctxt)"; print "" }
    $0 == b { print "\tplaceFIPSText(ctxt)"; print "" }
    { print }' "$src/data.go" > "$work/data.go"
  cp "$here/textorder.go.txt" "$work/textorder.go"
  printf '{"Replace":{"%s":"%s","%s":"%s"}}\n' "$src/data.go" "$work/data.go" "$src/textorder.go" "$work/textorder.go" > "$work/overlay.json"
  go build -overlay "$work/overlay.json" -o "$work/link" cmd/link
  mv "$work/link" "$dir/link"
fi
echo "$dir/link"
