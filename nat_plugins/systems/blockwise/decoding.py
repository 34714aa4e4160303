"""Verify-accept decoding of ``blockwise_transformer`` (Stern, Shazeer & Uszkoreit, NeurIPS 2018).

One decoder call per step (§4, "Combined Scoring and Proposal"): the k proposals ŷ_{j+1..j+k} made at the last
accepted position j go in as new tokens; at their positions the call yields head 1's distribution p1, which
verifies the next proposal, and at the last position that gets accepted the k heads make the next proposals.
Acceptance (§3, §5):

Options: :class:`BlockwiseDecodingConfig` (acceptance) and
:class:`~nat_plugins.generators.verify_accept_loop.VerifyAcceptDecodingConfig` (int8 drafts, drafting limit).

* ``--block-accept exact``: the longest prefix with ŷ_{j+i} = argmax p1(· | ŷ_{<j+i}) — at least ŷ_{j+1}, which is
  p1's own argmax — so the output is exactly greedy decoding of p1 (the paper's guarantee);
* ``--block-accept topk:M``: ŷ_{j+i} only has to be among the M best tokens of p1 (§5.1, top-k selection);
* ``--min-block-size l``: accept at least l proposals per step whatever the verification says (§5.3);
* a block ends after its first EOS;
* ``--int8-drafts`` (CPU): heads 2..k's feed-forward layer and their output projection run with int8 weights; only
  the drafts can change.

The batched loop and the acceptance rule are :mod:`nat_plugins.generators.verify_accept_loop`, the block call and the
cache rollback :mod:`nat_plugins.engine.block_call` (shared with speculative decoding): sentences of a batch accept
different numbers of tokens per step and leave the batch when they end. Exact acceptance prints the hypotheses
``fairseq-generate --beam 1`` prints for p1 (up to near-ties: see the loop's module). Each hypothesis
also carries ``steps`` (decoder calls for its sentence, the first call on BOS included) and ``mean_accepted_block``
(emitted tokens, EOS included, per decoder call).
"""

import math
from dataclasses import dataclass, field
from typing import Any, List, NamedTuple, Optional

import torch
from torch import nn

from ...engine import int8_copy
from ...generators.base import DecodingConfig
from ...generators.verify_accept_loop import VerifyAcceptDecodingConfig, VerifyAcceptLoop


def parse_block_accept(spec: str) -> int:
    """``exact`` -> 1 and ``topk:M`` -> M: a proposal is accepted when it is among the M best tokens of p1."""
    if spec == "exact":
        return 1
    name, _, value = str(spec).partition(":")
    if name == "topk" and value.isdigit() and int(value) >= 1:
        return int(value)
    raise ValueError(f"--block-accept must be 'exact' or 'topk:M' with an integer M >= 1, got {spec!r}")


class BlockAcceptance(NamedTuple):
    """The acceptance rule of :class:`BlockwiseDecodingConfig`, parsed: top M of p1 and at least l per step."""

    top_m: int
    min_block_size: int


@dataclass
class BlockwiseDecodingConfig(DecodingConfig):
    """Blockwise decoding's acceptance rule (Stern et al. §3 exact, §5.1 top-k selection, §5.3 minimum block
    size); exact is the default because it is the paper's guarantee: the output is greedy decoding of p1."""

    owners = ("blockwise_transformer",)

    block_accept: str = field(
        default="exact",
        metadata={
            "help": "blockwise: accept a proposal if it is p1's argmax ('exact': output = greedy decoding of "
            "head 1, fairseq's up to floating-point near-ties) or among p1's top M ('topk:M')"
        },
    )
    min_block_size: int = field(
        default=1, metadata={"help": "blockwise: accept at least this many proposals per step (1..--block-size)"}
    )

    @classmethod
    def parsed(cls, cfg: Any, block_size: int) -> BlockAcceptance:
        """``cfg``'s ``--min-block-size`` checked against the model's ``block_size`` k, and ``--block-accept`` as M
        (:func:`parse_block_accept`)."""
        options = cls.of(cfg)
        if not 1 <= options.min_block_size <= block_size:
            raise ValueError(
                f"--min-block-size must be between 1 and the model's --block-size ({block_size}), "
                f"got {options.min_block_size}"
            )
        return BlockAcceptance(parse_block_accept(options.block_accept), options.min_block_size)


class BlockwiseGenerator(VerifyAcceptLoop):
    """Blockwise parallel decoding with combined scoring and proposal, batched, with a rolled-back cache;
    ``--block-accept`` and ``--min-block-size`` (:class:`BlockwiseDecodingConfig`), ``--int8-drafts`` and
    ``--max-drafting-sentences`` (:class:`~nat_plugins.generators.verify_accept_loop.VerifyAcceptDecodingConfig`) are
    task options (``draft_every_step`` overrides the last: validation measures what the heads propose)."""

    name = "verify-accept decoding (blockwise_transformer)"

    def __init__(
        self,
        models: List[nn.Module],
        task: Any,
        gen_args: Any,
        use_cache: bool = True,
        draft_every_step: bool = False,
    ) -> None:
        model = models[0]
        if not hasattr(model.decoder, "block_heads"):
            raise ValueError(f"verify-accept decoding needs a blockwise_transformer, got {type(model).__name__}")
        block_size = model.decoder.block_size
        acceptance = BlockwiseDecodingConfig.parsed(task.cfg, block_size)
        drafting = VerifyAcceptDecodingConfig.of(task.cfg)
        super().__init__(
            models,
            task,
            gen_args,
            verifier=model,
            call_width=block_size,
            top_m=acceptance.top_m,
            min_block_size=acceptance.min_block_size,
            use_cache=use_cache,
            max_drafting_sentences=math.inf if draft_every_step else drafting.max_drafting_sentences,
        )
        # what makes the drafts: heads 2..k and the output projection, or with --int8-drafts an int8 copy of both
        decoder = model.decoder
        self.draft_heads, self.draft_projection = decoder.block_heads, decoder.output_layer
        if drafting.int8_drafts:
            if not decoder.block_heads.identity_first_head:
                raise ValueError(
                    "--int8-drafts needs a model trained with --identity-first-head: in this one head 1, the "
                    "verifier, goes through the heads' layer too, so int8 weights would change the output"
                )
            if getattr(decoder, "adaptive_softmax", None) is not None:
                raise ValueError("--int8-drafts needs a decoder with an output projection (not --adaptive-softmax)")
            drafting = nn.ModuleDict({"heads": decoder.block_heads, "projection": decoder.output_projection})
            drafting = int8_copy(drafting, "the heads' feed-forward layer and output projection")
            self.draft_heads, self.draft_projection = drafting["heads"], drafting["projection"]

    def verifier_logits(self, features: torch.Tensor) -> torch.Tensor:
        """Head 1's logits: p1 is the verifier."""
        return self.model.decoder.head_logits(features, range(1)).squeeze(-2)

    def propose(
        self,
        first: torch.Tensor,
        features: Optional[torch.Tensor],
        tokens: torch.Tensor,
        last: torch.Tensor,
        max_len: int,
    ) -> torch.Tensor:
        """Heads 2..k at the last accepted position j (``features`` (B, d), the state that predicted ŷ_{j+1}): their
        argmax (B, k-1), under the length rules of the positions they predict (§4)."""
        logits = self.draft_projection(self.draft_heads(features, range(1, self.call_width)))
        position = last.unsqueeze(1) + torch.arange(1, self.call_width, device=last.device)
        return self.constrain_logits(logits, position, max_len).argmax(dim=-1)
