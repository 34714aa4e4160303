"""Python API: any nat_plugins checkpoint behind fairseq's hub interface.

>>> from nat_plugins.hub import from_pretrained
>>> model = from_pretrained("checkpoints/sat", data_name_or_path="data/multi30k/data-bin")
>>> model.translate(["ein Hund läuft ."], beam=1)

:func:`from_pretrained` is fairseq's ``hub_utils.from_pretrained`` with the plugin loaded (``user_dir``), the task
``translation_nat`` and the subword model that ``nat_plugins.cli.prepare_data`` wrote found and applied. It returns a
:class:`NATHubInterface` (fairseq's ``GeneratorHubInterface``) whose ``translate``/``sample``/``generate`` also take
the plugin decoders' task options per call (``fertility_decoding="npd"``, ``npd_teacher=PATH``,
``block_accept="topk:2"``, ...): the options every generator declares beside it (its ``DecodingConfig``), whose table
:data:`~nat_plugins.tasks.translation_nat.DECODING_OPTIONS` the task derives from the declarations. They are set on
``task.cfg`` for that call only, and the generator parses and checks them as it does the command line's.
"""

import os
from typing import Any, Dict, List, Optional, Union

import torch
from fairseq import hub_utils

from .tasks.translation_nat import DECODING_OPTIONS

USER_DIR = os.path.dirname(os.path.abspath(__file__))

# subword models written by nat_plugins.cli.prepare_data, and the fairseq bpe options that apply them
SUBWORD_FILES = (("spm.model", "sentencepiece", "sentencepiece_model"), ("bpe.codes", "subword_nmt", "bpe_codes"))


def find_subword_model(*directories: str) -> Dict[str, str]:
    """``{"bpe": ..., <model option>: path}`` for the first subword model in ``directories``; {} when none."""
    for directory in directories:
        for file_name, bpe, option in SUBWORD_FILES:
            path = os.path.join(directory, file_name)
            if os.path.exists(path):
                return {"bpe": bpe, option: path}
    return {}


class NATHubInterface(hub_utils.GeneratorHubInterface):
    """fairseq's hub interface; decoding options of ``task.cfg`` are per call and the default beam is the
    decoder's own (1 for the plugin decoders, which are greedy unless they say otherwise)."""

    def translate(
        self, sentences: Union[str, List[str]], beam: Optional[int] = None, verbose: bool = False, **kwargs: Any
    ) -> Union[str, List[str]]:
        return super().translate(sentences, beam, verbose, **kwargs)

    def sample(
        self, sentences: Union[str, List[str]], beam: Optional[int] = None, verbose: bool = False, **kwargs: Any
    ) -> Union[str, List[str]]:
        return super().sample(sentences, beam, verbose, **kwargs)

    def generate(
        self,
        tokenized_sentences: List[torch.LongTensor],
        beam: Optional[int] = None,
        verbose: bool = False,
        **kwargs: Any,
    ) -> List[List[dict]]:
        """fairseq's ``generate``; ``kwargs`` named in the task's table of decoding options
        (:data:`~nat_plugins.tasks.translation_nat.DECODING_OPTIONS`, derived from the generators' declarations) go to
        ``task.cfg`` during the call, and the task refuses those the model's decoder does not read."""
        if beam is None:
            beam = getattr(getattr(self.models[0], "generator_class", None), "default_beam", 5)
        task_options = {name: kwargs.pop(name) for name in list(kwargs) if name in DECODING_OPTIONS}
        saved = {name: getattr(self.task.cfg, name) for name in task_options}
        try:
            for name, value in task_options.items():
                setattr(self.task.cfg, name, value)
            return super().generate(tokenized_sentences, beam, verbose, **kwargs)
        finally:
            for name, value in saved.items():
                setattr(self.task.cfg, name, value)


def from_pretrained(
    model_dir: str,
    checkpoint_file: str = "checkpoint_best.pt",
    data_name_or_path: str = ".",
    bpe: Optional[str] = "auto",
    **kwargs: Any,
) -> NATHubInterface:
    """Load a plugin checkpoint ``model_dir/checkpoint_file`` with the dictionaries of ``data_name_or_path``
    (relative to ``model_dir`` when it starts with "."). ``bpe="auto"`` applies the ``spm.model`` (sentencepiece)
    or ``bpe.codes`` (subword-nmt) found in ``model_dir``, the data directory or its parent (where prepare_data
    writes them), else none; ``bpe=None`` applies none; any other value is fairseq's ``--bpe`` with the model
    options in ``kwargs``. Other ``kwargs`` override the checkpoint's options, as in fairseq."""
    data = os.path.join(model_dir, data_name_or_path) if data_name_or_path.startswith(".") else data_name_or_path
    if bpe == "auto":
        kwargs = {**find_subword_model(model_dir, data, os.path.dirname(os.path.abspath(data))), **kwargs}
    elif bpe is not None:
        kwargs["bpe"] = bpe
    loaded = hub_utils.from_pretrained(
        model_dir, checkpoint_file, data_name_or_path, user_dir=USER_DIR, task="translation_nat", **kwargs
    )
    return NATHubInterface(loaded["args"], loaded["task"], loaded["models"])
