# Sourced by the run_scripts: repository root, the venv, and the size preset.
#   PRESET=cpu (default): 2-layer 256-d models, one configuration per system, ~42 min on 2 CPU cores.
#   PRESET=cpu-long: the same models trained to convergence (teacher 1,500 updates, every student 4x the cpu
#     preset's updates), a second SAT configuration and fairseq's own NAT/CMLM for comparison, about 3 hours on 2 cores.
#   PRESET=gpu: transformer_iwslt_de_en-sized models in fp16 on one GPU, sized to finish in ~13 minutes there
#     (teacher 3,000 updates, students 600 each, side by side; examples/multi30k/README.md). GPU_PRESET_ON_CPU=1
#     rehearses it on the CPU (fp32; with smoke sizes: MAX_LINES, TEACHER_UPDATES, STUDENT_UPDATES).
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PRESET=${PRESET:-cpu}
case $PRESET in cpu|cpu-long|gpu) ;; *) echo "PRESET must be 'cpu', 'cpu-long' or 'gpu' (got '$PRESET')" >&2; exit 2 ;; esac
# the Python environment: ./.venv (run_scripts/setup_env.sh makes it), another venv (NAT_VENV=DIR), or
# NAT_VENV=system: the python3 on the PATH, which already has fairseq and this package (e.g. a GPU machine's)
# shellcheck disable=SC1091
[ "${NAT_VENV:-}" = system ] || source "${NAT_VENV:-$ROOT/.venv}/bin/activate"
# the repository's experiment catalogue (python -m nat_recipes.catalogue, .run_report, .train_speed) lies beside the
# package, not in it: the repository root on PYTHONPATH imports it from any working directory (once: every script
# sources this file; a PYTHONPATH that already names the root, as dev/before_after.sh sets it, is kept as it is)
case ":${PYTHONPATH:-}:" in *":$ROOT:"*) ;; *) export PYTHONPATH=$ROOT${PYTHONPATH:+:$PYTHONPATH} ;; esac
# glibc hands every freed block over 32 MiB back to the kernel, so each CPU training step page-faults its
# vocabulary-sized tensors in again. Keeping freed memory in the heap made every quickstart step 12-44% shorter on 2
# cores (docs/design-notes.md; peak memory ~1 GB higher). A GLIBC_TUNABLES you set is kept.
export GLIBC_TUNABLES=${GLIBC_TUNABLES:-glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=68719476736}
# fairseq's CLIs import the plugin from this directory (--user-dir), wherever the script is run from
USER_DIR=$ROOT/nat_plugins
if [ "$PRESET" = gpu ] && [ -z "${GPU_PRESET_ON_CPU:-}" ]; then
  DEVICE_ARGS=(--fp16)
else
  DEVICE_ARGS=(--cpu)
fi
# model sizes: the GPU preset uses the registered *_iwslt_de_en architectures (transformer_iwslt_de_en for the
# teacher); the CPU preset a 2-layer 256-d model. Students initialised from the teacher must match its size: with
# your own teacher (quickstart.sh's TEACHER=...), TEACHER_SHAPE holds its sizes and embedding sharing
# (python -m nat_plugins.cli.own_teacher shape), which replace the preset's.
CPU_MODEL_SIZE=(--encoder-layers 2 --decoder-layers 2 --encoder-embed-dim 256 --decoder-embed-dim 256
  --encoder-ffn-embed-dim 1024 --decoder-ffn-embed-dim 1024 --encoder-attention-heads 4 --decoder-attention-heads 4
  --share-all-embeddings)
arch_args() {  # arch_args BASE_ARCH -> the --arch option (and sizes) of the preset, in ARCH_ARGS
  if [ -n "${TEACHER_SHAPE:-}" ]; then read -r -a ARCH_ARGS <<< "--arch $1 $TEACHER_SHAPE"
  elif [ "$PRESET" = gpu ]; then ARCH_ARGS=(--arch "${1}_iwslt_de_en" --share-all-embeddings)
  else ARCH_ARGS=(--arch "$1" "${CPU_MODEL_SIZE[@]}"); fi
}
# the checkpoint a student's recipe leaves for decoding: the last (every preset's students train with a learning rate
# decaying to 0 and no validation, which on the GPU would cost 20-55 s of decoding each time)
STUDENT_CHECKPOINT=checkpoint_last.pt
# gpu: the teacher validates (decodes the validation set) and saves every 1,000 updates, not at every epoch's end
GPU_VALIDATION=(--validate-interval 1000 --save-interval 1000 --validate-interval-updates 1000
  --save-interval-updates 1000 --keep-interval-updates 1)
# student_args RECIPE: STUDENT_ARGS, the training options every plugin model (student) shares, with RECIPE's number of
# updates (also left in STUDENT_UPDATES), learning rate and warm-up on PRESET: the catalogue's budgets
# (their systems' blocks in nat_recipes/catalogue.py; STUDENT_UPDATES set beforehand replaces every recipe's updates).
# Updates of 4,096 tokens on the CPU presets, 8,192 on the GPU. No preset validates a student (STUDENT_VALIDATE=1
# does): its last checkpoint is decoded.
student_args() {
  local budget lr warmup
  budget=$(python -m nat_recipes.catalogue budget --preset "$PRESET" ${STUDENT_UPDATES:+--updates "$STUDENT_UPDATES"} "$1")
  read -r STUDENT_UPDATES lr warmup <<< "$budget"
  if [ "$PRESET" = gpu ]; then
    STUDENT_ARGS=(--max-tokens 8192 --max-update "$STUDENT_UPDATES" --lr "$lr" --warmup-updates "$warmup" --dropout 0.3)
  else
    STUDENT_ARGS=(--max-tokens 4096 --max-update "$STUDENT_UPDATES" --lr "$lr" --warmup-updates "$warmup" --dropout 0.1)
  fi
  # the learning rate decays linearly to 0 over the run (a student's last updates count: with a constant rate its
  # BLEU swings by many points from one checkpoint to the next, tests/test_sat.py)
  # no validation in the quickstart's presets; the long recipes (examples/benchmark_recipe.sh) set STUDENT_VALIDATE=1
  [ -n "${STUDENT_VALIDATE:-}" ] || STUDENT_ARGS+=(--disable-validation)
  STUDENT_ARGS+=(--optimizer adam --adam-betas '(0.9, 0.98)'
    --lr-scheduler polynomial_decay --total-num-update "$STUDENT_UPDATES" --weight-decay 0.0001
    --no-epoch-checkpoints --log-format simple --log-interval 20 --seed 1 --no-progress-bar)
}
# teacher_args [CALLER_ARGS]: TEACHER_ARGS, how the teacher trains on PRESET (run_scripts/train_teacher.sh) apart from
# its architecture and loss: batch size, updates (TEACHER_UPDATES), schedule, optimiser, validation, checkpoint
# selection, seed 1. Encoder-NAD-AD (examples/multi30k/nad_ad.sh) trains from scratch so, the paper's protocol: the
# teacher is its AR twin.
teacher_args() {
  local warmup size selection
  if [ "$PRESET" = gpu ]; then
    # transformer_iwslt_de_en-sized, fairseq's recipe for that size: 8k tokens a batch, lr 5e-4 with an inverse square
    # root schedule after 1,000 warm-up updates, 3,000 updates (~3 min at ~17 updates/s on an H200). The same model
    # trained so reached 38.4 BLEU on Multi30k (beam 4); a linear decay to 0 over 1,500 updates of 16k tokens at lr 1e-3
    # stopped at 24.0 while still rising, its fp16 loss scale falling from 128 to 8 (docs/results.md, GPU section).
    # TEACHER_UPDATES changes it (the warm-up stays a third of it, at most 1,000); a beam-4 validation every 1,000
    # updates (GPU_VALIDATION) selects the checkpoint
    TEACHER_UPDATES=${TEACHER_UPDATES:-3000}
    warmup=$(( TEACHER_UPDATES / 3 < 1000 ? TEACHER_UPDATES / 3 + 1 : 1000 ))
    size=(--max-tokens 8192 --max-update "$TEACHER_UPDATES" --lr 5e-4 --warmup-updates "$warmup" --dropout 0.3
          "${GPU_VALIDATION[@]}")
    # a schedule among the caller's options (examples/*/train.sh) replaces this one
    case " $* " in *" --lr-scheduler "*) ;; *) size+=(--lr-scheduler inverse_sqrt --warmup-init-lr 1e-7) ;; esac
    selection=(--eval-bleu --eval-bleu-args '{"beam": 4, "max_len_a": 1.2, "max_len_b": 10}' --eval-bleu-detok space
      --eval-bleu-remove-bpe sentencepiece --best-checkpoint-metric bleu --maximize-best-checkpoint-metric)
  else
    # a 2-layer 256-d model worth distilling from in ~10 CPU minutes: 500 updates (~4 epochs) with the learning rate
    # decaying linearly to 0 (a teacher stopped early while its loss still falls fast stutters);
    # checkpoints are selected by validation loss (no validation decoding: the last one is the best). Measured: 450
    # updates leave 5.3% immediately repeated subwords in the beam-4 distilled targets, 500 updates 3.9%
    # PRESET=cpu-long trains it to convergence: 1,500 updates (~12 epochs), validation loss logged every 250
    if [ "$PRESET" = cpu-long ]; then TEACHER_UPDATES=${TEACHER_UPDATES:-1500}; warmup=180
    else TEACHER_UPDATES=${TEACHER_UPDATES:-500}; warmup=60; fi
    selection=()
    size=(--max-tokens 4096 --max-update "$TEACHER_UPDATES" --lr 2e-3 --warmup-updates "$warmup" --dropout 0.1
          --lr-scheduler polynomial_decay --total-num-update "$TEACHER_UPDATES"
          --validate-interval 1000 --save-interval 1000 --save-interval-updates 250 --keep-interval-updates 1)
    # (fairseq validates, i.e. decodes the validation set, at each interval save and at the end)
  fi
  TEACHER_ARGS=("${size[@]}" --optimizer adam --adam-betas '(0.9, 0.98)' --clip-norm 0.0 --weight-decay 0.0001
    "${selection[@]}" --no-epoch-checkpoints --log-format simple --log-interval 50 --seed 1)
}
# the training command of every recipe: fairseq-train, or a tool taking the same options (run_scripts/train_speed.sh
# sets FAIRSEQ_TRAIN to nat_recipes.train_speed to time the recipes on the same batches)
read -r -a FAIRSEQ_TRAIN <<< "${FAIRSEQ_TRAIN:-fairseq-train}"
log() { echo "[$(basename "$0") $(date +%H:%M:%S)] $*"; }
distilled_target_lang() {  # distilled_target_lang DATA_BIN: TGT, the language of DATA_BIN/train.kd.TGT.{bin,idx}
  local idx
  idx=$(find "$1" -maxdepth 1 -name 'train.kd.*.idx' | head -n 1)
  if [ -z "$idx" ]; then
    echo "$(basename "$0"): no $1/train.kd.TGT.bin/.idx: distil the training set first" \
      "(bash run_scripts/distill.sh $1 TEACHER_CKPT)" >&2
    exit 1
  fi
  TGT=${idx##*/train.kd.}; TGT=${TGT%.idx}
}
