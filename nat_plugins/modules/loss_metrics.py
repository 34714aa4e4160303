"""Logging helpers the criterions share (fairseq's conventions: losses in bits per unit, perplexity of nll_loss)."""

import math
from typing import Any, Callable, Dict, List

from fairseq import utils
from fairseq.logging import metrics

Sample = Dict[str, Any]  # a fairseq batch: net_input, target, ntokens, side inputs
LoggingOutput = Dict[str, Any]
Total = Callable[[str], float]


def summed(logging_outputs: List[LoggingOutput]) -> Total:
    """``total(key)``: the sum of ``key`` over the logging outputs of all batches/workers (0 where absent)."""
    return lambda key: sum(log.get(key, 0) for log in logging_outputs)


def log_bits(name: str, nats: float, count: float) -> None:
    """Log ``nats`` summed over ``count`` units as bits per unit."""
    metrics.log_scalar(name, nats / max(count, 1) / math.log(2), count, round=3)


def log_loss_and_nll(total: Total, sample_size: float, nll_count: float) -> None:
    """``loss`` per ``sample_size``, ``nll_loss`` per ``nll_count`` target tokens, and ``ppl`` of the latter."""
    log_bits("loss", total("loss"), sample_size)
    log_bits("nll_loss", total("nll_loss"), nll_count)
    metrics.log_derived("ppl", lambda meters: utils.get_perplexity(meters["nll_loss"].avg))
