"""Segments of RecoverSAT (Ran, Lin, Li & Zhou, ACL 2020, "Learning to Recover from Multi-Modality Errors for
Non-Autoregressive Neural Machine Translation"): the DEL symbol, split points (§3.3 mixed annealing dividing),
pseudo-repetitive segment injection (§3.2), training batches of segments and the segment layout helpers.

A target y_1..y_n (without EOS) is cut at split points 0 <= c_1 <= ... <= c_{K-1} <= n into K segments
S_k = y[c_{k-1}:c_k] (c_0 = 0, c_K = n); equal points give empty segments, which are just BOS -> EOS.
By default a split point may fall at any subword position, as in the paper's EQUAL(n, m) = {ceil(i*n/(m+1))}
and RAND over [1, n] (eq. 5-6). With ``boundary_tables`` (:func:`word_boundary_tables`; the criterion's
``--split-at-word-starts``) a point i (between y_{i-1} and y_i) is allowed only when y_i starts a word
(sentencepiece: it begins with ``▁``, when the dictionary is a sentencepiece one) and y_{i-1} does not continue
into the next token (subword-nmt: it does not end with ``@@``); word-level vocabularies allow every point. On the
released code's split rules: see docs/design-notes.md, *RecoverSAT split points and the released code*.

Decoder layout ("step-major"): the K segments advance together, so position t*K + k holds step t of segment k.
A query at step t sees every key at steps <= t in all segments (§3.1), which in this layout is the relaxed causal
mask of SAT with group size K (:func:`~nat_plugins.modules.grouped_decoder.relaxed_causal_mask`).
"""

from typing import NamedTuple, Optional, Tuple

import torch
import torch.nn.functional as F
from fairseq.data import Dictionary

DEL_SYMBOL = "<del>"


def add_segment_symbols(dictionary: Dictionary) -> int:
    """Add the DEL symbol to ``dictionary`` (once; adding again is a no-op) and return its index.

    The end of every segment is the dictionary's EOS (the last segment's end is the sentence end), so K = 1 is
    the AR Transformer."""
    return dictionary.add_symbol(DEL_SYMBOL)


def word_boundary_tables(dictionary: Dictionary) -> Tuple[torch.Tensor, torch.Tensor]:
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


class SegmentDraws(NamedTuple):
    """The random draws that segment one training batch (§3.2-3.3), uniform in [0, 1), float64 (B sentences, T
    target columns, K segments). Each decision of the per-sentence procedure uses draws of its own, so the batch is
    segmented in a few tensor operations with the distribution of that procedure:

    * ``inject`` (B,): the sentence gets a pseudo-repetitive segment when ``inject < q``;
    * ``rand`` (B,): RAND rather than EQUAL split points when ``rand < p``;
    * ``point_keys`` (B, T): RAND takes the candidate points with the smallest keys (i.i.d. keys: every subset of
      the candidates of that size equally likely, as sampling without replacement);
    * ``segment_keys`` (B, K): the repeated segment is the non-empty one with the smallest key (uniform among them);
    * ``prefix`` (B,): the repeated prefix has 1 + floor(prefix * |S|) tokens (uniform on 1..|S|)."""

    inject: torch.Tensor
    rand: torch.Tensor
    point_keys: torch.Tensor
    segment_keys: torch.Tensor
    prefix: torch.Tensor

    @classmethod
    def sample(
        cls,
        batch_size: int,
        num_columns: int,
        num_segments: int,
        generator: Optional[torch.Generator] = None,
        device: Optional[torch.device] = None,
    ) -> "SegmentDraws":
        """Fresh draws from ``generator`` (a ``torch.Generator`` on ``device``)."""

        def uniform(*shape: int) -> torch.Tensor:
            return torch.rand(shape, generator=generator, device=device, dtype=torch.float64)

        return cls(
            uniform(batch_size),
            uniform(batch_size),
            uniform(batch_size, num_columns),
            uniform(batch_size, num_segments),
            uniform(batch_size),
        )


def allowed_split_mask(
    target: torch.Tensor, lengths: torch.Tensor, boundary_tables: Optional[Tuple[torch.Tensor, torch.Tensor]] = None
) -> torch.Tensor:
    """(B, T) bool: point i (between ``target[:, i-1]`` and ``target[:, i]``) is an interior split point 1..n-1 of
    its sentence (``lengths``: n, EOS excluded); with ``boundary_tables`` (``word_boundary_tables`` on the device),
    only those that do not cut a word."""
    grid = point_grid(target)
    allowed = grid.gt(0) & (grid < lengths.unsqueeze(1))
    if boundary_tables is not None:
        starts_word, continues_word = boundary_tables
        allowed[:, 1:] &= starts_word[target[:, 1:]] & ~continues_word[target[:, :-1]]
    return allowed


def point_grid(target: torch.Tensor) -> torch.Tensor:
    """(1, T): the split points 0..T-1 a (B, T) target can have (n <= T-1: EOS is last)."""
    return torch.arange(target.size(1), device=target.device).unsqueeze(0)


def equal_split_points(
    lengths: torch.Tensor, num_parts: torch.Tensor, allowed: torch.Tensor, num_points: int
) -> torch.Tensor:
    """EQUAL(n, m-1) = {ceil(i*n/m) : i = 1..m-1} (§3.3) of every sentence, (B, ``num_points``): ``lengths`` n
    and ``num_parts`` m ((B,) each); slots i >= m hold n. Each point moves to the nearest of {0} + ``allowed``
    ((B, T), :func:`allowed_split_mask`) + {n} (ties: the earlier one), so the points stay sorted (with every interior
    point allowed, none moves; with word starts only, words stay whole)."""
    n, m = lengths.unsqueeze(1), num_parts.unsqueeze(1)
    i = torch.arange(1, num_points + 1, device=lengths.device).unsqueeze(0)
    points = ((i * n + m - 1) // m).clamp(max=n)  # (B, P)
    grid = point_grid(allowed)
    candidates = allowed | grid.eq(0) | grid.eq(n)  # (B, T)
    distance = (grid.unsqueeze(1) - points.unsqueeze(2)).abs()  # (B, P, T)
    columns = allowed.size(1)
    key = (distance * columns + grid.unsqueeze(1)).masked_fill(~candidates.unsqueeze(1), columns * columns)
    return key.argmin(dim=2)


def random_split_points(
    lengths: torch.Tensor, num_parts: torch.Tensor, allowed: torch.Tensor, keys: torch.Tensor, num_points: int
) -> torch.Tensor:
    """RAND(n, m-1) (§3.3) of every sentence, (B, ``num_points``): min(m-1, c) distinct points drawn uniformly from
    the c candidates, the ``allowed`` interior points and n (n > 0; a point at n leaves the last segment empty:
    BOS -> EOS; the range of EQUAL's points and of the released code's split indices) — those with the smallest
    ``keys`` ((B, T), i.i.d. uniform) — then n in the remaining slots; sorted."""
    n = lengths.unsqueeze(1)
    grid = point_grid(allowed)
    candidates = allowed | (grid.eq(n) & n.gt(0))
    drawn = keys.masked_fill(~candidates, 2.0).topk(min(num_points, keys.size(1)), dim=1, largest=False).indices
    drawn = F.pad(drawn, (0, num_points - drawn.size(1)))
    count = torch.minimum(num_parts - 1, candidates.sum(dim=1)).unsqueeze(1)
    slots = torch.arange(num_points, device=lengths.device).unsqueeze(0)
    return torch.where(slots < count, drawn, n).sort(dim=1).values


def segment_targets(
    target: torch.Tensor,
    num_segments: int,
    pad: int,
    eos: int,
    del_index: int,
    boundary_tables: Optional[Tuple[torch.Tensor, torch.Tensor]] = None,
    p: float = 0.0,
    q: float = 0.0,
    draws: Optional[SegmentDraws] = None,
    pseudo_tokens: bool = False,
    nonempty_first: bool = False,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Decoder inputs and targets ((B, L·K), step-major) of a batch of ``target`` s ((B, T), right-padded, EOS last)
    cut into K = ``num_segments`` segments, and which sentences got a pseudo-repetitive segment ((B,) bool). Split
    points fall at any subword position, or only at word starts with ``boundary_tables`` (module docstring).

    With ``draws`` (:class:`SegmentDraws`; training): mixed annealing dividing (§3.3: RAND split points with
    probability ``p``, else EQUAL) and, with probability ``q`` per non-empty sentence (K > 1), a pseudo-repetitive
    segment (§3.2): the sentence is cut into K-1 segments and a prefix of random length 1..|S| of a random non-empty
    segment S is inserted right after S. Without: EQUAL points, no injection (validation).

    Segment S: inputs BOS (= EOS, as fairseq's decoders) then S; targets S then EOS. A pseudo-repetitive segment
    keeps its inputs (the copied prefix) but only its DEL is a target (its copied tokens are padding: the model learns
    to delete a repetition, not to make one), as the released code trains it; with ``pseudo_tokens`` its copied
    tokens are targets too ("lots of DEL" read as ordinary training data). L is the longest segment of the batch + 1;
    shorter segments are filled with padding. ``nonempty_first`` (beyond the paper): a sentence of n < K subwords is
    cut into n parts (EQUAL or RAND over n parts, n - 1 points), the K - n empty segments last, where EQUAL's
    ceil(i·n/K) would leave them between the non-empty ones."""
    batch_size, columns = target.shape
    K = num_segments
    lengths = target.ne(pad).sum(dim=1) - 1
    allowed = allowed_split_mask(target, lengths, boundary_tables)
    training = draws is not None
    inject = draws.inject.lt(q) & lengths.gt(0) & (K > 1) if training else torch.zeros_like(lengths, dtype=torch.bool)
    parts = K - inject.long()  # an injected sentence is cut into K-1 segments (its K-th one below is empty)
    if nonempty_first:  # no more parts than subwords: the segments past them are empty, at the end
        parts = torch.minimum(parts, lengths.clamp(min=1))
    points = equal_split_points(lengths, parts, allowed, K - 1)
    if training:
        rand = random_split_points(lengths, parts, allowed, draws.point_keys, K - 1)
        points = torch.where(draws.rand.lt(p).unsqueeze(1), rand, points)
    zero = lengths.new_zeros(batch_size, 1)
    bounds = torch.cat([zero, points, lengths.unsqueeze(1)], dim=1)
    starts, sizes = bounds[:, :-1], bounds[:, 1:] - bounds[:, :-1]  # (B, K)
    segment = torch.arange(K, device=target.device).unsqueeze(0)
    pseudo = torch.zeros_like(sizes, dtype=torch.bool)
    if training:
        # the repeated segment S (K: none), its prefix length, then segment k is the old k-1 after the inserted one
        chosen = draws.segment_keys.masked_fill(sizes.eq(0), 2.0).argmin(dim=1).masked_fill(~inject, K).unsqueeze(1)
        size = sizes.gather(1, chosen.clamp(max=K - 1))
        prefix = (1 + (draws.prefix.unsqueeze(1) * size).long()).clamp(max=size)
        source = segment - segment.gt(chosen).long()
        pseudo = segment.eq(chosen + 1)
        starts = starts.gather(1, source)
        sizes = torch.where(pseudo, prefix, sizes.gather(1, source))
    steps = int(sizes.max()) + 1
    step = torch.arange(steps, device=target.device)
    sizes = sizes.unsqueeze(2)  # (B, K, 1)
    index = (starts.unsqueeze(2) + step).clamp(max=columns - 1).view(batch_size, -1)
    tokens = target.gather(1, index).view(batch_size, K, steps)  # (B, K, L): the segment's tokens from its start
    end = torch.where(pseudo, del_index, eos).unsqueeze(2)
    trained_tokens = step < sizes if pseudo_tokens else (step < sizes) & ~pseudo.unsqueeze(2)
    targets = torch.where(trained_tokens, tokens, torch.where(step == sizes, end, pad))
    inputs = torch.where(step[:-1] < sizes, tokens[..., :-1], pad)
    inputs = torch.cat([inputs.new_full((batch_size, K, 1), eos), inputs], dim=2)
    return step_major(inputs), step_major(targets), inject


def step_major(per_segment: torch.Tensor) -> torch.Tensor:
    """(B, K, L) (segment by segment) -> (B, L·K) (position t*K + k = step t of segment k)."""
    return per_segment.transpose(1, 2).reshape(per_segment.size(0), -1)


def segment_ids(num_positions: int, num_segments: int, device: Optional[torch.device] = None) -> torch.Tensor:
    """Segment index of every position of the step-major layout, (num_positions,): 0..K-1 repeated."""
    return torch.arange(num_segments, device=device).repeat(num_positions // num_segments)
