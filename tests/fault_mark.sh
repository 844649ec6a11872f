# shellcheck shell=bash
# The harnesses' side of tests/fault_mark.hpp (sourced).
# fault_time MARK FALLBACK: the earliest time in the file MARK (when the fault
# came), or FALLBACK when nothing was marked.
fault_time() { if [ -s "$1" ]; then sort -n "$1" | head -1; else echo "$2"; fi; }
# fault_now MARK: marks a fault injected from outside the program, now.
fault_now() { date +%s.%N >> "$1"; }
