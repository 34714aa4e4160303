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
    prepare_data.main(
        prepare_data.get_parser().parse_args(
            ["--raw-dir", raw_dir, "--out-dir", out_dir, "--vocab-size", "500", "--workers", "1", *extra]
        )
    )


def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read().splitlines()


def test_sentencepiece_subwords_decode_to_the_raw_text(multi30k_dir, tmp_path):
    import sentencepiece as spm

    raw, out = write_raw(str(tmp_path / "in"), multi30k_dir), str(tmp_path / "out")
    prepare(raw, out)
    sp = spm.SentencePieceProcessor(model_file=os.path.join(out, "spm.model"))
    pieces = read(os.path.join(out, "spm", "test.de"))
    assert [sp.decode(line.split()) for line in pieces] == [
        " ".join(s.split()) for s in read(os.path.join(raw, "test.de"))
    ]
    assert read(os.path.join(out, "data-bin", "dict.en.txt")) == read(os.path.join(out, "data-bin", "dict.de.txt"))
    assert os.path.isfile(os.path.join(out, "data-bin", "test.en-de.de.bin"))


def test_fastbpe_subwords_join_back_to_the_raw_text(multi30k_dir, tmp_path):
    raw, out = write_raw(str(tmp_path / "in"), multi30k_dir), str(tmp_path / "out")
    prepare(raw, out, "--subword", "fastbpe")
    codes = read(os.path.join(out, "bpe.codes"))
    assert codes and all(len(line.split()) == 3 for line in codes)  # fastBPE's "left right count"
    segmented = read(os.path.join(out, "bpe", "train.en"))
    assert any("@@ " in line for line in segmented)  # words were split
    assert [line.replace("@@ ", "") for line in segmented] == [
        " ".join(s.split()) for s in read(os.path.join(raw, "train.en"))
    ]
    assert os.path.isfile(os.path.join(out, "data-bin", "train.en-de.en.bin"))


@pytest.mark.parametrize(
    "problem, message",
    [
        ("empty", r"valid\.de: line\(s\) \[3\] are empty"),
        ("short", r"test\.(en|de).*(199|200)"),
    ],
)
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


def test_without_a_corpus_the_error_says_where_to_point_it(monkeypatch, tmp_path):
    """No --raw-dir, no MULTI30K_DIR and no network: the error names both options and where Multi30k is."""
    monkeypatch.delenv("MULTI30K_DIR", raising=False)

    def offline(*args, **kwargs):
        raise OSError("network unreachable")

    monkeypatch.setattr(prepare_data.urllib.request, "urlopen", offline)
    with pytest.raises(prepare_data.DataError, match=r"--raw-dir or MULTI30K_DIR .*github\.com/multi30k/dataset"):
        prepare_data.main(prepare_data.get_parser().parse_args(["--out-dir", str(tmp_path / "out")]))
    monkeypatch.setenv("MULTI30K_DIR", str(tmp_path / "nowhere"))
    with pytest.raises(prepare_data.DataError, match="MULTI30K_DIR .*nowhere does not exist"):
        prepare_data.main(prepare_data.get_parser().parse_args(["--out-dir", str(tmp_path / "out")]))


# ----- IWSLT14 de-en and WMT14 en-de releases (nat_plugins/cli/corpora.py), on tiny slices with their file layout --
WORDS = {
    "de": "haus katze hund baum fluss stadt buch tisch wasser licht sonne mond weg berg".split(),
    "en": "house cat dog tree river city book table water light sun moon way mountain".split(),
}


def sentence_pairs(n, seed, first=0):
    """``n`` word-for-word German/English pairs of 3-7 words."""
    import random

    rng = random.Random(seed)
    pairs = []
    for _ in range(n):
        ids = [rng.randrange(len(WORDS["de"])) for _ in range(rng.randint(3, 7))]
        pairs.append({lang: " ".join(words[i] for i in ids).capitalize() + "." for lang, words in WORDS.items()})
    return pairs[first:]


def write(path, lines):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(line + "\n" for line in lines)


def xml_segments(lines, doc):
    """IWSLT/WMT XML or SGML: a document of ``<seg id="N">`` lines."""
    return [f'<doc docid="{doc}">'] + [f'<seg id="{i}"> {line} </seg>' for i, line in enumerate(lines, 1)] + ["</doc>"]


def write_iwslt14(root, talks=3, per_talk=16):
    """``de-en/`` as extracted from de-en.tgz: train.tags with talk metadata, five XML test sets."""
    release = os.path.join(root, "de-en")
    pairs = sentence_pairs(talks * per_talk, seed=1)
    pairs[5] = {"de": "Haus " * 10 + ".", "en": "House ."}  # ratio above 1.5: dropped
    train = {"de": [], "en": []}
    for talk in range(talks):
        for lang in ("de", "en"):
            train[lang] += [
                f"<url>http://www.ted.com/talks/{talk}.html</url>",
                f"<keywords>talks, {lang}</keywords>",
                f"<speaker>Speaker {talk}</speaker>",
                f"<talkid>{talk}</talkid>",
                f"<title>{WORDS[lang][talk].capitalize()}</title>",
                f"<description>{WORDS[lang][talk + 1]} {WORDS[lang][talk + 2]}</description>",
            ]
            train[lang] += [p[lang] for p in pairs[talk * per_talk : (talk + 1) * per_talk]]
    for lang in ("de", "en"):
        write(os.path.join(release, f"train.tags.de-en.{lang}"), train[lang])
    for n, name in enumerate(
        (
            "IWSLT14.TED.dev2010",
            "IWSLT14.TEDX.dev2012",
            "IWSLT14.TED.tst2010",
            "IWSLT14.TED.tst2011",
            "IWSLT14.TED.tst2012",
        )
    ):
        test = sentence_pairs(3, seed=10 + n)
        test[0] = {"de": f"Tom’s Haus & {n}", "en": f"Tom’s house & {n}"}
        for lang in ("de", "en"):
            write(
                os.path.join(release, f"{name}.de-en.{lang}.xml"),
                xml_segments([p[lang].replace("&", "&amp;") for p in test], name),
            )
    kept = [p for i, p in enumerate(pairs) if i != 5]
    titled = []  # the kept text lines in order: title, description, then the talk's sentences
    for talk in range(talks):
        titled.append({lang: WORDS[lang][talk].capitalize() for lang in ("de", "en")})
        titled.append({lang: f"{WORDS[lang][talk + 1]} {WORDS[lang][talk + 2]}" for lang in ("de", "en")})
        titled += [p for p in kept if pairs.index(p) // per_talk == talk]
    return release, titled


def test_iwslt14_release_to_data_bin(tmp_path):
    release, text = write_iwslt14(str(tmp_path))
    out = str(tmp_path / "out")
    prepare(release, out, "--corpus", "iwslt14", "-s", "de", "-t", "en", "--lowercase", "--vocab-size", "60")

    def raw(split, lang):
        return read(os.path.join(out, "raw", f"{split}.{lang}"))

    # metadata dropped, title/description text kept, the unbalanced pair cleaned away; valid = every 23rd pair
    expected = [{lang: line.lower() for lang, line in pair.items()} for pair in text]
    assert [dict(de=d, en=e) for d, e in zip(raw("valid", "de"), raw("valid", "en"))] == expected[22::23]
    train = [pair for n, pair in enumerate(expected, 1) if n % 23]
    assert [dict(de=d, en=e) for d, e in zip(raw("train", "de"), raw("train", "en"))] == train
    # test = the five XML sets in fairseq's order, entities unescaped, ’ -> '
    test_en = raw("test", "en")
    assert len(test_en) == 15 and [test_en[i] for i in (0, 3, 6, 9, 12)] == [f"tom's house & {n}" for n in range(5)]
    assert read(os.path.join(out, "data-bin", "dict.de.txt")) == read(os.path.join(out, "data-bin", "dict.en.txt"))
    assert os.path.isfile(os.path.join(out, "data-bin", "test.de-en.en.bin"))


def write_wmt14(root):
    """The WMT14 archives extracted into one directory, as fairseq's script leaves them (news-commentary v9)."""
    corpora = {"training/europarl-v7.de-en": 20, "commoncrawl.de-en": 20, "training/news-commentary-v9.de-en": 12}
    train = []
    for n, (name, lines) in enumerate(corpora.items()):
        pairs = sentence_pairs(lines, seed=20 + n)
        train += pairs
        for lang in ("de", "en"):
            write(os.path.join(root, f"{name}.{lang}"), [p[lang] for p in pairs])
    valid, test = sentence_pairs(6, seed=30), sentence_pairs(7, seed=31)
    for lang in ("de", "en"):
        write(os.path.join(root, "dev", f"newstest2013.{lang}"), [p[lang] for p in valid])
        for kind in ("src", "ref"):
            write(
                os.path.join(root, "test-full", f"newstest2014-deen-{kind}.{lang}.sgm"),
                xml_segments([p[lang] if kind == "ref" or lang == "en" else "QUELLE" for p in test], "newstest2014"),
            )
    return train, valid, test


def test_wmt14_release_to_data_bin(tmp_path):
    root = str(tmp_path / "wmt14")
    train, valid, test = write_wmt14(root)
    # a non-printing character is removed; a pair with a side over 250 words is dropped
    with (
        open(os.path.join(root, "commoncrawl.de-en.de"), "a", encoding="utf-8") as de,
        open(os.path.join(root, "commoncrawl.de-en.en"), "a", encoding="utf-8") as en,
    ):
        de.write("Haus\u200b katze.\n" + "haus " * 251 + "\n")
        en.write("House cat.\n" + "house " * 251 + "\n")
    out = str(tmp_path / "out")
    prepare(root, out, "--corpus", "wmt14", "--vocab-size", "60")  # en -> de

    def raw(split, lang):
        return read(os.path.join(out, "raw", f"{split}.{lang}"))

    train_en = [p["en"] for p in train[:40]] + ["House cat."] + [p["en"] for p in train[40:]]
    assert raw("train", "en") == train_en and "Haus katze." in raw("train", "de")
    assert raw("valid", "de") == [p["de"] for p in valid]
    assert raw("test", "en") == [p["en"] for p in test] and raw("test", "de") == [p["de"] for p in test]
    assert os.path.isfile(os.path.join(out, "data-bin", "train.en-de.de.bin"))


@pytest.mark.parametrize(
    "problem, message",
    [
        (
            "missing",
            r"missing .*IWSLT14\.TED\.tst2011\.de-en\.en\.xml: --corpus iwslt14 reads IWSLT14 de-en: .*de-en\.tgz",
        ),
        ("pair", r"German-English: -s/-t must be de and en \(got en, fr\)"),
        ("no-dir", r"--corpus iwslt14 needs --raw-dir, the directory of the downloaded release"),
    ],
)
def test_iwslt14_errors_name_the_file_and_the_release(tmp_path, problem, message):
    release, _ = write_iwslt14(str(tmp_path))
    args = ["--raw-dir", release, "--corpus", "iwslt14", "-s", "de", "-t", "en"]
    if problem == "missing":
        os.remove(os.path.join(release, "IWSLT14.TED.tst2011.de-en.en.xml"))
    elif problem == "pair":
        args[-3:] = ["en", "-t", "fr"]
    else:
        args = args[2:]
    with pytest.raises(prepare_data.DataError, match=message):
        prepare_data.main(prepare_data.get_parser().parse_args(args + ["--out-dir", str(tmp_path / "out")]))


def test_wmt14_needs_exactly_one_news_commentary(tmp_path):
    root = str(tmp_path / "wmt14")
    write_wmt14(root)
    for lang in ("de", "en"):
        write(os.path.join(root, "training", f"news-commentary-v12.de-en.{lang}"), ["Haus."])
    with pytest.raises(prepare_data.DataError, match=r"2 files match news-commentary-v\*\.de-en\.en .*keep one"):
        prepare(root, str(tmp_path / "out"), "--corpus", "wmt14")
