#!/usr/bin/env bash
# One variant of a recipe on a finished quickstart run: trains examples/multi30k/RECIPE with its arguments (SAVE
# stands for the variant's save dir, WORK/ckpt/NAME; a checkpoint already there is kept), decodes the test set
# greedily with --print-step and DECODE_OPTIONS, and prints sacreBLEU, Rep/Mis against the teacher's greedy output
# (the run's benchmark hypotheses) and the decoder calls per sentence, tokens per call and, for RecoverSAT, the
# segments' counts (dev/decode_stats.py). Paths are relative to WORK.
#   [PRESET=cpu|cpu-long] bash dev/variant.sh WORK NAME "DECODE_OPTIONS" RECIPE [recipe args with SAVE]
# e.g. RecoverSAT K=2 with the copies of pseudo-repetitive segments trained too, at q = 0.2; blockwise heads on the
# teacher's greedy outputs:
#   bash dev/variant.sh work/multi30k-cpu rsat-copies "--print-segments" recover_sat.sh data-bin \
#     ckpt/teacher/checkpoint_best.pt SAVE 2 --pseudo-rep-tokens --pseudo-rep-prob 0.2
#   bash dev/variant.sh work/multi30k-cpu bw-greedy "--block-accept exact --max-drafting-sentences 100000" \
#     blockwise.sh data-bin ckpt/teacher/checkpoint_best.pt SAVE 4 frozen --distilled-name kd_greedy
# Writes WORK/variants/NAME.gen (fairseq-generate's output) and WORK/variants/NAME.hyp.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
usage="usage: variant.sh WORK NAME \"DECODE_OPTIONS\" RECIPE [recipe args with SAVE for the save dir]"
WORK=$(cd "${1:?$usage}" && pwd); NAME=${2:?$usage}; read -r -a DECODE <<< "${3?$usage}"; RECIPE=${4:?$usage}
shift 4
GREEDY=bench/hyp.ar-teacher-greedy.txt
run_dir "$WORK" variant.sh "$GREEDY"
mkdir -p variants
train_once "$NAME" "$RECIPE" "${@/#SAVE/ckpt/$NAME}"
fairseq-generate data-bin --user-dir "$USER_DIR" --task translation_nat --gen-subset test --beam 1 "${DEVICE_ARGS[@]}" \
  --path "ckpt/$NAME/$STUDENT_CHECKPOINT" --max-len-a 1.2 --max-len-b 10 --batch-size 64 --print-step \
  --post-process sentencepiece "${DECODE[@]}" > "variants/$NAME.gen" 2> "logs/$NAME.generate.log"
grep "^D-" "variants/$NAME.gen" | sed 's/^D-//' | sort -n | cut -f3 > "variants/$NAME.hyp"
echo "$NAME: sacreBLEU $(sacrebleu raw/test.de -i "variants/$NAME.hyp" -b)"
python -m nat_plugins.cli.rep_mis --references raw/test.de --ar-output "$GREEDY" --hypotheses "variants/$NAME.hyp"
python "$ROOT/dev/decode_stats.py" "variants/$NAME.gen"
