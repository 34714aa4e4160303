"""Everything that measures: the decoding benchmark behind ``nat-benchmark`` (:mod:`.benchmark`; row specifications and
results :mod:`.rows`, decoding and timing :mod:`.measure` and :mod:`.schedule`, each engine alone :mod:`.solo`,
CTranslate2 rows :mod:`.ctranslate2_rows`, statistics :mod:`.analysis`, the report :mod:`.report` with the papers'
points :mod:`.paper_points`), the training-speed comparison (:mod:`.train_speed`), the catalogue of the quickstart's
systems, rows and targets (:mod:`.recipes`) and the quickstart's report (:mod:`.run_report`)."""
