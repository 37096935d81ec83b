#!/usr/bin/env bash
# go build -toolexec: runs $TICKETING_LINKER in place of Go's linker, every other tool as it is.
if [[ "${1##*/}" == link ]]; then
  shift
  if [[ "$*" == "-V=full" ]]; then
    # go build keys its cache of linked binaries on this line (a release's whole version line):
    # naming the ordering linker and the order file's content in it keeps a binary linked with
    # another linker or another order from being reused.
    echo "$("$TICKETING_LINKER" -V=full) textorder=$({ echo "$TICKETING_LINKER"; cat "$TICKETING_LINK_TEXT_ORDER"; } | sha256sum | cut -c1-16)"
    exit
  fi
  exec "$TICKETING_LINKER" "$@"
fi
exec "$@"
