"""One timing protocol for every row: a shared schedule timed round-robin, so machine drift hits all rows alike.

At each batch size the benchmark cuts the sentences into units (batch 1: one timed sentence each; batch B: the
split's length-sorted batches of B) and deals them into ``rounds`` interleaved blocks (unit ``u`` goes to block
``u mod rounds``, so every block has the same mix of lengths; with fewer units than rounds each block has them all).
Round ``r`` times every row on block ``r``, the rows in a random order drawn afresh each round from an RNG seeded
with the benchmark's ``--seed`` and the batch size (:func:`round_orders`, recorded in ``results.json``): a row's slot
and neighbours change at random from round to round, so what one row leaves behind for the next (a warm or cold
cache, a CPU that has just clocked up or down) does not fall on the same row every round. Every row's timed region
is the same: its inputs (source ids) prepared, then ``decode`` (best hypothesis ids out) on the clock; bookkeeping
(text, counts) after it. After the last round the anchor row (fairseq's greedy teacher) decodes block 0 again: its
start-vs-end drift says how much the machine changed while the rows were timed.

Per row and round the ratio to the anchor (the anchor's block time / the row's, > 1: faster) is paired: both timed
on the same block in the same round. Every "×" the benchmark reports is the median of such per-round ratios
(:mod:`.analysis`), shown with their range over the rounds; a ratio whose median is no further from 1 than the
rounds' spread is flagged, not a win.
"""

import random
import statistics
import time
from dataclasses import dataclass
from typing import Callable, List, Protocol, Sequence

from .rows import BenchmarkError, spread


class Runner(Protocol):
    """A row as the schedule times it (:class:`.measure.FairseqRunner`, the CTranslate2 runner)."""

    def inputs(self, indices: List[int]):
        """Untimed: the model inputs (source ids) of the sentences ``indices``."""

    def decode(self, inputs):
        """Timed: decode ``inputs``, returning the best hypotheses' ids (synchronous: the work is done)."""

    def record(self, inputs, outputs):
        """Untimed: keep what the row reports of ``outputs`` (hypotheses, counts), keyed by sentence."""


def time_unit(runner: Runner, indices: List[int], clock: Callable[[], float]) -> float:
    """Seconds ``runner`` takes to decode the sentences ``indices`` (inputs prepared and outputs recorded off the
    clock)."""
    inputs = runner.inputs(indices)
    start = clock()
    outputs = runner.decode(inputs)
    seconds = clock() - start
    runner.record(inputs, outputs)
    return seconds


def interleaved_blocks(units: Sequence[List[int]], rounds: int) -> List[List[List[int]]]:
    """``units`` dealt into ``rounds`` blocks: block ``r`` holds units ``r, r + rounds, r + 2·rounds, ...``; with
    fewer units than rounds every block holds them all (the rounds repeat them)."""
    if not units:
        raise BenchmarkError("no sentences to time")
    if len(units) < rounds:
        return [list(units) for _ in range(rounds)]
    return [list(units[r::rounds]) for r in range(rounds)]


def round_orders(num_rows: int, rounds: int, seed: int, batch_size: int) -> List[List[int]]:
    """The order rows are timed in, per round: independent random permutations of ``range(num_rows)`` from an RNG
    seeded with ``seed`` and ``batch_size`` (the same run repeats them; every batch size has its own, whichever other
    sizes are timed)."""
    rng = random.Random(f"{seed}:{batch_size}")
    return [rng.sample(range(num_rows), num_rows) for _ in range(rounds)]


@dataclass
class Rounds:
    """The timings of one batch size: ``seconds[row][round]`` = seconds of every unit of the round's block (in
    block order), ``order[round]`` = the rows in the order timed (:func:`round_orders`), ``anchor_end`` = seconds of
    the anchor on block 0 timed again after the last round."""

    batch_size: int
    blocks: List[List[List[int]]]
    seconds: List[List[List[float]]]
    order: List[List[int]]
    anchor: int
    anchor_end: float

    def totals(self, row: int) -> List[float]:
        """Seconds of ``row`` on each round's block."""
        return [sum(unit) for unit in self.seconds[row]]

    def sentences(self) -> List[int]:
        """Sentences of each round's block."""
        return [sum(len(unit) for unit in block) for block in self.blocks]

    def ratios(self, row: int) -> List[float]:
        """Per round: the anchor's seconds / ``row``'s on the same block (> 1: ``row`` is faster)."""
        return [a / b for a, b in zip(self.totals(self.anchor), self.totals(row))]

    @property
    def drift(self) -> float:
        """The anchor's block-0 time after the last round relative to its first round (0.05: 5% slower at the
        end)."""
        return self.anchor_end / self.totals(self.anchor)[0] - 1


def run_rounds(
    runners: Sequence[Runner],
    units: Sequence[List[int]],
    rounds: int,
    anchor: int,
    batch_size: int,
    seed: int,
    warmup: Sequence[List[int]] = (),
    clock: Callable[[], float] = time.perf_counter,
) -> Rounds:
    """Time every runner on every unit round-robin, the rows of each round in the order :func:`round_orders` draws
    from ``seed`` (see the module docstring); ``warmup`` units are decoded by every runner first, off the clock."""
    blocks = interleaved_blocks(units, rounds)
    for runner in runners:
        for unit in warmup:
            runner.decode(runner.inputs(unit))
    seconds = [[[] for _ in blocks] for _ in runners]
    order = round_orders(len(runners), len(blocks), seed, batch_size)
    for r, block in enumerate(blocks):
        for row in order[r]:
            seconds[row][r] = [time_unit(runners[row], unit, clock) for unit in block]
    anchor_end = sum(time_unit(runners[anchor], unit, clock) for unit in blocks[0])
    return Rounds(batch_size, blocks, seconds, order, anchor, anchor_end)


def unsettled(ratios: List[float]) -> bool:
    """True when the rounds do not settle a win or a loss: the median ratio is no further from 1 than the ratios'
    spread across rounds (all rounds equal to 1, the anchor itself, is settled)."""
    return bool(ratios) and spread(ratios) > 0 and abs(statistics.median(ratios) - 1) <= spread(ratios)


def units_of(batch_size: int, order: Sequence[int]) -> List[List[int]]:
    """The sentences ``order`` cut into units of ``batch_size`` (the last may be smaller)."""
    return [list(order[start : start + batch_size]) for start in range(0, len(order), batch_size)]


def time_batch_sizes(
    runners, sizes, rounds, anchor, latency_ids, warmup_ids, length_order, seed, clock=time.perf_counter
):
    """:func:`run_rounds` at every batch size of ``sizes`` (row orders drawn from ``seed``): batch 1 on the sentences
    ``latency_ids`` (after the ``warmup_ids``, decoded off the clock), any larger size on the whole split in
    ``length_order`` (its first unit decoded once off the clock). Returns ``{size: (Rounds, [every runner's outputs
    by sentence])}``."""
    timings = {}
    for size in sizes:
        if size == 1:
            units, warmup = units_of(1, latency_ids), units_of(1, warmup_ids)
        else:
            units = units_of(size, length_order)
            warmup = units[:1]
        timed = run_rounds(runners, units, rounds, anchor, size, seed, warmup, clock)
        timings[size] = (timed, [runner.outputs for runner in runners])
        for runner in runners:
            runner.outputs = {}
    return timings
