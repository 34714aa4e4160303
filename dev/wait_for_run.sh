#!/usr/bin/env bash
# Poll a quickstart started in the background (e.g. on a remote GPU machine whose commands may run 10 minutes):
# returns when LOG says it finished (exit 0), failed (exit 1) or after SECONDS (exit 3: call again), printing the
# steps done so far and the log's last lines.
#   bash dev/wait_for_run.sh LOG WORK [SECONDS]
set -uo pipefail
LOG=${1:?usage: wait_for_run.sh LOG WORK [SECONDS]}; WORK=${2:?usage: wait_for_run.sh LOG WORK [SECONDS]}
LIMIT=${3:-540}
end=$(( $(date +%s) + LIMIT ))
status=3
while [ "$(date +%s)" -lt "$end" ]; do
  if grep -q "\] finished in " "$LOG" 2>/dev/null; then status=0; break; fi
  if ! pgrep -f "run_scripts/quickstart.sh" > /dev/null; then status=1; break; fi
  sleep 10
done
echo "steps done: $(cd "$WORK" 2>/dev/null && ls -A | sed -n 's/^\.\(.*\)\.done$/\1/p' | tr '\n' ' ')"
grep "^\[" "$LOG" | tail -n 15
case $status in
  0) echo "finished" ;;
  1) echo "the quickstart is no longer running and did not finish: see $LOG" >&2; tail -n 30 "$LOG" >&2 ;;
  3) echo "still running after $LIMIT s: call again" ;;
esac
exit $status
