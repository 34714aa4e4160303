"""One timing protocol for every row: a shared schedule timed round-robin, so machine drift hits all rows alike.

At each batch size the benchmark cuts the sentences into units (batch 1: one timed sentence each; batch B: the
split's length-sorted batches of B) and deals them into ``rounds`` interleaved blocks (unit ``u`` goes to block
``u mod rounds``, so every block has the same mix of lengths; with fewer units than rounds each block has them all).
Round ``r`` times every row on block ``r``, the rows in a random order drawn afresh each round from an RNG seeded
with the benchmark's ``--seed`` and the batch size (:func:`round_orders`, recorded in ``results.json``): a row's slot
and neighbours change at random from round to round, so what one row leaves behind for the next (a warm or cold
cache, a CPU that has just clocked up or down) does not fall on the same row every round. Before the first round every
row decodes every unit once, timed apart (the cold pass, :func:`cold_pass`): what a row pays once per new shape
(kernel plans, traces, graph captures) shows there, beside its warm rounds, and is charged to no round of any row
(with a plan, the budget counts it). Every row's timed region
is the same: its inputs (source ids) prepared, then ``decode`` (best hypothesis ids out) on the clock; bookkeeping
(text, counts) after it. After the last round the anchor row (fairseq's greedy teacher) decodes block 0 again: its
start-vs-end drift says how much the machine changed while the rows were timed.

With a time budget (:class:`TimeBudget`, the benchmark's ``--time-budget``) a plan comes first, made from each row's
timed warm-up (:func:`make_plan`): every required row on as many batch-1 sentences as the budget allows, then the
optional rows in their priority order while the estimate still fits. The rows kept decode the first batched size
(every row's hypotheses, hence its BLEU), then batch 1, then the other batched sizes that still fit; a round that ends
past the deadline is the last one (the rounds not timed are counted, never silent).

Per row and round the ratio to the anchor (the anchor's block time / the row's, > 1: faster) is paired: both timed
on the same block in the same round. Every "×" the benchmark reports is the median of such per-round ratios
(:mod:`.analysis`), shown with their range over the rounds; a ratio whose median is no further from 1 than the
rounds' spread is flagged, not a win.
"""

import functools
import random
import statistics
import time
from dataclasses import dataclass
from typing import Callable, List, Optional, Protocol, Sequence

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
    the anchor on block 0 timed again after the last round; ``rounds_cut``: rounds left untimed because the time budget
    ran out (their blocks are not in ``blocks``); ``cold[row]``: seconds of the row's cold pass, every unit decoded
    once before the first round (:func:`cold_pass`)."""

    batch_size: int
    blocks: List[List[List[int]]]
    seconds: List[List[List[float]]]
    order: List[List[int]]
    anchor: int
    anchor_end: float
    rounds_cut: int = 0
    cold: Optional[List[float]] = None  # per row: seconds of its cold pass over every unit (None: no cold pass)

    def totals(self, row: int) -> List[float]:
        """Seconds of ``row`` on each round's block."""
        return [sum(unit) for unit in self.seconds[row]]

    def sentences(self) -> List[int]:
        """Sentences of each round's block."""
        return [sum(len(unit) for unit in block) for block in self.blocks]

    def distinct_sentences(self) -> int:
        """Sentences timed, each once (with fewer units than rounds every round's block holds them all)."""
        return len({i for block in self.blocks for unit in block for i in unit})

    def ratios(self, row: int) -> List[float]:
        """Per round: the anchor's seconds / ``row``'s on the same block (> 1: ``row`` is faster)."""
        return [a / b for a, b in zip(self.totals(self.anchor), self.totals(row))]

    def cold_ms_per_sentence(self, row: int) -> Optional[float]:
        """``row``'s cold pass in ms per sentence (each distinct sentence once; None: no cold pass)."""
        return None if self.cold is None else 1000 * self.cold[row] / self.distinct_sentences()

    @property
    def drift(self) -> float:
        """The anchor's block-0 time after the last round relative to its first round (0.05: 5% slower at the
        end)."""
        return self.anchor_end / self.totals(self.anchor)[0] - 1


# told after each row's block of a pass (the cold pass or a round): (phase, row, row blocks done in the pass, of how
# many, seconds since the pass started), e.g. for a progress line
RowDone = Callable[[str, int, int, int, float], None]


def cold_pass(
    runners: Sequence[Runner], units: Sequence[List[int]], seed: int, batch_size: int, clock, row_done=None
) -> List[float]:
    """Every runner decodes every unit once, the rows in a random order drawn from ``seed`` and ``batch_size``; returns
    each runner's seconds (``row_done(row)`` after each). A cost paid once per new shape (a kernel plan, a trace, a
    graph capture, an allocation) is paid here, never inside a timed round; one shared by rows of the same shapes falls
    on the first of them."""
    seconds = [0.0] * len(runners)
    for row in random.Random(f"{seed}:{batch_size}:cold").sample(range(len(runners)), len(runners)):
        seconds[row] = sum(time_unit(runners[row], unit, clock) for unit in units)
        if row_done is not None:
            row_done(row)
    return seconds


def run_rounds(
    runners: Sequence[Runner],
    units: Sequence[List[int]],
    rounds: int,
    anchor: int,
    batch_size: int,
    seed: int,
    warmup: Sequence[List[int]] = (),
    clock: Callable[[], float] = time.perf_counter,
    deadline: Optional[float] = None,
    after_round: Optional[Callable[["Rounds"], None]] = None,
    cold: bool = True,
    row_done: Optional[RowDone] = None,
) -> Rounds:
    """Time every runner on every unit round-robin, the rows of each round in the order :func:`round_orders` draws
    from ``seed`` (see the module docstring); ``warmup`` units are decoded by every runner first, off the clock, then
    (``cold``) every unit once by every runner, timed apart (:func:`cold_pass`). A round that ends at or past
    ``deadline`` (on ``clock``) is the last; ``after_round`` gets the rounds so far, ``row_done`` each row's block."""
    blocks = interleaved_blocks(units, rounds)
    for runner in runners:
        for unit in warmup:
            runner.decode(runner.inputs(unit))
    started, blocks_done, blocks_total = clock(), [0], (len(blocks) + cold) * len(runners)

    def finished(phase: str, row: int):
        blocks_done[0] += 1
        if row_done is not None:
            row_done(phase, row, blocks_done[0], blocks_total, clock() - started)

    distinct = list({tuple(unit): list(unit) for block in blocks for unit in block}.values())
    cold_done = functools.partial(finished, "cold pass")
    cold_seconds = cold_pass(runners, distinct, seed, batch_size, clock, cold_done) if cold else None
    seconds = [[[] for _ in blocks] for _ in runners]
    order = round_orders(len(runners), len(blocks), seed, batch_size)
    total = done = len(blocks)
    for r, block in enumerate(blocks):
        for row in order[r]:
            seconds[row][r] = [time_unit(runners[row], unit, clock) for unit in block]
            finished(f"round {r + 1} of {len(blocks)}", row)
        if after_round is not None:
            so_far = [s[: r + 1] for s in seconds]
            after_round(Rounds(batch_size, blocks[: r + 1], so_far, order[: r + 1], anchor, 0.0, cold=cold_seconds))
        if deadline is not None and clock() >= deadline:
            done = r + 1
            break
    blocks, seconds, order = blocks[:done], [s[:done] for s in seconds], order[:done]
    anchor_end = sum(time_unit(runners[anchor], unit, clock) for unit in blocks[0])
    return Rounds(batch_size, blocks, seconds, order, anchor, anchor_end, total - done, cold_seconds)


def unsettled(ratios: List[float]) -> bool:
    """True when the rounds do not settle a win or a loss: the median ratio is no further from 1 than the ratios'
    spread across rounds (all rounds equal to 1, the anchor itself, is settled)."""
    return bool(ratios) and spread(ratios) > 0 and abs(statistics.median(ratios) - 1) <= spread(ratios)


def units_of(batch_size: int, order: Sequence[int]) -> List[List[int]]:
    """The sentences ``order`` cut into units of ``batch_size`` (the last may be smaller)."""
    return [list(order[start : start + batch_size]) for start in range(0, len(order), batch_size)]


@dataclass
class TimeBudget:
    """The benchmark's time budget: ``deadline`` on the schedule's clock, ``reserve`` seconds before it kept for the
    report, and the ``optional`` rows (indices, highest priority first) decoded only if the plan leaves time for them;
    every other row is decoded whatever the budget (batch 1 on fewer sentences if need be)."""

    deadline: float
    reserve: float = 0.0
    optional: Sequence[int] = ()


@dataclass
class Plan:
    """What the budget leaves: the rows decoded (indices, increasing), how many of the latency sentences batch 1 times,
    the rows left out, and the estimates (seconds, from each row's warm-up) the plan was made from: per batch-1
    sentence and per batched pass of the first batch size."""

    rows: List[int]
    sentences: int
    left_out: List[int]
    estimates: List[float]
    batched_estimates: List[float]


def timed_warmup(runners, warmup: Sequence[List[int]], clock: Callable[[], float]) -> List[List[float]]:
    """Decode the ``warmup`` units with every runner (warm-up, off the round-robin clock), returning each runner's
    seconds per unit."""
    seconds = []
    for runner in runners:
        seconds.append([time_unit(runner, unit, clock) for unit in warmup])
        runner.outputs = {}
    return seconds


def per_sentence(seconds: List[float]) -> float:
    """A row's batch-1 seconds per sentence from its warm-up: the median after the first sentence (whose call pays for
    caches and kernels), or that one alone."""
    return statistics.median(seconds[1:] or seconds) if seconds else 0.0


def make_plan(
    estimates, batched, anchor: int, units: int, rounds: int, remaining: float, optional, passes: int = 2
) -> Plan:
    """The rows and batch-1 sentences that ``remaining`` seconds allow, by ``estimates`` (seconds per batch-1 sentence
    per row; the anchor decodes a round's block again at the end) and ``batched`` (seconds of each row's batched
    pass), each unit decoded ``passes`` times (2: the cold pass and its timed round): every row not in ``optional`` on
    as many of the ``units`` sentences as fit (at least one per round), then the ``optional`` rows in their order while
    both their passes still fit."""
    required = [k for k in range(len(estimates)) if k not in optional]
    fixed = passes * sum(batched[k] for k in required)
    cost = passes * sum(estimates[k] for k in required) + estimates[anchor] / rounds  # a batch-1 sentence of every row
    sentences = units if fixed + cost * units <= remaining else int((remaining - fixed) // max(cost, 1e-9))
    sentences = min(units, max(rounds, sentences))
    rows, left_out = list(required), []
    for k in optional:
        if fixed + passes * (batched[k] + estimates[k] * sentences) + cost * sentences <= remaining:
            rows.append(k)
            fixed, cost = fixed + passes * batched[k], cost + passes * estimates[k]
        else:
            left_out.append(k)
    return Plan(sorted(rows), sentences, left_out, estimates, batched)


def time_batch_sizes(
    runners,
    sizes,
    rounds,
    anchor,
    latency_ids,
    warmup_ids,
    length_order,
    seed,
    clock=time.perf_counter,
    budget: Optional[TimeBudget] = None,
    progress: Optional[Callable[[int, "Rounds", List[int], list], None]] = None,
    cold: bool = True,
    row_done: Optional[Callable[..., None]] = None,
):
    """:func:`run_rounds` at every batch size of ``sizes`` (row orders drawn from ``seed``): batch 1 on the sentences
    ``latency_ids`` (after the ``warmup_ids``, decoded off the clock), any larger size on the whole split in
    ``length_order`` (its first unit decoded once off the clock); the batched sizes first, in the order of ``sizes``,
    then batch 1. ``progress(size, rounds, rows, outputs)`` is called after every round: the rounds so far, the
    indices of their rows in ``runners`` and those rows' outputs by sentence so far. ``cold``: every size's units are
    decoded once by every row before its rounds (:func:`cold_pass`), and the plan counts that pass. ``row_done(size,
    phase, runner, done, total, seconds)`` after each row's block of a pass (:data:`RowDone`, ``runner`` its index in
    ``runners``).

    With a ``budget`` the plan comes first (:func:`make_plan`, from every row's warm-up at batch 1 and on the first
    batched size's median unit, timed): the rows it keeps decode the first batched size (their BLEU), then batch 1 on
    its number of sentences (a round ending past the deadline is the last), then each other batched size whose
    estimate still fits (its warm-up: its median unit).

    Returns ``({size: (Rounds, [outputs by sentence, per row])}`` in increasing size, the :class:`Plan` (None without a
    budget), the batched sizes skipped)``; with a plan every Rounds and outputs list holds the plan's rows only, in its
    order."""
    batched = [size for size in sizes if size > 1]
    latency_units, warmup_units = units_of(1, latency_ids), units_of(1, warmup_ids)
    rows, plan, timings, skipped = list(range(len(runners))), None, {}, []
    if budget is not None:
        estimates = [per_sentence(s) for s in timed_warmup(runners, warmup_units, clock)]
        first = units_of(batched[0], length_order) if batched else []
        middle = [first[len(first) // 2]] if first else []
        batched_seconds = [len(first) * sum(s) for s in timed_warmup(runners, middle, clock)]
        remaining = budget.deadline - budget.reserve - clock()
        plan = make_plan(
            estimates, batched_seconds, anchor, len(latency_units), rounds, remaining, budget.optional, 1 + cold
        )
        rows, latency_units, warmup_units = plan.rows, latency_units[: plan.sentences], ()
    timed_runners, timed_anchor = [runners[k] for k in rows], rows.index(anchor)

    def report(size):
        if progress is not None:
            return lambda timed: progress(size, timed, rows, [runner.outputs for runner in timed_runners])

    def told(size):
        if row_done is not None:
            return lambda phase, row, *rest: row_done(size, phase, rows[row], *rest)

    def run(size, units, warmup, deadline=None):
        timed = run_rounds(
            timed_runners,
            units,
            rounds,
            timed_anchor,
            size,
            seed,
            warmup,
            clock,
            deadline,
            report(size),
            cold,
            told(size),
        )
        timings[size] = (timed, [runner.outputs for runner in timed_runners])
        for runner in timed_runners:
            runner.outputs = {}

    if budget is None:
        for size in batched:
            units = units_of(size, length_order)
            run(size, units, units[:1])
        if 1 in sizes:
            run(1, latency_units, warmup_units)
        return dict(sorted(timings.items())), plan, skipped
    deadline = budget.deadline - budget.reserve
    per_unit = 0.0  # seconds of a unit of the first batched size, every timed row together
    if batched:
        units, started = units_of(batched[0], length_order), clock()
        run(batched[0], units, ())  # its warm-up was the plan's
        per_unit = (clock() - started) / len(units)
    if 1 in sizes:
        run(1, latency_units, (), deadline)
    for size in batched[1:]:  # if the first size's cost per unit, as many units, still fits
        units = units_of(size, length_order)
        if clock() + per_unit * len(units) * max(1.0, size / batched[0]) > deadline:
            skipped.append(size)
            continue
        run(size, units, [units[len(units) // 2]])
    return dict(sorted(timings.items())), plan, skipped
