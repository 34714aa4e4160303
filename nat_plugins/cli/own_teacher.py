"""Bring your own teacher: what the quickstart needs to accelerate a fairseq Transformer it did not train.

    TEACHER=path/checkpoint.pt DATA_BIN=path/data-bin bash run_scripts/quickstart.sh   # runs these:
    python -m nat_plugins.cli.own_teacher shape TEACHER DATA_BIN        # checks the teacher; its shape's options
    python -m nat_plugins.cli.own_teacher check DATA_BIN [--reference REFERENCE]   # every other input, before step 1
    python -m nat_plugins.cli.own_teacher post-process DATA_BIN         # sentencepiece, subword_nmt or none
    python -m nat_plugins.cli.own_teacher reference DATA_BIN OUT --post-process P   # the test targets as text

``shape`` refuses, naming the file and what to do, a checkpoint that is not a fairseq translation Transformer (a
language model, another architecture, a nat_plugins or fairseq NAT model, a Transformer whose decoder the exact rows
would not reproduce: ``--cross-self-attention``, an adaptive softmax, NormFormer) or one trained with other
dictionaries than DATA_BIN's; else it prints the fairseq-train options that give a student the teacher's shape
(layers, sizes, heads, pre-/post-norm, shared embeddings, positions), which every recipe then uses instead of the
quickstart's 2-layer 256-d size, so that ``--init-from-ar`` copies the teacher's weights into it. A teacher of a
multilingual or denoising task (mBART, BART) is refused for the language or ``<mask>`` tokens its task appended to the
dictionaries. ``check`` finds what the steps would find late (after distillation and training, or as a traceback): a
DATA_BIN without its dictionaries or test split, a REFERENCE that is missing or not a line per test sentence.
"""

import argparse
import os
import sys
from typing import List, Sequence, Tuple

from fairseq import checkpoint_utils
from fairseq.data import Dictionary, data_utils
from fairseq.models import ARCH_MODEL_REGISTRY, MODEL_REGISTRY
from fairseq.models.transformer import TransformerModel

from ..modules.teacher import check_teacher_dictionaries, checkpoint_arch, refuse_non_autoregressive

OPTION = "TEACHER"
FIX = (
    "pass a checkpoint of fairseq's transformer architecture (--arch transformer or a transformer_* preset, --task "
    "translation) trained on this DATA_BIN, or train one with the quickstart (leave TEACHER unset)"
)
# the teacher's shape: (config field, fairseq-train option) of every size and every flag a student must copy
SIZES = (
    ("encoder_layers", "--encoder-layers"),
    ("decoder_layers", "--decoder-layers"),
    ("encoder_embed_dim", "--encoder-embed-dim"),
    ("decoder_embed_dim", "--decoder-embed-dim"),
    ("encoder_ffn_embed_dim", "--encoder-ffn-embed-dim"),
    ("decoder_ffn_embed_dim", "--decoder-ffn-embed-dim"),
    ("encoder_attention_heads", "--encoder-attention-heads"),
    ("decoder_attention_heads", "--decoder-attention-heads"),
    ("decoder_output_dim", "--decoder-output-dim"),
    ("activation_fn", "--activation-fn"),
    ("max_source_positions", "--max-source-positions"),
    ("max_target_positions", "--max-target-positions"),
)
FLAGS = (
    ("encoder_normalize_before", "--encoder-normalize-before"),
    ("decoder_normalize_before", "--decoder-normalize-before"),
    ("share_all_embeddings", "--share-all-embeddings"),
    ("share_decoder_input_output_embed", "--share-decoder-input-output-embed"),
    ("encoder_learned_pos", "--encoder-learned-pos"),
    ("decoder_learned_pos", "--decoder-learned-pos"),
    ("no_scale_embedding", "--no-scale-embedding"),
    ("layernorm_embedding", "--layernorm-embedding"),
    ("no_token_positional_embeddings", "--no-token-positional-embeddings"),
)
# options whose decoder the exact rows (verify-accept's layer-by-layer forward) would not reproduce
UNSUPPORTED = (
    ("cross_self_attention", "--cross-self-attention"),
    ("adaptive_softmax_cutoff", "--adaptive-softmax-cutoff"),
    ("scale_attn", "NormFormer's --scale-attn"),
    ("scale_fc", "NormFormer's --scale-fc"),
    ("scale_heads", "NormFormer's --scale-heads"),
    ("scale_resids", "NormFormer's --scale-resids"),
)
# fairseq tasks that append tokens to the data-bin's dictionaries, which the students' and the benchmark's
# --task translation on DATA_BIN would not have
LANGUAGE_TOKENS = "a language token per language (__en__, ...)"
APPENDING_TASKS = {
    "translation_multi_simple_epoch": LANGUAGE_TOKENS,
    "multilingual_translation": LANGUAGE_TOKENS,
    "multilingual_denoising": "a language token per language ([en_XX], ...) and <mask> (mBART)",
    "translation_from_pretrained_bart": "a language token per language ([en_XX], ...) and <mask> (an mBART fine-tune)",
    "denoising": "<mask> (BART)",
}


class TeacherError(ValueError):
    """A checkpoint the quickstart cannot take as the teacher (the message says why and what to do)."""


def language_pair(data_bin: str) -> Tuple[str, str]:
    """The source and target languages of ``data_bin`` (from its train files, as fairseq infers them)."""
    if not os.path.isdir(data_bin):
        raise TeacherError(f"DATA_BIN {data_bin!r} is not a directory (the output of fairseq-preprocess)")
    src, tgt = data_utils.infer_language_pair(data_bin)
    if src is None or tgt is None:
        raise TeacherError(
            f"DATA_BIN {data_bin!r} has no train.SRC-TGT.SRC.idx file: pass the directory fairseq-preprocess wrote "
            "(train, valid and test splits)"
        )
    return src, tgt


def dictionaries(data_bin: str) -> Tuple[Dictionary, Dictionary]:
    """The source and target dictionaries of ``data_bin``."""
    paths = [os.path.join(data_bin, f"dict.{lang}.txt") for lang in language_pair(data_bin)]
    for path, side in zip(paths, ("source", "target")):
        if not os.path.isfile(path):
            raise TeacherError(
                f"DATA_BIN {data_bin!r} has no {os.path.basename(path)} ({path}): copy the {side} dictionary the "
                "teacher was trained with there (fairseq-preprocess writes it beside the splits)"
            )
    return tuple(Dictionary.load(path) for path in paths)


def appended_tokens(state, task: str, data_bin: str) -> str:
    """What the teacher's ``task`` appended to the dictionaries, in words ("" for none): named by the task, else its
    source embeddings longer than ``data_bin``'s dictionary by the number of languages its task config names, or one
    more (``<mask>``): a task of another --user-dir."""
    task_cfg = state["cfg"].get("task")
    if task in APPENDING_TASKS:
        return f"fairseq's {task} task appended {APPENDING_TASKS[task]}"
    langs = getattr(task_cfg, "langs", None) or getattr(task_cfg, "lang_pairs", None)
    langs = sorted(set(langs.replace("-", ",").split(",") if isinstance(langs, str) else langs or ()))
    rows = state["model"].get("encoder.embed_tokens.weight")
    if langs and rows is not None and rows.size(0) - len(dictionaries(data_bin)[0]) in (len(langs), len(langs) + 1):
        return f"its task {task} appended a token per language it names ({', '.join(langs)}), perhaps <mask> too"
    return ""


def checked_model_cfg(path: str, data_bin: str):
    """The model config of the teacher checkpoint ``path`` after the checks of the module docstring."""
    if not os.path.isfile(path):
        raise TeacherError(f"{OPTION} {path!r} does not exist: {FIX}")
    try:
        state = checkpoint_utils.load_checkpoint_to_cpu(path)
    except Exception as err:  # a corrupt file, another format: say which file
        raise TeacherError(
            f"{OPTION} {path!r} is not a fairseq checkpoint ({type(err).__name__}: {err}): {FIX}"
        ) from err
    cfg = state.get("cfg") or {}
    task = getattr(cfg.get("task"), "_name", None) or getattr(cfg.get("task"), "task", None)
    arch = checkpoint_arch(state)
    if (task is not None and "language_model" in task) or "lm" in str(arch).split("_"):
        raise TeacherError(
            f"{OPTION} {path!r} is a language model (task {task}, arch {arch}), not a translation model: {FIX}"
        )
    appended = appended_tokens(state, task, data_bin)
    if appended:
        raise TeacherError(
            f"{OPTION} {path!r} reads other token ids than DATA_BIN's: {appended} to the dictionaries it was trained "
            "with, which the students and the benchmark (--task translation on DATA_BIN's dictionaries) would not "
            f"have: {FIX}"
        )
    try:
        refuse_non_autoregressive(state, path, OPTION)
    except ValueError as err:
        raise TeacherError(str(err)) from None
    cls = ARCH_MODEL_REGISTRY.get(arch) or MODEL_REGISTRY.get(arch)
    if cls is None or not issubclass(cls, TransformerModel):
        what = "an architecture this fairseq does not know" if cls is None else f"a {cls.__name__}"
        raise TeacherError(f"{OPTION} {path!r} is {arch!r} ({what}), not fairseq's Transformer: {FIX}")
    model_cfg = cfg["model"]
    for field, option in UNSUPPORTED:
        if getattr(model_cfg, field, None):
            raise TeacherError(
                f"{OPTION} {path!r} was trained with {option}: the exact rows recompute fairseq's Transformer decoder "
                f"layer by layer without it, so they would not print this teacher's output. {FIX}"
            )
    try:
        check_teacher_dictionaries(state, dictionaries(data_bin), OPTION, path, FIX)
    except ValueError as err:
        raise TeacherError(str(err)) from None
    return model_cfg


def shape_options(model_cfg) -> List[str]:
    """The fairseq-train options that give a student ``model_cfg``'s shape (sizes, flags that are on)."""
    words = []
    for field, option in SIZES:
        value = getattr(model_cfg, field, None)
        if value is not None:
            words += [option, str(value)]
    words += [option for field, option in FLAGS if getattr(model_cfg, field, False)]
    return words


def detect_post_process(data_bin: str) -> str:
    """fairseq's ``--post-process`` for ``data_bin``'s target subwords: ``sentencepiece`` (▁ word starts),
    ``subword_nmt`` (fastBPE / subword-nmt's ``@@`` continuations) or ``none`` (words)."""
    symbols = dictionaries(data_bin)[1].symbols
    words = [s for s in symbols if not (s.startswith("<") and s.endswith(">")) and s != "madeupword"]
    if not words:
        return "none"
    if sum(s.startswith("\u2581") for s in words) > 0.2 * len(words):
        return "sentencepiece"
    if sum(s.endswith("@@") for s in words) > 0.05 * len(words):
        return "subword_nmt"
    return "none"


def write_reference(data_bin: str, out: str, post_process: str, split: str = "test") -> int:
    """Write ``split``'s targets of ``data_bin`` to ``out``, a line each, subwords joined by ``post_process`` (the
    text the benchmark scores against; tokenized where the data was). Returns the number of lines."""
    src, tgt = language_pair(data_bin)
    dictionary = dictionaries(data_bin)[1]
    prefix = os.path.join(data_bin, f"{split}.{src}-{tgt}.{tgt}")
    dataset = data_utils.load_indexed_dataset(prefix, dictionary)
    if dataset is None:
        raise TeacherError(f"DATA_BIN {data_bin!r} has no {split} split ({prefix}.bin/.idx): binarize one")
    post = None if post_process == "none" else post_process
    with open(out + ".tmp", "w", encoding="utf-8") as f:
        for i in range(len(dataset)):
            f.write(dictionary.string(dataset[i], post) + "\n")
    os.replace(out + ".tmp", out)
    return len(dataset)


def checked_test_split(data_bin: str) -> int:
    """The number of sentences of ``data_bin``'s test split, after checking that its train and test splits and its
    dictionaries are there (distillation and training read the first, the benchmark the second)."""
    src, tgt = language_pair(data_bin)
    dictionary = dictionaries(data_bin)[1]
    for split in ("train", "test"):
        missing = [
            f"{split}.{src}-{tgt}.{lang}.{ext}"
            for lang in (src, tgt)
            for ext in ("bin", "idx")
            if not os.path.isfile(os.path.join(data_bin, f"{split}.{src}-{tgt}.{lang}.{ext}"))
        ]
        if missing:
            raise TeacherError(
                f"DATA_BIN {data_bin!r} has no {split} split ({', '.join(missing)} missing): the quickstart "
                f"{'distils and trains on' if split == 'train' else 'benchmarks on'} it; binarize it with "
                f"fairseq-preprocess --{split}pref ... --srcdict {data_bin}/dict.{src}.txt --tgtdict "
                f"{data_bin}/dict.{tgt}.txt (the teacher's dictionaries) --destdir DATA_BIN"
            )
    return len(data_utils.load_indexed_dataset(os.path.join(data_bin, f"test.{src}-{tgt}.{tgt}"), dictionary))


def check_inputs(data_bin: str, reference: str = None) -> None:
    """Refuse, before the quickstart's first step, a ``data_bin`` without what its steps read
    (:func:`checked_test_split`) and a given ``reference`` that is not a line per test sentence: a missing one would be
    written with the data-bin's targets (``<unk>`` for every word the dictionary lacks), a shorter or longer one
    scores every row against the wrong sentences."""
    sentences = checked_test_split(data_bin)
    if reference is None:
        return
    fix = (
        f"give the raw target side of DATA_BIN's test split, a line per sentence in its order ({sentences} lines), or "
        "leave REFERENCE unset to score against the split's targets as the data-bin holds them"
    )
    if not os.path.isfile(reference):
        raise TeacherError(f"REFERENCE {reference!r} does not exist: {fix}")
    with open(reference, encoding="utf-8", errors="replace") as f:
        lines = sum(1 for _ in f)
    if lines != sentences:
        raise TeacherError(
            f"REFERENCE {reference!r} has {lines} lines, DATA_BIN's test split {sentences} sentences: {fix}"
        )


def main(argv: Sequence[str] = None):
    parser = argparse.ArgumentParser(prog="python -m nat_plugins.cli.own_teacher", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    shape = commands.add_parser("shape", help="check TEACHER against DATA_BIN; print its shape's fairseq-train options")
    shape.add_argument("teacher", help="the teacher's checkpoint (a fairseq translation Transformer)")
    shape.add_argument("data_bin", help="the data-bin it was trained on (fairseq-preprocess output)")
    check = commands.add_parser("check", help="check DATA_BIN's splits and dictionaries, and REFERENCE's lines")
    check.add_argument("data_bin")
    check.add_argument("--reference", help="the raw test targets the benchmark scores against (a line per sentence)")
    post = commands.add_parser("post-process", help="print DATA_BIN's --post-process (sentencepiece|subword_nmt|none)")
    post.add_argument("data_bin")
    reference = commands.add_parser("reference", help="write DATA_BIN's test targets as text to OUT")
    reference.add_argument("data_bin")
    reference.add_argument("out")
    reference.add_argument("--post-process", required=True, help="how subwords are joined (post-process's output)")
    args = parser.parse_args(argv)
    try:
        if args.command == "shape":
            print(" ".join(shape_options(checked_model_cfg(args.teacher, args.data_bin))))
        elif args.command == "check":
            check_inputs(args.data_bin, args.reference)
        elif args.command == "post-process":
            print(detect_post_process(args.data_bin))
        else:
            write_reference(args.data_bin, args.out, args.post_process)
    except TeacherError as err:
        print(f"own_teacher {args.command}: {err}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
