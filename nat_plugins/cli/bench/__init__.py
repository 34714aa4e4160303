"""The decoding benchmark behind ``nat-benchmark`` (:mod:`nat_plugins.cli.benchmark`): row specifications and
results (:mod:`.rows`), decoding and measurement (:mod:`.measure`), derived statistics (:mod:`.analysis`) and the
report (:mod:`.report`, with the papers' reference points of :mod:`.paper_points`)."""
