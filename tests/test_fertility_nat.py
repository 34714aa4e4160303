"""NAT with fertility (Gu et al., ICLR 2018): links -> fertilities (unaligned targets, clamping), the fertility
pipeline's errors, copy by fertility inside the model, self-masking, gold-fertility inference == training forward,
argmax/average/NPD decoding (S=1 == argmax, teacher picks the best, batch invariance, empty/max length), the two
criterions (no teacher in the checkpoint) and a tiny train -> generate -> interactive run."""

import os
import shutil
import sys
from argparse import Namespace

import pytest
import torch
from fairseq import checkpoint_utils, options, tasks

from nat_plugins.cli import fertility as fert_cli
from nat_plugins.criterions.fertility_nat_loss import FertilityNATLoss
from nat_plugins.generators.fertility_decoding import FertilityDecoder, cap_total
from nat_plugins.modules.nad import NADLayer, fertility_copy_index
from nat_plugins.tasks.translation_nat import SideFileError

from .utils import TINY_TRANSFORMER, generate_lines, hypotheses, interactive_lines, train_model

TINY_FNAT = ["--arch", "fertility_nat"] + TINY_TRANSFORMER[2:]
NUM_SENTENCES = 12


def has_eflomal():
    try:
        import eflomal  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.fixture(scope="module")
def fert_data_bin(dummy_data_bin, dummy_raw, tmp_path_factory):
    """A copy of the dummy data-bin with fertility files: the toy target maps s_i -> t_i word for word, so the
    gold fertilities are all 1 (written directly; the eflomal path is tested separately)."""
    path = str(tmp_path_factory.mktemp("fert-bin") / "bin")
    shutil.copytree(dummy_data_bin, path)
    for split in ("train", "valid", "test"):
        with open(os.path.join(path, f"{split}.fert.src"), "w") as out, \
                open(os.path.join(dummy_raw, f"{split}.src")) as src:
            for line in src:
                out.write(" ".join("1" for _ in line.split()) + "\n")
    return path


@pytest.fixture(scope="module")
def task(fert_data_bin):
    args = options.parse_args_and_arch(options.get_training_parser(),
                                       [fert_data_bin, "--task", "translation_nat"] + TINY_FNAT)
    task = tasks.setup_task(args)
    task.load_dataset("test")
    return task


def build(data_bin, task, extra=()):
    args = options.parse_args_and_arch(options.get_training_parser(),
                                       [data_bin, "--task", "translation_nat"] + TINY_FNAT + list(extra))
    torch.manual_seed(0)
    return task.build_model(args).eval()


def batch(task, indices):
    dataset = task.dataset("test")
    return dataset.collater([dataset[i] for i in indices])


def decoder(model, task, mode="argmax", **kwargs):
    gen = dict(beam=1, max_len_a=0, max_len_b=200)
    gen.update(kwargs.pop("gen", {}))
    return FertilityDecoder([model], task, Namespace(**gen), mode=mode, **kwargs)


# ----- (a) links -> fertilities ----------------------------------------------------------------------------------
def test_links_to_fertility_with_unaligned_targets():
    # 3 source, 6 target subwords; target 0 unaligned (no left neighbour: right), 3 and 4 unaligned (left: 2's source)
    alignment = fert_cli.parse_links("1-1 0-2 2-5", 3, 6)
    assert alignment == [None, 1, 0, None, None, 2]
    assert fert_cli.fill_unaligned(alignment, 3) == [1, 1, 0, 0, 0, 2]
    fertility, unaligned, clamped = fert_cli.alignment_to_fertility(alignment, 3, 50)
    assert fertility == [3, 2, 1] and unaligned == 3 and clamped == 0 and sum(fertility) == 6
    # several sources for one target: the leftmost is kept; no link at all: the monotone fallback
    assert fert_cli.parse_links("2-0 1-0", 3, 1) == [1]
    assert fert_cli.alignment_to_fertility([None] * 4, 2, 50)[0] == [2, 2]
    assert fert_cli.alignment_to_fertility([], 3, 50)[0] == [0, 0, 0]


def test_clamping_keeps_the_sum():
    assert fert_cli.clamp_fertility([0, 7, 0, 1], 3) == [1, 3, 3, 1]  # overflow 4: 3 to the right, 1 to the left
    assert sum(fert_cli.clamp_fertility([0, 7, 0, 1], 3)) == 8
    assert fert_cli.clamp_fertility([5, 0, 0], 2) == [2, 2, 1]
    assert fert_cli.clamp_fertility([0, 0, 9], 3) == [3, 3, 3]
    fertility, _, clamped = fert_cli.alignment_to_fertility([0] * 5, 3, 3)  # L=3: fertilities <= 2
    assert fertility == [2, 2, 1] and clamped == 1
    with pytest.raises(fert_cli.FertilityError, match="raise --max-fertility"):
        fert_cli.clamp_fertility([9, 0], 3)


def test_pipeline_errors(fert_data_bin, tmp_path, monkeypatch):
    pairs = [(["a", "b"], ["x", "y", "z"])]
    with pytest.raises(fert_cli.FertilityError, match="missing"):
        fert_cli.read_links_file(str(tmp_path / "none.links"), pairs)
    (tmp_path / "two.links").write_text("0-0\n1-1\n")
    with pytest.raises(fert_cli.FertilityError, match="2 lines but the split has 1"):
        fert_cli.read_links_file(str(tmp_path / "two.links"), pairs)
    (tmp_path / "bad.links").write_text("0-x\n")
    with pytest.raises(fert_cli.FertilityError, match="malformed link '0-x'"):
        fert_cli.read_links_file(str(tmp_path / "bad.links"), pairs)
    (tmp_path / "far.links").write_text("5-0\n")
    with pytest.raises(fert_cli.FertilityError, match="outside the sentence pair"):
        fert_cli.read_links_file(str(tmp_path / "far.links"), pairs)
    with pytest.raises(fert_cli.FertilityError, match="missing"):
        fert_cli.make_fertilities(str(tmp_path), src="src", tgt="tgt")
    monkeypatch.setitem(sys.modules, "eflomal", None)  # as if not installed
    with pytest.raises(fert_cli.FertilityError, match="NAT_SETUP_EXTRAS=eflomal"):
        fert_cli.eflomal_alignments(pairs)
    with pytest.raises(SystemExit, match="nat-fertility: error: .*links-dir"):
        fert_cli.cli_main([fert_data_bin, "--aligner", "links"])


def test_links_and_monotone_pipeline(fert_data_bin, tmp_path):
    bin_copy = str(tmp_path / "bin")
    shutil.copytree(fert_data_bin, bin_copy)
    sources, targets, _ = fert_cli.load_split(bin_copy, "valid", "src", "tgt")
    (tmp_path / "valid.links").write_text("".join(" ".join(f"{i}-{i}" for i in range(len(s))) + "\n" for s in sources))
    fert_cli.cli_main([bin_copy, "--splits", "valid", "--aligner", "links", "--links-dir", str(tmp_path)])
    with open(os.path.join(bin_copy, "valid.fert.src")) as f:
        assert [line.split() for line in f] == [["1"] * len(s) for s in sources]
    fert_cli.make_fertilities(bin_copy, splits=["valid"], aligner="monotone")
    with open(os.path.join(bin_copy, "valid.fert.src")) as f:
        assert [sum(map(int, line.split())) for line in f] == [len(t) for t in targets]


@pytest.mark.skipif(not has_eflomal(), reason="eflomal is not installed (NAT_SETUP_EXTRAS=eflomal bash "
                                              "run_scripts/setup_env.sh)")
def test_eflomal_pipeline_on_the_toy_data(fert_data_bin, tmp_path):
    bin_copy = str(tmp_path / "bin")
    shutil.copytree(fert_data_bin, bin_copy)
    written = fert_cli.make_fertilities(bin_copy)
    for split, path in written.items():
        with open(path) as f, open(os.path.join(fert_data_bin, f"{split}.fert.src")) as gold:
            assert f.read() == gold.read()  # word-for-word toy language: all ones


def test_wrong_fertility_files_are_refused(fert_data_bin, tmp_path):
    bin_copy = str(tmp_path / "bin")
    shutil.copytree(fert_data_bin, bin_copy)
    path = os.path.join(bin_copy, "test.fert.src")
    with open(path) as f:
        lines = f.read().splitlines()
    args = options.parse_args_and_arch(options.get_training_parser(),
                                       [bin_copy, "--task", "translation_nat"] + TINY_FNAT)
    cases = [([lines[0] + " 1"] + lines[1:], "fertilities for a source"),
             (["2" + lines[0][1:]] + lines[1:], "fertilities sum to"),
             (["x" + lines[0][1:]] + lines[1:], "must be integers"),
             (lines[:-1], "lines but its split has")]
    for content, message in cases:
        with open(path, "w") as f:
            f.write("\n".join(content) + "\n")
        task = tasks.setup_task(args)
        task.load_dataset("test")
        with pytest.raises(SideFileError, match=message):  # when the model that needs them is built
            build(bin_copy, task)
    os.remove(path)
    fresh = tasks.setup_task(args)
    fresh.load_dataset("test")
    with pytest.raises(SideFileError, match="test.fert.src .*missing"):
        build(bin_copy, fresh)


# ----- (b) model -------------------------------------------------------------------------------------------------
def test_decoder_inputs_are_source_embeddings_copied_by_fertility(fert_data_bin, task, monkeypatch):
    model = build(fert_data_bin, task)
    src_tokens = torch.tensor([[1, 1, 7, 8, 9, 2], [7, 10, 11, 12, 13, 2]])  # row 0 left-padded, EOS last
    fertility = torch.tensor([[0, 0, 2, 0, 3, 0], [1, 1, 0, 1, 1, 0]])
    seen = {}

    def record(inputs, padding_mask, encoder_out):
        seen["inputs"], seen["padding"] = inputs, padding_mask
        return torch.zeros(*padding_mask.shape, 32), {}

    monkeypatch.setattr(model.decoder.nad, "forward", record)
    encoder_out = model.encode(src_tokens, torch.tensor([4, 6]))
    model.decode(src_tokens, encoder_out, fertility)
    source = model.encoder.embed_scale * model.encoder.embed_tokens(src_tokens) + model.encoder.embed_positions(src_tokens)
    assert torch.allclose(seen["inputs"][0], source[0, [2, 2, 4, 4, 4]])
    assert torch.allclose(seen["inputs"][1, :4], source[1, [0, 1, 3, 4]])
    assert seen["padding"].tolist() == [[False] * 5, [False] * 4 + [True]]
    model.copy_mode = "uniform"  # 5 targets over the 3 copyable positions of row 0: position floor(t * 3 / 5)
    model.decode(src_tokens, encoder_out, fertility)
    assert torch.allclose(seen["inputs"][0], source[0, [2, 2, 3, 3, 4]])


@pytest.mark.parametrize("masked", [True, False])
def test_self_masking_reaches_the_decoder(fert_data_bin, task, monkeypatch, masked):
    model = build(fert_data_bin, task, [] if masked else ["--no-self-attn-mask-diagonal"])
    assert model.decoder.nad.mask_self_diagonal is masked
    masks = []
    forward = NADLayer.forward

    def record(self, *args, self_attn_mask=None, **kwargs):
        masks.append(self_attn_mask)
        return forward(self, *args, self_attn_mask=self_attn_mask, **kwargs)

    monkeypatch.setattr(NADLayer, "forward", record)
    sample = batch(task, range(2))
    model(**sample["net_input"], fertility=sample["fertility"])
    if masked:
        assert masks[0].diagonal().le(-1e4).all()  # each query's own key hidden, every other key visible
        assert masks[0].clone().fill_diagonal_(0).eq(0).all()
    else:
        assert masks[0] is None


def test_gold_fertility_inference_equals_training_forward(fert_data_bin, task, tiny_teacher, monkeypatch):
    model = build(fert_data_bin, task, ["--init-from-ar", tiny_teacher])
    sample = batch(task, range(NUM_SENTENCES))
    out = model(**sample["net_input"], fertility=sample["fertility"])["word_ins"]
    allowed = out["out"].clone()
    allowed[..., [task.target_dictionary.pad(), task.target_dictionary.eos()]] = -float("inf")  # never emitted
    expected = allowed.argmax(-1).masked_fill(~out["mask"], task.target_dictionary.pad())
    # each sentence alone (other padding) through encode + decode
    for i in range(3):
        one = batch(task, [int(sample["id"][i])])
        encoder_out = model.encode(one["net_input"]["src_tokens"], one["net_input"]["src_lengths"])
        logits, _ = model.decode(one["net_input"]["src_tokens"], encoder_out, one["fertility"])
        assert torch.allclose(logits[0], out["out"][i, :logits.size(1)], atol=1e-5)
    # the generator with a fertility predictor rigged to predict the gold fertilities
    gold = sample["fertility"]
    monkeypatch.setattr(model, "fertility_logits",
                        lambda encoder_out: torch.nn.functional.one_hot(gold, model.max_fertility).float() * 20)
    hypos = decoder(model, task).generate([model], sample)
    for i, (hyp,) in enumerate(hypos):
        length = int(gold[i].sum())
        assert hyp["tokens"].tolist() == expected[i, :length].tolist() + [task.target_dictionary.eos()]
        assert hyp["steps"] == 1


def test_npd_with_one_sample_is_argmax_and_batches_are_invariant(fert_data_bin, task, tiny_teacher):
    model = build(fert_data_bin, task, ["--init-from-ar", tiny_teacher])
    sample = batch(task, range(NUM_SENTENCES))
    argmax = decoder(model, task).generate([model], sample)
    npd = decoder(model, task, "npd", npd_samples=1, npd_teacher=tiny_teacher).generate([model], sample)
    for a, n in zip(argmax, npd):
        assert a[0]["tokens"].tolist() == n[0]["tokens"].tolist() and n[0]["steps"] == 2
    for mode in ("argmax", "average"):
        gen = decoder(model, task, mode)
        batched = dict(zip(sample["id"].tolist(), gen.generate([model], sample)))
        for i in range(NUM_SENTENCES):
            single = gen.generate([model], batch(task, [i]))[0][0]
            assert single["tokens"].tolist() == batched[i][0]["tokens"].tolist()
            assert single["score"].item() == pytest.approx(batched[i][0]["score"].item(), abs=1e-5)


def test_npd_keeps_the_candidate_the_teacher_prefers(fert_data_bin, task, tiny_teacher, monkeypatch):
    model = build(fert_data_bin, task, ["--init-from-ar", tiny_teacher])
    sample = batch(task, range(4))
    gen = decoder(model, task, "npd", npd_samples=6, npd_teacher=tiny_teacher)
    candidates = {}
    real_scores = gen.teacher_scores

    def rigged(src_tokens, src_lengths, tokens, lengths):
        candidates["tokens"], candidates["lengths"] = tokens, lengths
        candidates["real"] = real_scores(src_tokens, src_lengths, tokens, lengths)
        return lengths.float() * -1.0  # the teacher "prefers" the shortest candidate
    monkeypatch.setattr(gen, "teacher_scores", rigged)
    torch.manual_seed(3)
    hypos = gen.generate([model], sample)
    lengths = candidates["lengths"].view(4, 6)
    for i, (hyp,) in enumerate(hypos):
        best = int(lengths[i].argmin())
        assert hyp["tokens"][:-1].tolist() == candidates["tokens"][i * 6 + best, :lengths[i, best]].tolist()
    # the real teacher score of a candidate = the teacher's own forward on it (sum of log-probs incl. EOS)
    teacher = gen.teacher.model
    row = 7
    length = int(candidates["lengths"][row])
    src = sample["net_input"]["src_tokens"][row // 6:row // 6 + 1]
    eos = task.target_dictionary.eos()
    target = torch.cat([candidates["tokens"][row, :length], torch.tensor([eos])]).unsqueeze(0)
    prev = torch.cat([torch.tensor([[eos]]), target[:, :-1]], dim=1)
    lprobs = teacher.get_normalized_probs(teacher(src, src.ne(1).sum(1), prev), log_probs=True)
    total = lprobs.gather(-1, target.unsqueeze(-1)).sum()
    assert candidates["real"][row].item() == pytest.approx(total.item() / (length + 1), abs=1e-4)


def test_empty_and_maximum_lengths(fert_data_bin, task, monkeypatch):
    model = build(fert_data_bin, task)
    sample = batch(task, range(4))
    zero = torch.full((model.max_fertility,), -10.0)
    zero[0] = 10.0
    monkeypatch.setattr(model, "fertility_logits",
                        lambda out: zero.expand(out["encoder_out"][0].size(1), out["encoder_out"][0].size(0), -1))
    for hyp, in decoder(model, task).generate([model], sample):
        assert len(hyp["tokens"]) == 2 and hyp["tokens"][-1] == task.target_dictionary.eos()
    many = torch.full((model.max_fertility,), -10.0)
    many[5] = 10.0
    monkeypatch.setattr(model, "fertility_logits",
                        lambda out: many.expand(out["encoder_out"][0].size(1), out["encoder_out"][0].size(0), -1))
    for hyp, in decoder(model, task, gen={"max_len_b": 3}).generate([model], sample):
        assert len(hyp["tokens"]) == 4 and task.target_dictionary.pad() not in hyp["tokens"][:-1].tolist()
    assert cap_total(torch.tensor([[2, 3, 1]]), torch.tensor([4])).tolist() == [[2, 2, 0]]
    index, _ = fertility_copy_index(torch.tensor([[2, 2, 0]]))
    assert index.tolist() == [[0, 0, 1, 1]]


def test_decoding_option_errors(fert_data_bin, task, tmp_path):
    model = build(fert_data_bin, task)
    with pytest.raises(ValueError, match="--npd-teacher PATH"):
        decoder(model, task, "npd")
    with pytest.raises(FileNotFoundError, match="--npd-teacher"):
        decoder(model, task, "npd", npd_teacher=str(tmp_path / "missing.pt"))
    with pytest.raises(ValueError, match="--beam 1"):
        decoder(model, task, gen={"beam": 4})
    with pytest.raises(ValueError, match="--sampling"):
        decoder(model, task, gen={"sampling": True})
    with pytest.raises(ValueError, match="--npd-samples"):
        decoder(model, task, "npd", npd_samples=0)
    with pytest.raises(ValueError, match="--prefix-size"):
        decoder(model, task).generate([model], batch(task, [0]), prefix_tokens=torch.tensor([[4]]))


def test_criterion_checks_the_fertility_sum(fert_data_bin, task):
    model = build(fert_data_bin, task).train()
    criterion = FertilityNATLoss(task, label_smoothing=0.1)
    sample = batch(task, range(4))
    loss, sample_size, log = criterion(model, sample)
    assert sample_size == log["ntarget"] == int(sample["fertility"].sum())
    loss.backward()
    assert all(p.grad is not None for p in model.parameters())  # no unused parameter (DDP)
    bad = dict(sample, fertility=sample["fertility"].clone())
    bad["fertility"][0, -2] += 1
    with pytest.raises(ValueError, match="fertilities sum to"):
        criterion(model, bad)


# ----- (c) end to end --------------------------------------------------------------------------------------------
def test_train_generate_interactive_and_rkl_finetune(fert_data_bin, dummy_raw, tiny_teacher, tmp_path):
    checkpoint = train_model(fert_data_bin, str(tmp_path / "fnat"), TINY_FNAT + [
        "--task", "translation_nat", "--criterion", "fertility_nat_loss", "--label-smoothing", "0.1",
        "--init-from-ar", tiny_teacher], max_update=10)
    outputs = {}
    for mode in (["argmax"], ["average"], ["npd", "--npd-samples", "4", "--npd-teacher", tiny_teacher]):
        lines = generate_lines(fert_data_bin, checkpoint, ["--task", "translation_nat", "--beam", "1", "--print-step",
                                                           "--fertility-decoding"] + mode)
        hyps = hypotheses(lines)
        assert sorted(hyps) == list(range(40)) and all(h.strip() for h in hyps.values())
        steps = {int(line.split("\t")[1]) for line in lines if line.startswith("I-")}
        assert steps == ({2} if mode[0] == "npd" else {1})
        outputs[mode[0]] = hyps
    with pytest.raises(ValueError, match="--npd-teacher"):
        generate_lines(fert_data_bin, checkpoint, ["--task", "translation_nat", "--beam", "1",
                                                   "--fertility-decoding", "npd"])
    with open(os.path.join(dummy_raw, "test.src")) as f:
        sources = [next(f).strip() for _ in range(3)]
    input_file = tmp_path / "input.txt"
    input_file.write_text("\n".join(sources) + "\n")
    inter = hypotheses(interactive_lines(fert_data_bin, checkpoint, str(input_file),
                                         ["--task", "translation_nat", "--beam", "1"]))
    assert [inter[i] for i in range(3)] == [outputs["argmax"][i] for i in range(3)]

    # fine-tuning with the reverse-KL criterion: the teacher is used but never saved with the student
    finetuned = train_model(fert_data_bin, str(tmp_path / "rkl"), TINY_FNAT + [
        "--task", "translation_nat", "--criterion", "nat_rkl_finetune", "--teacher-path", tiny_teacher,
        "--rkl-weight", "0.25", "--restore-file", checkpoint, "--reset-optimizer", "--reset-dataloader",
        "--reset-meters", "--reset-lr-scheduler"], max_update=3)
    state = checkpoint_utils.load_checkpoint_to_cpu(finetuned)
    student = checkpoint_utils.load_checkpoint_to_cpu(checkpoint)
    assert set(state["model"]) == set(student["model"])
    assert not any("teacher" in key for key in state["model"]) and state.get("criterion") is None
    assert state["optimizer_history"][-1]["num_updates"] == 3  # the optimizer (and update count) was reset
    assert hypotheses(generate_lines(fert_data_bin, finetuned, ["--task", "translation_nat", "--beam", "1"]))
