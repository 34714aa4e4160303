#!/usr/bin/env bash
# One RecoverSAT variant on a finished quickstart run: trains examples/multi30k/recover_sat.sh with extra
# fairseq-train options into WORK/ckpt/NAME (kept when already there), decodes the test set greedily with
# --print-step --print-segments and prints sacreBLEU, Rep/Mis against the teacher's greedy output (the run's
# benchmark hypotheses) and the segments' counts (dev/segment_stats.py: empty, deleted, restarting the sentence;
# decoder calls per sentence, tokens per call).
#   [PRESET=cpu|cpu-long] [K=2] bash dev/recover_sat_variant.sh WORK NAME [fairseq-train args]
# e.g. the copies of pseudo-repetitive segments trained too, at q = 0.2:
#   bash dev/recover_sat_variant.sh work/multi30k-cpu rsat-copies-q02 --pseudo-rep-tokens --pseudo-rep-prob 0.2
# Writes WORK/NAME.gen (fairseq-generate's output) and WORK/NAME.hyp.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../run_scripts/common.sh"
usage="usage: recover_sat_variant.sh WORK NAME [fairseq-train args]"
WORK=$(cd "${1:?$usage}" && pwd); NAME=${2:?$usage}
shift 2
cd "$WORK"
TEACHER=ckpt/teacher/checkpoint_best.pt
GREEDY=bench/hyp.ar-teacher-greedy.txt
[ -f "$GREEDY" ] || { echo "recover_sat_variant.sh: no $WORK/$GREEDY: run the quickstart's benchmark first" >&2
  exit 1; }
if [ ! -f "ckpt/$NAME/$STUDENT_CHECKPOINT" ]; then
  log "training $NAME (log: $WORK/logs/$NAME.log)"
  bash "$ROOT/examples/multi30k/recover_sat.sh" data-bin "$TEACHER" "ckpt/$NAME" "${K:-2}" "$@" \
    > "logs/$NAME.log" 2>&1 || { tail -n 30 "logs/$NAME.log" >&2; exit 1; }
fi
fairseq-generate data-bin --user-dir "$USER_DIR" --task translation_nat --gen-subset test --beam 1 "${DEVICE_ARGS[@]}" \
  --path "ckpt/$NAME/$STUDENT_CHECKPOINT" --max-len-a 1.2 --max-len-b 10 --batch-size 64 --print-step \
  --print-segments --post-process sentencepiece > "$NAME.gen" 2> "logs/$NAME.generate.log"
grep "^D-" "$NAME.gen" | sed 's/^D-//' | sort -n | cut -f3 > "$NAME.hyp"
echo "$NAME: sacreBLEU $(sacrebleu raw/test.de -i "$NAME.hyp" -b)"
python -m nat_plugins.cli.rep_mis --references raw/test.de --ar-output "$GREEDY" --hypotheses "$NAME.hyp"
python "$ROOT/dev/segment_stats.py" "$NAME.gen"
