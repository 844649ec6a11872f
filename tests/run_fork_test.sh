#!/usr/bin/env bash
# mpi_fork end to end: argv preserved byte for byte, environment, oversubscription
# as root, MPI initialized before forking, exit status, clear errors.
set -u
prog=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
hex() { printf '%s' "$1" | od -An -v -tx1 | tr -d ' \n'; }

# The launcher flags must come from mpi_fork itself, not from the environment.
unset OMPI_ALLOW_RUN_AS_ROOT OMPI_ALLOW_RUN_AS_ROOT_CONFIRM OMPI_MCA_rmaps_base_oversubscribe IN_MPI

args=("a b" "it's \"quoted\"" $'caf\xc3\xa9 \xe2\x82\xac' $'\xff\xfe raw' "" "--flag=x y" '$HOME;*')

check_case() {  # name n expected_code prog-args...
  local name=$1 n=$2 want=$3; shift 3
  rm -f "$tmp/$name".*
  timeout 60 "$prog" "$n" "$tmp/$name" "$want" "$@" > "$tmp/$name.log" 2>&1
  local rc=$?
  if [ "$want" = 0 ] && [ $rc -ne 0 ]; then fail "$name: exit $rc"; cat "$tmp/$name.log"; return; fi
  if [ "$want" != 0 ] && [ $rc -ne "$want" ]; then fail "$name: exit $rc, wanted $want"; cat "$tmp/$name.log"; fi
  local ranks=$n; [ "$n" -le 1 ] && ranks=1
  for ((r = 0; r < ranks; r++)); do
    local f="$tmp/$name.$r"
    [ -f "$f" ] || { fail "$name: rank $r wrote nothing"; continue; }
    mapfile -t lines < "$f"
    [ "${lines[0]}" = "$ranks" ] || fail "$name: rank $r saw ${lines[0]} ranks, wanted $ranks"
    if [ "$n" -gt 1 ]; then
      [ "${lines[1]}" = "1 1 1" ] || fail "$name: rank $r env '${lines[1]}', wanted IN_MPI=1 OMP/MKL=1"
    fi
    local all=("$n" "$tmp/$name" "$want" "$@")
    [ "${#lines[@]}" -eq $((2 + ${#all[@]})) ] || fail "$name: rank $r got $(( ${#lines[@]} - 2 )) args, wanted ${#all[@]}"
    for i in "${!all[@]}"; do
      [ "${lines[$((2 + i))]}" = "[$(hex "${all[$i]}")]" ] || fail "$name: rank $r arg $((i + 1)) differs: ${lines[$((2 + i))]} vs [$(hex "${all[$i]}")]"
    done
  done
}

check_case two 2 0 "${args[@]}"
check_case three_oversubscribed 3 0 "${args[@]}"
check_case init_first 2 0 --init-first "${args[@]}"
check_case exit_status 2 7 "${args[@]}"
check_case single 1 0 "${args[@]}"

# Errors: clear messages, no crash.
out=$(MPIML_MPIRUN=/nonexistent/mpirun timeout 30 "$prog" 2 "$tmp/x" 0 2>&1); rc=$?
[ $rc -eq 3 ] && grep -q "MPIML_MPIRUN" <<<"$out" || fail "bad MPIML_MPIRUN: rc=$rc out=$out"
out=$(/usr/bin/env -u MPIML_MPIRUN PATH=/nonexistent /usr/bin/timeout 30 "$prog" 2 "$tmp/x" 0 2>&1); rc=$?
[ $rc -eq 3 ] && grep -q "no MPI launcher found" <<<"$out" || fail "no launcher: rc=$rc out=$out"
# Default discovery: with both MPIs installed, the launcher matching the
# linked MPI is chosen even when `mpirun` on PATH is the other one's; when
# only the other one's exists, a clear error instead of N singleton ranks.
if [ -x /usr/bin/mpirun.openmpi ] && [ -x /usr/bin/mpiexec.mpich ]; then
  mkdir -p "$tmp/both" "$tmp/other"
  if "${MPIML_MPIRUN:-mpirun}" --version 2>&1 | grep -Eq "Open MPI|OpenRTE"; then
    own=/usr/bin/mpirun.openmpi; other=/usr/bin/mpiexec.mpich; own_name=mpirun.openmpi
  else
    own=/usr/bin/mpiexec.mpich; other=/usr/bin/mpirun.openmpi; own_name=mpiexec.mpich
  fi
  wrap() { printf '#!/bin/sh\nexec %s "$@"\n' "$1" > "$2"; chmod +x "$2"; }  # launchers find their helpers from their own path
  wrap "$other" "$tmp/both/mpirun"; wrap "$own" "$tmp/both/$own_name"; wrap "$other" "$tmp/other/mpirun"
  ( fails=0; unset MPIML_MPIRUN; PATH=$tmp/both:/usr/bin:/bin; check_case discovery 2 0 "${args[@]}"; exit $fails )
  [ $? -eq 0 ] || fail "discovery with the other MPI's mpirun first on PATH"
  out=$(/usr/bin/env -u MPIML_MPIRUN PATH="$tmp/other" /usr/bin/timeout 30 "$prog" 2 "$tmp/x" 0 2>&1); rc=$?
  [ $rc -eq 3 ] && grep -q "linked against .* but the only launcher found" <<<"$out" || fail "other MPI's launcher only: rc=$rc out=$out"
  # Named in MPIML_MPIRUN: the same mismatch is an error too.
  out=$(MPIML_MPIRUN="$other" timeout 30 "$prog" 2 "$tmp/x" 0 2>&1); rc=$?
  [ $rc -eq 3 ] && grep -q "MPIML_MPIRUN='$other' is .*'s launcher but this program is linked against" <<<"$out" ||
    fail "other MPI's launcher in MPIML_MPIRUN: rc=$rc out=$out"
fi
out=$(MPIML_HOSTFILE=/nonexistent/hosts timeout 30 "$prog" 2 "$tmp/x" 0 2>&1); rc=$?
[ $rc -eq 3 ] && grep -q "MPIML_HOSTFILE='/nonexistent/hosts' is not a readable file" <<<"$out" || fail "bad MPIML_HOSTFILE: rc=$rc out=$out"
# MPIML_MPIRUN_FLAGS reach the launcher: a flag it rejects fails the launch.
if "${MPIML_MPIRUN:-mpirun}" --version 2>&1 | grep -Eq "Open MPI|OpenRTE"; then
  MPIML_MPIRUN_FLAGS="--report-bindings  -x MPIML_FLAG_SEEN=1" check_case extra_flags 2 0 a
  out=$(MPIML_MPIRUN_FLAGS="--no-such-mpirun-flag" timeout 30 "$prog" 2 "$tmp/x" 0 2>&1); rc=$?
  [ $rc -ne 0 ] || fail "MPIML_MPIRUN_FLAGS not passed to the launcher: rc=$rc out=$out"
fi
out=$(timeout 30 "$prog" -1 "$tmp/x" 0 2>&1); rc=$?
[ $rc -eq 3 ] && grep -q "n must be" <<<"$out" || fail "n=-1: rc=$rc out=$out"

if [ $fails -eq 0 ]; then echo "mpi_fork: all cases passed"; exit 0; fi
echo "mpi_fork: $fails failure(s)"; exit 1
