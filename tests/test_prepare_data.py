"""Data preparation (nat_plugins/cli/prepare_data.py): raw text -> subwords -> data-bin, and its input checks."""

import os

import pytest

from nat_plugins.cli import prepare_data

LINES = 200


def write_raw(raw_dir, multi30k_dir, lines=LINES):
    """The first ``lines`` lines of Multi30k train as every split (train, valid, test)."""
    os.makedirs(raw_dir, exist_ok=True)
    for lang in ("en", "de"):
        with open(os.path.join(multi30k_dir, f"train.{lang}"), encoding="utf-8") as f:
            text = [next(f) for _ in range(lines)]
        for split in prepare_data.SPLITS:
            with open(os.path.join(raw_dir, f"{split}.{lang}"), "w", encoding="utf-8") as f:
                f.writelines(text)
    return raw_dir


def prepare(raw_dir, out_dir, *extra):
    prepare_data.main(prepare_data.get_parser().parse_args(
        ["--raw-dir", raw_dir, "--out-dir", out_dir, "--vocab-size", "500", "--workers", "1", *extra]))


def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read().splitlines()


def test_sentencepiece_subwords_decode_to_the_raw_text(multi30k_dir, tmp_path):
    import sentencepiece as spm

    raw, out = write_raw(str(tmp_path / "in"), multi30k_dir), str(tmp_path / "out")
    prepare(raw, out)
    sp = spm.SentencePieceProcessor(model_file=os.path.join(out, "spm.model"))
    pieces = read(os.path.join(out, "spm", "test.de"))
    assert [sp.decode(line.split()) for line in pieces] == [" ".join(s.split()) for s in read(os.path.join(raw, "test.de"))]
    assert read(os.path.join(out, "data-bin", "dict.en.txt")) == read(os.path.join(out, "data-bin", "dict.de.txt"))
    assert os.path.isfile(os.path.join(out, "data-bin", "test.en-de.de.bin"))


def test_fastbpe_subwords_join_back_to_the_raw_text(multi30k_dir, tmp_path):
    raw, out = write_raw(str(tmp_path / "in"), multi30k_dir), str(tmp_path / "out")
    prepare(raw, out, "--subword", "fastbpe")
    codes = read(os.path.join(out, "bpe.codes"))
    assert codes and all(len(line.split()) == 3 for line in codes)  # fastBPE's "left right count"
    segmented = read(os.path.join(out, "bpe", "train.en"))
    assert any("@@ " in line for line in segmented)  # words were split
    assert [line.replace("@@ ", "") for line in segmented] == [" ".join(s.split()) for s in read(os.path.join(raw, "train.en"))]
    assert os.path.isfile(os.path.join(out, "data-bin", "train.en-de.en.bin"))


@pytest.mark.parametrize("problem, message", [
    ("empty", r"valid\.de: line\(s\) \[3\] are empty"),
    ("short", r"test\.(en|de).*(199|200)"),
])
def test_bad_raw_corpus_is_named(multi30k_dir, tmp_path, problem, message):
    raw = write_raw(str(tmp_path / "in"), multi30k_dir)
    if problem == "empty":
        lines = read(os.path.join(raw, "valid.de"))
        lines[2] = ""
        path = os.path.join(raw, "valid.de")
    else:
        lines = read(os.path.join(raw, "test.de"))[:-1]
        path = os.path.join(raw, "test.de")
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(line + "\n" for line in lines)
    with pytest.raises(prepare_data.DataError, match=message):
        prepare(raw, str(tmp_path / "out"))


def test_missing_raw_dir_is_named(tmp_path):
    with pytest.raises(prepare_data.DataError, match="does not exist"):
        prepare(str(tmp_path / "nowhere"), str(tmp_path / "out"))
