"""Option values and checks that several models, criteria and tools share (one definition each)."""

# L: fertilities are predicted with a softmax over 0..L-1 (Gu et al., ICLR 2018, §3.3), and the fertility files
# are clamped to L-1 (nat_plugins.cli.fertility)
DEFAULT_MAX_FERTILITY = 50

# how a non-autoregressive decoder's inputs are copied from the source (Gu et al. §3.1): by fertility, or spread
# uniformly over the target length
COPY_MODES = ("fertility", "uniform")


def check_label_smoothing(epsilon: float) -> float:
    """``--label-smoothing`` epsilon of a label-smoothed NLL (fairseq's ``label_smoothed_nll_loss``)."""
    if not 0.0 <= epsilon < 1.0:
        raise ValueError(f"--label-smoothing must be in [0, 1), got {epsilon}")
    return epsilon
