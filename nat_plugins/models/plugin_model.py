"""What every nat_plugins model shares: the task check and the hooks ``translation_nat`` calls."""

from ..tasks.translation_nat import TranslationNATTask


class NATPluginModel:
    """Mixin for plugin models (put it first in the bases: ``class M(NATPluginModel, TransformerModel)``).

    * ``build_model`` refuses any task but ``translation_nat``: fairseq picks the generator from the
      command-line task, so ``fairseq-generate --task translation`` would otherwise decode a plugin model
      with the autoregressive ``SequenceGenerator`` and print wrong translations without a word.
    * ``make_generator(task, models, gen_args)`` returns the model's decoder (called by
      ``TranslationNATTask.build_generator``, hence by fairseq-generate/-interactive and ``--eval-bleu``).
    * ``required_side_inputs`` names the side files training needs ("fertility", "kd_target").
    """

    required_side_inputs = ()

    @classmethod
    def build_model(cls, args, task):
        if not isinstance(task, TranslationNATTask):
            task_name = getattr(getattr(task, "cfg", None), "_name", type(task).__name__)
            raise ValueError(
                f"{cls.__name__} is a nat_plugins model: run fairseq with `--user-dir nat_plugins --task "
                f"translation_nat` (got task '{task_name}'); other tasks would decode it with the wrong generator"
            )
        return super().build_model(args, task)

    def make_generator(self, task, models, gen_args):
        raise NotImplementedError(f"{type(self).__name__} must return its generator from make_generator()")
