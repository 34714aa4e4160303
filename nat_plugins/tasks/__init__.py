"""Tasks: ``translation_nat`` (one task for every plugin model)."""

from .translation_nat import TranslationNATTask  # noqa: F401
