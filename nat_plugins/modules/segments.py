"""Segments of RecoverSAT (Ran, Lin, Li & Zhou, ACL 2020, "Learning to Recover from Multi-Modality Errors for
Non-Autoregressive Neural Machine Translation"): the DEL symbol, split points (§3.3 mixed annealing dividing),
pseudo-repetitive segment injection (§3.2), training batches of segments and the segment layout helpers.

A target y_1..y_n (without EOS) is cut at split points 0 <= c_1 <= ... <= c_{K-1} <= n into K segments
S_k = y[c_{k-1}:c_k] (c_0 = 0, c_K = n); equal points give empty segments, which are just BOS -> EOS.
Split points never fall inside a word: a point i (between y_{i-1} and y_i) is allowed when y_i starts a word
(sentencepiece: it begins with ``▁``, when the dictionary is a sentencepiece one) and y_{i-1} does not continue
into the next token (subword-nmt: it does not end with ``@@``). Word-level vocabularies allow every point.

Decoder layout ("step-major"): the K segments advance together, so position t*K + k holds step t of segment k.
A query at step t sees every key at steps <= t in all segments (§3.1), which in this layout is the relaxed causal
mask of SAT with group size K (:func:`~nat_plugins.modules.sat_masks.relaxed_causal_mask`).
"""

import math

import torch

DEL_SYMBOL = "<del>"


def add_segment_symbols(dictionary):
    """Add the DEL symbol to ``dictionary`` (once; adding again is a no-op) and return its index.

    The end of every segment is the dictionary's EOS (the last segment's end is the sentence end), so K = 1 is
    the AR Transformer."""
    return dictionary.add_symbol(DEL_SYMBOL)


def word_boundary_tables(dictionary):
    """Two bool tensors over the vocabulary: ``starts_word[v]`` (a split may come before v) and
    ``continues_word[v]`` (no split may come right after v): sentencepiece ``▁`` and subword-nmt ``@@`` aware."""
    symbols = dictionary.symbols
    sentencepiece = any(symbol.startswith("\u2581") for symbol in symbols)
    starts_word = torch.tensor(
        [
            index < dictionary.nspecial or symbol == DEL_SYMBOL or not sentencepiece or symbol.startswith("\u2581")
            for index, symbol in enumerate(symbols)
        ]
    )
    continues_word = torch.tensor([symbol.endswith("@@") for symbol in symbols])
    return starts_word, continues_word


def allowed_split_points(tokens, starts_word, continues_word):
    """Interior split points 1..n-1 of ``tokens`` (a list of n token ids) that do not cut a word."""
    return [
        i for i in range(1, len(tokens)) if bool(starts_word[tokens[i]]) and not bool(continues_word[tokens[i - 1]])
    ]


def equal_split_points(length, num_segments, allowed=None):
    """EQUAL(n, K-1) = {ceil(i*n/K) : i = 1..K-1} (§3.3; the released code's version is broken). With
    ``allowed`` (the interior points that keep words whole) each point moves to the nearest point of
    {0} + allowed + {n} (ties: the earlier one), which keeps them sorted."""
    points = [math.ceil(i * length / num_segments) for i in range(1, num_segments)]
    if allowed is None:
        return points
    candidates = [0] + list(allowed) + [length]
    return [min(candidates, key=lambda c: (abs(c - point), c)) for point in points]


def random_split_points(length, num_segments, allowed, rng):
    """RAND(n, K-1): K-1 distinct points drawn uniformly from 1..n, the range of EQUAL's points ceil(i*n/K) and
    of the released code's split indices (a point at n leaves the last segment empty: BOS -> EOS), restricted to
    the ``allowed`` interior points that keep words whole; sorted. When fewer than K-1 points are available, all
    of them and the rest at n (empty segments at the end)."""
    candidates = [point for point in allowed if 0 < point < length] + ([length] if length > 0 else [])
    drawn = sorted(rng.sample(candidates, min(num_segments - 1, len(candidates))))
    return drawn + [length] * (num_segments - 1 - len(drawn))


def split_at(tokens, points):
    """The segments of ``tokens`` cut at the sorted ``points``."""
    bounds = [0] + list(points) + [len(tokens)]
    return [list(tokens[start:end]) for start, end in zip(bounds[:-1], bounds[1:])]


def inject_pseudo_repetition(segments, index, prefix_length):
    """§3.2: insert, right after ``segments[index]``, a pseudo-repetitive segment made of its first
    ``prefix_length`` tokens (ending in DEL instead of EOS when batched). Returns (segments, is_pseudo flags)."""
    if not 1 <= prefix_length <= len(segments[index]):
        raise ValueError(f"prefix length {prefix_length} is not in 1..{len(segments[index])} (segment {index})")
    pseudo = segments[index][:prefix_length]
    new_segments = segments[: index + 1] + [pseudo] + segments[index + 1 :]
    flags = [False] * len(new_segments)
    flags[index + 1] = True
    return new_segments, flags


def segment_batch(batch_segments, batch_pseudo, eos, pad, del_index):
    """Decoder inputs and targets (B x L*K, step-major) for a batch of K-segment lists.

    Segment S: inputs BOS (= EOS, as fairseq's decoders) then S; targets S then EOS. A pseudo-repetitive segment
    is ordinary training data that ends in DEL (§3.2: "lots of DEL"): targets S then DEL, every position trained.
    (The released code trains only its DEL; the paper presents the injected segment as ordinary training data.)"""
    num_segments = len(batch_segments[0])
    steps = max(len(segment) for segments in batch_segments for segment in segments) + 1
    inputs, targets = [], []
    for segments, pseudo_flags in zip(batch_segments, batch_pseudo):
        if len(segments) != num_segments:
            raise ValueError(f"every sentence needs {num_segments} segments, got {len(segments)}")
        sentence_inputs, sentence_targets = [], []
        for segment, pseudo in zip(segments, pseudo_flags):
            filler = [pad] * (steps - len(segment) - 1)
            sentence_inputs.append([eos] + segment + filler)
            sentence_targets.append(segment + [del_index if pseudo else eos] + filler)
        inputs.append(sentence_inputs)
        targets.append(sentence_targets)
    return step_major(torch.tensor(inputs, dtype=torch.long)), step_major(torch.tensor(targets, dtype=torch.long))


def step_major(per_segment):
    """B x K x L (segment by segment) -> B x L*K (position t*K + k = step t of segment k)."""
    return per_segment.transpose(1, 2).reshape(per_segment.size(0), -1)


def segment_ids(num_positions, num_segments, device=None):
    """Segment index of every position of the step-major layout (0..K-1 repeated)."""
    return torch.arange(num_segments, device=device).repeat(num_positions // num_segments)
