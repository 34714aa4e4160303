"""Decoding a data-bin split with a checkpoint ensemble the way ``fairseq_cli/generate.py`` does.

Shared by distillation (:mod:`.distill`) and the benchmark (:mod:`.bench.measure`): load the ensemble with
fairseq's API, prepare it for inference (fp16, CUDA), build the task's generator, iterate the split in batches
with fairseq's progress bar and decode each batch with ``task.inference_step``.
"""

import ast
from dataclasses import dataclass
from typing import Iterable, Iterator

import torch
from fairseq import checkpoint_utils, utils
from fairseq.logging import progress_bar

from ..engine import attention_backends


@dataclass
class Generation:
    """A checkpoint ensemble on its device with the task's generator for ``cfg.generation``."""

    cfg: object
    task: object
    models: list
    generator: object
    use_cuda: bool

    @property
    def dataset(self):
        """The split ``cfg.dataset.gen_subset`` (loaded by :func:`load_generation`)."""
        return self.task.dataset(self.cfg.dataset.gen_subset)

    def max_positions(self):
        """The source/target lengths that the task and every model accept."""
        return utils.resolve_max_positions(self.task.max_positions(), *[m.max_positions() for m in self.models])

    def batch_iterator(self, num_workers: int = 0):
        """fairseq's epoch iterator of the split in length-sorted batches of ``cfg.dataset`` (``--max-tokens``,
        ``--batch-size``, ``--num-shards/--shard-id``), every sentence kept."""
        cfg = self.cfg
        return self.task.get_batch_iterator(
            dataset=self.dataset,
            max_tokens=cfg.dataset.max_tokens,
            max_sentences=cfg.dataset.batch_size,
            max_positions=self.max_positions(),
            ignore_invalid_inputs=False,  # a sentence the models cannot take is an error, not silently dropped
            required_batch_size_multiple=1,  # >1 makes fairseq drop a last partial batch, i.e. sentences
            seed=cfg.common.seed,
            num_shards=cfg.dataset.num_shards,
            shard_id=cfg.dataset.shard_id,
            num_workers=num_workers,
            disable_iterator_cache=True,  # each call its own (num_workers differs)
        )

    def shard_sentences(self) -> int:
        """How many sentences this shard of the split holds: fairseq deals the batches to the shards in turn."""
        dataset = self.cfg.dataset
        batches = self.batch_iterator().frozen_batches
        return sum(len(batch) for batch in batches[dataset.shard_id :: dataset.num_shards])

    def batches(self, prefix: str, num_workers: int) -> Iterator[dict]:
        """The split in :meth:`batch_iterator`'s batches, in a fixed order, on the models' device."""
        itr = self.batch_iterator(num_workers).next_epoch_itr(shuffle=False)
        for sample in progress(itr, prefix, self.cfg.common):
            if "net_input" in sample:  # fairseq yields an empty dict for an empty shard
                yield self.to_device(sample)

    def to_device(self, sample: dict) -> dict:
        """``sample`` on the models' device."""
        return utils.move_to_cuda(sample) if self.use_cuda else sample

    def decode(self, sample: dict) -> list:
        """``task.inference_step`` on one batch (``--prefix-size`` target tokens forced, as fairseq-generate), with the
        engine's attention backends whatever the task (:mod:`~nat_plugins.engine.attention`: fairseq's own rows of
        the benchmark attend with the same kernels as the plugin's)."""
        size = self.cfg.generation.prefix_size
        prefix_tokens = sample["target"][:, :size] if size > 0 else None
        with attention_backends():
            return self.task.inference_step(
                self.generator, self.models, sample, prefix_tokens=prefix_tokens, constraints=sample.get("constraints")
            )


def load_generation(cfg, task) -> Generation:
    """Load the ensemble ``cfg.common_eval.path`` and the split ``cfg.dataset.gen_subset`` for ``task`` (raises
    fairseq's ``FileNotFoundError`` when the split is not in the data-bin) and build the generator."""
    use_cuda = torch.cuda.is_available() and not cfg.common.cpu
    models, saved_cfg = checkpoint_utils.load_model_ensemble(
        utils.split_paths(cfg.common_eval.path),
        arg_overrides=ast.literal_eval(cfg.common_eval.model_overrides),
        task=task,
    )
    task.load_dataset(cfg.dataset.gen_subset, task_cfg=saved_cfg.task)
    for model in models:
        if cfg.common.fp16:
            model.half()
        if use_cuda:
            model.cuda()
        model.prepare_for_inference_(cfg)
    return Generation(cfg, task, models, task.build_generator(models, cfg.generation), use_cuda)


def progress(iterable: Iterable, prefix: str, common_cfg=None) -> Iterator:
    """``iterable`` under fairseq's progress bar (tqdm on a terminal, a log line every ``--log-interval`` items
    otherwise; ``common_cfg``: fairseq's ``common`` config for ``--log-format/--no-progress-bar``)."""
    log_format = getattr(common_cfg, "log_format", None)
    quiet = getattr(common_cfg, "no_progress_bar", False)
    interval = getattr(common_cfg, "log_interval", 100)
    bar = progress_bar.progress_bar(
        iterable,
        log_format=log_format,
        log_interval=interval,
        prefix=prefix,
        default_log_format="simple" if quiet else "tqdm",
    )
    for done, item in enumerate(bar, 1):
        yield item
        bar.log({"done": done})
