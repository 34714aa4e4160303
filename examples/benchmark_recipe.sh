# Sourced by examples/iwslt14/train.sh and examples/wmt14/train.sh after they set the benchmark's settings:
#   SUFFIX        the registered size preset: iwslt_de_en | wmt_en_de (arch SYSTEM_SUFFIX, teacher transformer_SUFFIX)
#   TEACHER_ARGS  fairseq-train options of the teacher (batch, schedule, updates, dropout)
#   STUDENT_ARGS  fairseq-train options every student adds to its system recipe (batch, validation interval)
#   STUDENT_UPDATES  updates of every student; STUDENT_DROPOUT  their dropout (blockwise's frozen stage keeps 0)
# Every system's options (criterion, initialisation from the teacher, K, λ, q, annealing) are those of the
# dataset-independent system recipes in examples/multi30k/*.sh under PRESET=gpu; the benchmark's options come after
# them on the command line, and fairseq-train keeps an option's last value.
#   train.sh teacher DATA_BIN SAVE_DIR [fairseq-train args]
#   train.sh sat|recover_sat DATA_BIN TEACHER_CKPT SAVE_DIR K [fairseq-train args]
#   train.sh blockwise DATA_BIN INIT_CKPT SAVE_DIR K frozen|finetuned [fairseq-train args]
#   train.sh fertility_nat|nad_ad|ar_baseline DATA_BIN TEACHER_CKPT SAVE_DIR [fairseq-train args]
export PRESET=gpu STUDENT_UPDATES STUDENT_VALIDATE=1
RECIPES=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(dirname "$RECIPES")
usage="usage: $0 teacher|sat|recover_sat|blockwise|fertility_nat|nad_ad|ar_baseline DATA_BIN ... (see $0)"
SYSTEM=${1:?$usage}
shift
case $SYSTEM in
  teacher) BASE=transformer; SCRIPT=$ROOT/run_scripts/train_teacher.sh; POSITIONAL=2; EXTRA=("${TEACHER_ARGS[@]}") ;;
  sat) BASE=sat_transformer; POSITIONAL=4 ;;
  recover_sat) BASE=recover_sat; POSITIONAL=4 ;;
  blockwise) BASE=blockwise_transformer; POSITIONAL=5 ;;
  fertility_nat) BASE=fertility_nat; POSITIONAL=3 ;;
  nad_ad) BASE=nad_ad_transformer; POSITIONAL=3 ;;
  ar_baseline) BASE=transformer; POSITIONAL=3 ;;
  *) echo "unknown system '$SYSTEM'; $usage" >&2; exit 2 ;;
esac
if [ $# -lt "$POSITIONAL" ]; then echo "$SYSTEM needs $POSITIONAL arguments; $usage" >&2; exit 2; fi
if [ "$SYSTEM" != teacher ]; then
  SCRIPT=$RECIPES/multi30k/$SYSTEM.sh
  EXTRA=("${STUDENT_ARGS[@]}")
  if [ "$SYSTEM" != blockwise ] || [ "$5" != frozen ]; then EXTRA+=(--dropout "$STUDENT_DROPOUT"); fi
fi
ARCH=${BASE}_$SUFFIX
# blockwise_transformer has the Transformer base sizes (transformer_wmt_en_de's); it registers no _wmt_en_de alias
if [ "$ARCH" = blockwise_transformer_wmt_en_de ]; then ARCH=blockwise_transformer; fi
exec bash "$SCRIPT" "${@:1:$POSITIONAL}" --arch "$ARCH" "${EXTRA[@]}" "${@:$((POSITIONAL + 1))}"
