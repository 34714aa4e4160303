#!/usr/bin/env bash
# Speculative decoding (Xia et al. 2023) on Multi30k: a non-autoregressive drafter proposes the next K tokens given
# the accepted prefix, the AR teacher verifies them in one call and keeps the longest agreeing prefix plus its own
# next token, so exact verification outputs the teacher's greedy translation token for token. The drafter's encoder,
# embeddings and decoder layers start as the teacher's (--init-from-ar); its decoder is shallow (DRAFTER_LAYERS,
# default 1 on the CPU presets, where the teacher has 2 decoder layers; 2 with PRESET=gpu, the teacher has 6), and it
# is trained on the teacher's greedy outputs (train.kd_greedy.TGT, distilled by this script when absent: the drafts
# must be what exact verification accepts, the teacher's argmax) with spec_drafter_loss: cross-entropy of the K draft
# slots after every prefix of each target. Each prefix token's input adds the teacher's decoder state before it
# (--read-teacher-states, read from --spec-drafter-teacher in training and from the verifier when decoding: 2.27 ->
# 2.34 tokens per teacher call on the CPU quickstart's teacher, for 14% more training time; docs/design-notes.md).
#   [PRESET=cpu|gpu] [DRAFTER_LAYERS=N] bash examples/multi30k/spec_drafter.sh DATA_BIN TEACHER_CKPT SAVE_DIR K [fairseq-train args]
# Decode (the teacher verifies; --spec-drafter-verify relaxed trades exactness for longer accepted runs):
#   fairseq-generate DATA_BIN --user-dir nat_plugins --task translation_nat --path SAVE_DIR/checkpoint_*.pt \
#     --spec-drafter-teacher TEACHER_CKPT --beam 1 --print-step [--spec-drafter-verify relaxed --spec-drafter-beta 3 --spec-drafter-tau 1]
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../../run_scripts/common.sh"
usage="usage: spec_drafter.sh DATA_BIN TEACHER_CKPT SAVE_DIR K [fairseq-train args]"
DATA_BIN=${1:?$usage}; TEACHER=${2:?$usage}; SAVE_DIR=${3:?$usage}; K=${4:?$usage}
shift 4
[ -f "$TEACHER" ] || { echo "spec_drafter.sh: teacher checkpoint $TEACHER does not exist" >&2; exit 1; }
if [ "$PRESET" = gpu ]; then DRAFTER_LAYERS=${DRAFTER_LAYERS:-2}; else DRAFTER_LAYERS=${DRAFTER_LAYERS:-1}; fi
# beam outputs (the students' train.kd) are not what exact verification accepts: a drafter trained on them learns
# drafts the teacher rejects (docs/design-notes.md: 1.72 -> 1.91 tokens per teacher call on greedy outputs)
if ! compgen -G "$DATA_BIN/train.kd_greedy.*.idx" > /dev/null; then
  log "distilling the training set with the teacher's greedy search (train.kd_greedy.*, once per data-bin)"
  DISTILL_BEAM=1 bash "$ROOT/run_scripts/distill.sh" "$DATA_BIN" "$TEACHER" --output-name kd_greedy
fi
arch_args spec_drafter
student_args spec-drafter  # updates, learning rate, warm-up: nat_recipes/catalogue.py
# CPU presets: updates of 512 tokens (the drafter learns per update more than per sentence; the catalogue's budget)
[ "$PRESET" = gpu ] || STUDENT_ARGS+=(--max-tokens 512)
# --freeze-encoder: the teacher's encoder pass serves both models when decoding, at the same acceptance (1.89 against
# 1.91 tokens per call; docs/design-notes.md)
STUDENT_ARGS+=(--freeze-encoder --read-teacher-states)
exec "${FAIRSEQ_TRAIN[@]}" "$DATA_BIN" --user-dir "$USER_DIR" --task translation_nat "${DEVICE_ARGS[@]}" \
  "${ARCH_ARGS[@]}" --decoder-layers "$DRAFTER_LAYERS" "${STUDENT_ARGS[@]}" --draft-size "$K" \
  --init-from-ar "$TEACHER" --use-distilled target --distilled-name kd_greedy --criterion spec_drafter_loss --label-smoothing 0.1 \
  --spec-drafter-teacher "$TEACHER" --eval-bleu-args '{"beam": 1}' --save-dir "$SAVE_DIR" "$@"
