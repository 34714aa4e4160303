"""A frozen autoregressive teacher used at training time (``nat_rkl_finetune``) or decoding time (NPD rescoring).

The teacher lives in a plain Python holder, not an ``nn.Module`` attribute of a model or criterion, so it is never
registered as a submodule: it is not saved in the student's checkpoint, not seen by the optimizer, and not wrapped
by DDP. It is put in eval mode with ``requires_grad=False`` and moved to the student's device/dtype on first use.
Checkpoints are pickles: load only trusted files.
"""

import os

import torch
from fairseq import checkpoint_utils

from .cpu_linear import use_weight_first_linears
from .log_probs import token_log_probs


class FrozenTeacher:
    """An AR Transformer loaded from ``path`` with the student's task (hence the student's dictionaries).

    ``option`` names the command-line option in error messages (``--teacher-path``, ``--npd-teacher``)."""

    def __init__(self, path, task, option):
        if not path:
            raise ValueError(f"{option} PATH (an AR Transformer checkpoint trained on this data-bin) is required")
        if not os.path.exists(path):
            raise FileNotFoundError(f"{option}: teacher checkpoint {path!r} does not exist")
        try:
            models, cfg = checkpoint_utils.load_model_ensemble([path], task=task)
        except RuntimeError as err:  # state-dict size mismatch: another dictionary
            raise ValueError(
                f"{option} {path!r} does not fit this data-bin (was it trained with the same dictionaries?): {err}"
            ) from err
        model = models[0]
        if hasattr(model, "fertility_predictor") or not hasattr(model, "decoder"):
            raise ValueError(
                f"{option} {path!r} must be an autoregressive encoder-decoder (the AR teacher), "
                f"got {type(model).__name__}"
            )
        model.eval()
        for parameter in model.parameters():
            parameter.requires_grad_(False)
        self.model = use_weight_first_linears(model)  # CPU decoding: faster few-row products
        self.cfg = cfg  # the checkpoint's own configuration (the data it was trained on, ...)
        self.option = option

    def to(self, reference):
        """The teacher on ``reference``'s device and floating-point dtype (moved once, then reused)."""
        parameter = next(self.model.parameters())
        if parameter.device != reference.device or parameter.dtype != reference.dtype:
            self.model.to(device=reference.device, dtype=reference.dtype)
        return self.model

    @torch.no_grad()
    def score(self, src_tokens, src_lengths, tokens, lengths, order=None):
        """Teacher-forced log-probabilities, one parallel pass (Gu et al. §4.2 L_RKL, which needs the teacher's full
        distributions; NPD's rescoring needs only :meth:`token_scores`).

        ``tokens`` (N x T, right-padded with the dictionary's pad, no EOS) of lengths ``lengths`` (N); row n of
        ``tokens`` translates sentence ``order[n]`` of ``src_tokens`` (B x S; ``order`` None: N = B, row n = sentence
        n). The encoder runs once per sentence, the decoder once over all N rows. Returns ``lprobs`` (N x (T+1) x V,
        the teacher's distributions for positions 0..T, the one at ``lengths`` being that of EOS) and ``target``
        (N x (T+1): tokens then EOS, padded)."""
        net_output, target = self.teacher_forced(src_tokens, src_lengths, tokens, lengths, order)
        return self.model.get_normalized_probs(net_output, log_probs=True), target

    @torch.no_grad()
    def token_scores(self, src_tokens, src_lengths, tokens, lengths, order=None):
        """The teacher's log-probability of every target token, one parallel pass (Gu et al. §4.1, NPD's eq. 8):
        arguments as :meth:`score`; returns N x (T+1) fp32 values, those of ``tokens`` then EOS, 0 on padding.
        Each is the target's logit minus the log-sum-exp over the vocabulary reduced in fp32
        (:func:`.log_probs.token_log_probs`): no N x (T+1) x V log-softmax, nor an fp32 copy of the logits."""
        if getattr(self.model.decoder, "adaptive_softmax", None) is not None:  # its output is no logits
            raise ValueError(f"{self.option}: a teacher with --adaptive-softmax-cutoff cannot rescore candidates")
        net_output, target = self.teacher_forced(src_tokens, src_lengths, tokens, lengths, order)
        pad = self.model.decoder.dictionary.pad()
        return token_log_probs(net_output[0], target).masked_fill_(target.eq(pad), 0.0)

    def teacher_forced(self, src_tokens, src_lengths, tokens, lengths, order):
        """The teacher's decoder output (logits N x (T+1) x V, extra) on ``tokens`` then EOS, and that target."""
        model = self.model
        dictionary = model.decoder.dictionary
        pad, eos = dictionary.pad(), dictionary.eos()
        encoder_out = model.encoder(src_tokens, src_lengths=src_lengths)
        if order is not None:
            encoder_out = model.encoder.reorder_encoder_out(encoder_out, order)
        target = torch.cat([tokens, tokens.new_full((tokens.size(0), 1), pad)], dim=1)
        target.scatter_(1, lengths.view(-1, 1), eos)
        prev = torch.cat([tokens.new_full((tokens.size(0), 1), eos), target[:, :-1]], dim=1)
        prev = prev.masked_fill(prev.eq(eos) & (torch.arange(prev.size(1), device=prev.device) > 0), pad)
        return model.decoder(prev, encoder_out=encoder_out), target
