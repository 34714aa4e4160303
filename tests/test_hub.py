"""The Python API (nat_plugins.hub): translate() == fairseq-generate for every system, per-call decoding options
that do not leak into the next call, drafts/segments as data, and the sentencepiece model applied automatically."""

import argparse
import dataclasses
import os

import pytest
import torch
from fairseq import options
from fairseq.dataclass.utils import convert_namespace_to_omegaconf, gen_parser_from_dataclass
from fairseq.models import MODEL_REGISTRY
from fairseq.tasks.translation import TranslationConfig

from nat_plugins.generators.base import option_owners
from nat_plugins.hub import NATHubInterface, from_pretrained
from nat_plugins.tasks.translation_nat import DECODING_CONFIGS, DECODING_OPTIONS, TranslationNATConfig, segments_string

from .test_blockwise import TINY_BLOCKWISE
from .test_fertility_nat import TINY_FNAT
from .test_nad_ad import TRAIN_ARGS as NAD_AD_ARGS
from .test_nad_ad import distilled_bin  # noqa: F401  (fixture)
from .test_recover_sat import TINY_RECOVER_SAT
from .test_sat import TINY_SAT
from .utils import DRAFT_EVERY_STEP, TINY_TRANSFORMER, binarize, generate_lines, hypotheses, train_model

TASK = ["--task", "translation_nat"]


@pytest.fixture(scope="module")
def systems(dummy_data_bin, fert_data_bin, distilled_bin, tiny_teacher, tmp_path_factory):  # noqa: F811
    """``{system: (checkpoint, data_bin)}`` of tiny models initialised from the teacher."""
    specs = {
        "sat": (
            dummy_data_bin,
            TINY_SAT + TASK + ["--criterion", "label_smoothed_cross_entropy", "--group-size", "2"],
            8,
        ),
        "blockwise": (
            dummy_data_bin,
            TINY_BLOCKWISE + TASK + ["--block-size", "3", "--criterion", "blockwise_loss"],
            8,
        ),
        "fertility_nat": (fert_data_bin, TINY_FNAT + TASK + ["--criterion", "fertility_nat_loss"], 10),
        "nad_ad": (distilled_bin, NAD_AD_ARGS, 8),
        "recover_sat": (
            dummy_data_bin,
            TINY_RECOVER_SAT
            + TASK
            + ["--criterion", "recover_sat_loss", "--num-segments", "3", "--anneal-steps", "10"],
            8,
        ),
    }
    result = {}
    for name, (data_bin, args, updates) in specs.items():
        save_dir = str(tmp_path_factory.mktemp(f"hub-{name}"))
        result[name] = (train_model(data_bin, save_dir, args + ["--init-from-ar", tiny_teacher], updates), data_bin)
    return result


@pytest.fixture(scope="module")
def sources(dummy_raw):
    with open(os.path.join(dummy_raw, "test.src")) as f:
        return [line.strip() for line in f]


def load(systems, name):
    checkpoint, data_bin = systems[name]
    return from_pretrained(os.path.dirname(checkpoint), os.path.basename(checkpoint), data_bin, bpe=None)


def steps_of(hub, sentences, **options):
    return [hypos[0]["steps"] for hypos in hub.generate([hub.encode(s) for s in sentences], **options)]


@pytest.mark.parametrize(
    "name, options, cli",
    [
        ("sat", {"beam": 1}, ["--beam", "1"]),
        ("sat", {"beam": 2}, ["--beam", "2"]),
        ("blockwise", {}, ["--beam", "1"]),
        (
            "blockwise",
            {"block_accept": "topk:2", "min_block_size": 2},
            ["--beam", "1", "--block-accept", "topk:2", "--min-block-size", "2"],
        ),
        ("fertility_nat", {}, ["--beam", "1"]),
        (  # the sampled candidates depend on the batch (fertility_nat_decoding.py): ranked by eq. 8's sum, this tiny
            # NAT keeps its argmax candidate, so the hub's batches and fairseq-generate's print the same
            "fertility_nat",
            {"fertility_decoding": "npd", "npd_samples": 4, "npd_teacher": "TEACHER", "npd_ranking": "sum"},
            ["--beam", "1", "--fertility-decoding", "npd", "--npd-samples", "4", "--npd-teacher", "TEACHER"]
            + ["--npd-ranking", "sum"],
        ),
        ("nad_ad", {"beam": 4}, ["--beam", "4"]),
        ("nad_ad", {"beam": 1, "lenpen": 0.5}, ["--beam", "1", "--lenpen", "0.5"]),
        ("recover_sat", {}, ["--beam", "1"]),
    ],
)
def test_translate_equals_fairseq_generate(systems, sources, tiny_teacher, name, options, cli):
    options = {k: tiny_teacher if v == "TEACHER" else v for k, v in options.items()}
    cli = [tiny_teacher if a == "TEACHER" else a for a in cli]
    checkpoint, data_bin = systems[name]
    expected = hypotheses(generate_lines(data_bin, checkpoint, TASK + cli))
    assert load(systems, name).translate(sources, **options) == [expected[i] for i in range(len(sources))]


@pytest.fixture(scope="module")
def drafter_checkpoint(dummy_data_bin, tiny_teacher, tmp_path_factory):
    """A spec_drafter (k=3) initialised from the tiny teacher and trained 8 updates on the real targets."""
    args = ["--arch", "spec_drafter", "--draft-size", "3"] + TINY_TRANSFORMER[2:] + TASK
    args += ["--criterion", "spec_drafter_loss", "--init-from-ar", tiny_teacher]
    return train_model(dummy_data_bin, str(tmp_path_factory.mktemp("hub-spec_drafter")), args, max_update=8)


def steps_printed(lines):
    """``{sentence id: decoder calls}`` of fairseq-generate's ``--print-step`` lines."""
    return {int(line.split("\t")[0][2:]): int(line.split("\t")[1]) for line in lines if line.startswith("I-")}


@pytest.mark.parametrize(
    "options, cli",
    [
        ({"max_drafting_sentences": DRAFT_EVERY_STEP}, ["--max-drafting-sentences", str(DRAFT_EVERY_STEP)]),
        (
            {"spec_drafter_verify": "relaxed", "spec_drafter_beta": 3, "spec_drafter_tau": 3.0},
            ["--spec-drafter-verify", "relaxed", "--spec-drafter-beta", "3", "--spec-drafter-tau", "3.0"],
        ),
    ],
)
def test_speculative_translate_equals_fairseq_generate(
    dummy_data_bin, drafter_checkpoint, tiny_teacher, sources, options, cli
):
    """A spec_drafter checkpoint behind the hub with the teacher given per call (``spec_drafter_teacher=``): the
    hypotheses and the teacher calls per sentence are fairseq-generate's with ``--spec-drafter-teacher``; exact
    verification prints the teacher's own greedy output (fairseq's SequenceGenerator, beam 1), relaxed verification
    (per-call options too) needs fewer teacher calls. The options do not stay on the task after the call. Exact
    verification drafts at every step here: its calls per sentence then do not depend on how the hub and
    fairseq-generate batch the sentences."""
    lines = generate_lines(
        dummy_data_bin,
        drafter_checkpoint,
        TASK + ["--beam", "1", "--print-step", "--spec-drafter-teacher", tiny_teacher] + cli,
    )
    expected, expected_steps = hypotheses(lines), steps_printed(lines)
    assert sorted(expected) == list(range(len(sources)))
    hub = from_pretrained(
        os.path.dirname(drafter_checkpoint), os.path.basename(drafter_checkpoint), dummy_data_bin, bpe=None
    )
    options = {"spec_drafter_teacher": tiny_teacher, **options}
    assert hub.translate(sources, **options) == [expected[i] for i in range(len(sources))]
    steps = steps_of(hub, sources, **options)
    assert steps == [expected_steps[i] for i in range(len(sources))]
    assert hub.task.cfg.spec_drafter_teacher is None and hub.task.cfg.spec_drafter_verify == "exact"

    if options.get("spec_drafter_verify", "exact") == "exact":
        teacher = hypotheses(generate_lines(dummy_data_bin, tiny_teacher, TASK + ["--beam", "1"]))
        assert expected == teacher
        words = sum(len(expected[i].split()) + 1 for i in range(len(sources)))  # EOS included
        assert sum(steps) < words  # some teacher calls accepted drafts
    else:
        exact = steps_of(hub, sources, spec_drafter_teacher=tiny_teacher)
        assert sum(steps) < sum(exact)


def test_per_call_options_apply_and_do_not_leak(systems, sources, tiny_teacher):
    blockwise = load(systems, "blockwise")
    exact = blockwise.translate(sources)
    exact_steps = steps_of(blockwise, sources)
    relaxed_steps = steps_of(blockwise, sources, block_accept="topk:2", min_block_size=2)
    assert sum(relaxed_steps) < sum(exact_steps)
    assert blockwise.task.cfg.block_accept == "exact" and blockwise.task.cfg.min_block_size == 1
    assert blockwise.translate(sources) == exact and steps_of(blockwise, sources) == exact_steps

    fnat = load(systems, "fertility_nat")
    argmax = fnat.translate(sources)
    assert set(steps_of(fnat, sources, fertility_decoding="npd", npd_samples=4, npd_teacher=tiny_teacher)) == {2}
    assert fnat.task.cfg.fertility_decoding == "argmax" and fnat.task.cfg.npd_teacher is None
    assert set(steps_of(fnat, sources)) == {1} and fnat.translate(sources) == argmax
    with pytest.raises(ValueError, match="--npd-teacher"):  # a failing call resets its options too
        fnat.translate(sources, fertility_decoding="npd")
    assert fnat.task.cfg.fertility_decoding == "argmax"


def test_drafts_and_segments_come_back_as_data(systems, sources, capsys):
    nad_ad = load(systems, "nad_ad")
    checkpoint, data_bin = systems["nad_ad"]
    lines = generate_lines(data_bin, checkpoint, TASK + ["--beam", "4", "--print-nad-draft"])
    drafts = {int(line.split("\t")[0][4:]): line.split("\t")[1] for line in lines if line.startswith("NAD-")}
    capsys.readouterr()
    hypos = nad_ad.generate([nad_ad.encode(s) for s in sources], beam=4)
    assert [nad_ad.decode(h[0]["nad_draft"]) for h in hypos] == [drafts[i] for i in range(len(sources))]
    assert all(torch.equal(h[0]["nad_draft"], h[1]["nad_draft"]) for h in hypos)  # one draft per sentence
    assert "NAD-" not in capsys.readouterr().out  # printed only when asked

    recover = load(systems, "recover_sat")
    checkpoint, data_bin = systems["recover_sat"]
    lines = generate_lines(data_bin, checkpoint, TASK + ["--beam", "1", "--print-segments"])
    segments = {int(line.split("\t")[0][4:]): line.split("\t")[1] for line in lines if line.startswith("SEG-")}
    capsys.readouterr()
    hypos = recover.generate([recover.encode(s) for s in sources])
    assert all(len(h[0]["segments"]) == 3 for h in hypos)
    assert [segments_string(recover.tgt_dict, h[0]["segments"]) for h in hypos] == [
        segments[i] for i in range(len(sources))
    ]
    assert "SEG-" not in capsys.readouterr().out


def test_sentencepiece_model_is_found_and_applied(dummy_raw, tiny_teacher, tmp_path):
    """prepare_data's layout (``spm.model`` next to ``data-bin/``): the hub encodes raw text with it and decodes."""
    import sentencepiece as spm

    out = tmp_path / "prepared"
    (out / "spm").mkdir(parents=True)
    spm.SentencePieceTrainer.train(
        input=",".join(os.path.join(dummy_raw, f"train.{lang}") for lang in ("src", "tgt")),
        model_prefix=str(out / "spm"),
        vocab_size=60,
        model_type="bpe",
        hard_vocab_limit=False,
        minloglevel=2,
    )
    sp = spm.SentencePieceProcessor(model_file=str(out / "spm.model"))
    for split in ("train", "valid", "test"):
        for lang in ("src", "tgt"):
            with open(os.path.join(dummy_raw, f"{split}.{lang}")) as f, open(out / "spm" / f"{split}.{lang}", "w") as g:
                g.writelines(" ".join(sp.encode(line.strip(), out_type=str)) + "\n" for line in f)
    data_bin = binarize(str(out / "spm"), str(out / "data-bin"))
    checkpoint = train_model(
        data_bin,
        str(tmp_path / "sat"),
        TINY_SAT + TASK + ["--criterion", "label_smoothed_cross_entropy", "--group-size", "2"],
        max_update=20,
    )
    hub = from_pretrained(str(tmp_path / "sat"), "checkpoint_last.pt", data_bin)
    assert hub.cfg.bpe._name == "sentencepiece"
    with open(os.path.join(dummy_raw, "test.src")) as f:
        raw = [line.strip() for line in f]
    expected = hypotheses(
        generate_lines(data_bin, checkpoint, TASK + ["--beam", "1", "--post-process", "sentencepiece"])
    )
    assert hub.translate(raw, beam=1) == [expected[i] for i in range(len(raw))]
    assert "▁" not in " ".join(expected.values())


# ----- without training: random models behind the hub interface ------------------------------------------------


def random_hub(task, arch_args):
    """A hub interface over a random model built by ``task`` (no checkpoint, no data)."""
    parse = options.parse_args_and_arch
    args = parse(options.get_training_parser(), ["unused-data", "--task", "translation_nat"] + list(arch_args))
    torch.manual_seed(0)
    model = task.build_model(args).eval()
    cfg = convert_namespace_to_omegaconf(
        parse(options.get_generation_parser(), ["unused-data", "--task", "translation_nat", "--max-len-b", "5"])
    )
    return NATHubInterface(cfg, task, [model])


def test_decoding_options_are_the_tasks_one_table():
    """Every option translation_nat adds to fairseq's translation task is a decoding option in its table (the
    table the task checks and the hub's per-call options), except the two that choose training data."""
    added = {f.name for f in dataclasses.fields(TranslationNATConfig)} - {
        f.name for f in dataclasses.fields(TranslationConfig)
    }
    assert added - {"use_distilled", "distilled_name"} == set(DECODING_OPTIONS)


def test_decoding_options_are_declared_once_beside_their_generators():
    """The owner table is derived from the generators' options classes: each option is declared once, by a class
    whose owners are registered architectures and which the task's config inherits (same defaults), and fairseq's
    parser gets every option with the help text of its declaration and nothing more (no ``--owners``)."""
    parser = argparse.ArgumentParser()
    gen_parser_from_dataclass(parser, TranslationNATConfig())
    flags = {action.dest: action for action in parser._actions}
    assert DECODING_OPTIONS == option_owners(DECODING_CONFIGS)
    assert "owners" not in flags and set(DECODING_OPTIONS) <= set(flags)
    defaults = TranslationNATConfig()
    for config in DECODING_CONFIGS:
        assert issubclass(TranslationNATConfig, config) and set(config.owners) <= set(MODEL_REGISTRY)
        for f in dataclasses.fields(config):
            if f.name != "_name":
                assert getattr(defaults, f.name) == f.default and flags[f.name].help == f.metadata["help"]


def test_speculative_options_through_the_hub_are_refused_for_other_models(toy_task):
    """A per-call speculative option on a blockwise model is refused (it was set on task.cfg and ignored), and the
    failed call leaves task.cfg as it was."""
    hub = random_hub(toy_task, TINY_BLOCKWISE[:2] + [a for a in TINY_TRANSFORMER[2:] if a != "--share-all-embeddings"])
    tokens = [torch.tensor([5, 6, 7, toy_task.target_dictionary.eos()])]
    assert hub.generate(tokens, block_accept="topk:2")[0][0]["tokens"][-1] == toy_task.target_dictionary.eos()
    with pytest.raises(ValueError, match="--spec-drafter-verify relaxed is a decoding option of spec_drafter models"):
        hub.generate(tokens, spec_drafter_verify="relaxed")
    assert hub.task.cfg.spec_drafter_verify == "exact"


@pytest.mark.parametrize(
    "arch_args, decoder",
    [
        (TINY_BLOCKWISE[:2], r"verify-accept decoding \(blockwise_transformer\)"),
        (["--arch", "sat_transformer", "--group-size", "2"], "SAT group decoding"),
    ],
)
def test_prefix_tokens_constraints_and_prefix_allowed_tokens_fn_are_refused(toy_task, arch_args, decoder):
    """What fairseq's hub hands its search besides the source (``inference_step_args``' prefix tokens and
    constraints, ``prefix_allowed_tokens_fn``) is refused, as --prefix-size and --constraints are: the plugin
    decoders would drop it."""
    hub = random_hub(toy_task, arch_args + [a for a in TINY_TRANSFORMER[2:] if a != "--share-all-embeddings"])
    tokens = [torch.tensor([5, 6, 7, toy_task.target_dictionary.eos()])]
    hub.generate(tokens)
    with pytest.raises(ValueError, match=f"prefix_tokens .*--prefix-size.* are not supported by {decoder}"):
        hub.generate(tokens, inference_step_args={"prefix_tokens": torch.tensor([[5]])})
    with pytest.raises(ValueError, match=f"constraints .*--constraints.* are not supported by {decoder}"):
        hub.generate(tokens, inference_step_args={"constraints": torch.tensor([[1, 5, 0]])})
    with pytest.raises(ValueError, match="prefix_allowed_tokens_fn .* is not supported by the decoder of"):
        hub.generate(tokens, prefix_allowed_tokens_fn=lambda batch, prefix: [5])
