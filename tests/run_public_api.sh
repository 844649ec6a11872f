#!/usr/bin/env bash
# The public-API program alone, under the launcher with 1 and with 2 ranks:
# exit 0 and nothing at all on stderr.
set -u
launcher=$1 flags=$2 prog=$3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
run() {  # name command...
  local name=$1; shift
  timeout 60 "$@" > "$tmp/$name.out" 2> "$tmp/$name.err"
  local rc=$?
  if [ $rc -ne 0 ] || [ -s "$tmp/$name.err" ]; then
    echo "FAIL: $name: exit $rc, stderr:"; cat "$tmp/$name.err"; cat "$tmp/$name.out"
    fails=$((fails + 1))
  else
    echo "$name: $(tail -1 "$tmp/$name.out")"
  fi
}
# shellcheck disable=SC2086
{
  run alone env -u OMPI_COMM_WORLD_SIZE -u PMI_SIZE "$prog"
  run np1 "$launcher" -n 1 $flags "$prog"
  run np2 "$launcher" -n 2 $flags "$prog"
}
[ $fails -eq 0 ]
