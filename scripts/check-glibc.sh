#!/usr/bin/env bash
# Fails when a binary needs a glibc newer than the baseline: reads every GLIBC_x.y version the files
# require (their version-needs section, `readelf -V`: what the dynamic loader checks at load time)
# and compares the highest with the baseline.
#
# Usage: scripts/check-glibc.sh BASELINE FILE...     (prints "FILE GLIBC_x.y" per file)
set -euo pipefail
baseline=$1; shift
[ $# -gt 0 ] || { echo "check-glibc: no files given" >&2; exit 2; }
status=0
for f in "$@"; do
    highest=$(readelf -V -W "$f" | grep -o 'Name: GLIBC_[0-9.]*' | sed 's/Name: GLIBC_//' | sort -V | tail -1)
    [ -n "$highest" ] || { echo "check-glibc: $f requires no GLIBC_ version (not a glibc binary?)" >&2; exit 2; }
    echo "$f GLIBC_$highest"
    if [ "$(printf '%s\n' "$baseline" "$highest" | sort -V | tail -1)" != "$baseline" ]; then
        echo "check-glibc: $f needs GLIBC_$highest, above the baseline $baseline" >&2
        status=1
    fi
done
exit $status
