#!/usr/bin/env bash
# Runs one long `make` step quietly: `scripts/step.sh LOG "what it does" command [args...]`.
# The command's output is appended to LOG; one progress line names the step and its elapsed time.
# On failure it prints the last 40 lines of LOG and LOG's path, and exits with the command's status.
set -u
log=$1 what=$2
shift 2
mkdir -p "$(dirname "$log")"
printf '%s ...\n' "$what"
echo "=== $(date -u '+%F %T') $what: $*" >>"$log"
start=$SECONDS
"$@" >>"$log" 2>&1
rc=$?
if [ $rc -ne 0 ]; then
  echo "FAILED after $((SECONDS - start)) s: $what (exit $rc). Last lines of $log:" >&2
  tail -n 40 "$log" >&2
  echo "Full log: $log" >&2
  exit $rc
fi
echo "    done in $((SECONDS - start)) s"
