# shellcheck shell=bash
# The harnesses' side of tests/fault_mark.hpp (sourced).
# fault_time MARK FALLBACK: the earliest time in the file MARK (when the fault
# came), or FALLBACK when nothing was marked.
fault_time() { if [ -s "$1" ]; then sort -n "$1" | head -1; else echo "$2"; fi; }
# fault_now MARK: marks a fault injected from outside the program, now.
fault_now() { date +%s.%N >> "$1"; }
# record_ok: with record_re=n:regex set, at least n lines matching regex in
# MPIML_ABORT_RECORD (a rank may end first by its peer's end, without one);
# says what is missing and fails otherwise. Without record_re: true.
record_ok() {
  [ -n "${record_re:-}" ] || return 0
  local want=${record_re%%:*} re=${record_re#*:}
  [ "$(grep -Ec -- "$re" "$MPIML_ABORT_RECORD" 2> /dev/null)" -ge "$want" ] && return 0
  echo "FAIL: fewer than $want lines /$re/ in the abort record:"
  cat "$MPIML_ABORT_RECORD" 2> /dev/null
  return 1
}
