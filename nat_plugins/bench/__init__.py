"""Everything that measures: the decoding benchmark behind ``nat-benchmark`` (:mod:`.benchmark`; row specifications and
results :mod:`.rows`, decoding and timing :mod:`.measure` and :mod:`.schedule`, each engine alone :mod:`.solo`,
CTranslate2 rows :mod:`.ctranslate2_rows`, statistics :mod:`.analysis`, the report :mod:`.report` with the papers'
points :mod:`.paper_points`). The repository's experiments (the quickstart's catalogue of systems, rows and targets,
its report and the training-speed comparison) are not part of the package: nat_recipes/ beside it."""
