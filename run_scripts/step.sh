# Sourced by run_scripts/quickstart.sh (after common.sh, with WORK set): step NAME COMMAND... runs COMMAND once; a
# marker file WORK/.NAME.done records success; its output goes to WORK/logs/NAME.log, and now and then
# (PROGRESS_SECONDS, default 120) its latest progress line reaches the terminal: fairseq-train's updates,
# distillation's sentences, the benchmark's pass, row and time left. The terminal is the stdout this file was sourced
# with (file descriptor 3), so the steps of jobs whose own output is discarded (students trained side by side) show
# their progress too.
exec 3>&1
step() {
  local name=$1 started
  shift
  if [ -f "$WORK/.$name.done" ]; then log "$name: done before (remove $WORK/.$name.done to redo)"; return; fi
  started=$(date +%s)
  log "$name ... (follow it: tail -f $WORK/logs/$name.log)"
  # (the sleep holds no output open, the terminal (3) included: a caller reading ours is not kept waiting)
  ( shown=""
    while sleep "${PROGRESS_SECONDS:-120}" > /dev/null 2>&1 3>&-; do
      line=$(grep -E "sentences (to decode|done)|num_updates=|benchmark progress: " "$WORK/logs/$name.log" 2> /dev/null |
        tail -n 1 | sed -E 's/^.*\| //; s/^[A-Z]+:[A-Za-z0-9_.]+://; s/^benchmark progress: //' || true)
      # (without fairseq's or logging's prefix)
      [ -z "$line" ] || [ "$line" = "$shown" ] || log "$name: $line" >&3
      shown=$line
    done ) &
  local reporter=$! status=0
  "$@" > "$WORK/logs/$name.log" 2>&1 || status=$?
  kill "$reporter" 2> /dev/null || true
  if [ "$status" != 0 ]; then
    tail -n 40 "$WORK/logs/$name.log" >&2
    log "$name failed after $(( $(date +%s) - started )) s: the last lines of $WORK/logs/$name.log are above" >&2
    exit 1
  fi
  touch "$WORK/.$name.done"
  # for the report: name, seconds, and "side by side" for a step that ran beside others (their phase has its own line)
  printf '%s\t%s\t%s\n' "$name" "$(( $(date +%s) - started ))" "${STEP_PHASE:-}" >> "$WORK/logs/steps.tsv"
  log "$name done in $(( $(date +%s) - started )) s"
}
