"""Results as they are made: ``progress.json`` in the benchmark's output directory, rewritten after every timing round,
so a run cut off (a machine lent for minutes, a killed job) still leaves every row it decoded.

It holds, per batch size, the rounds done and each row's seconds and sentences per round with its paired ratios to
fairseq's greedy teacher so far (:mod:`.schedule`); once the batched pass of ``--batch-size`` has decoded the whole
split, every row's BLEU, with its hypotheses in ``hyp.<slug>.txt`` (the files the final report writes too)."""

import json
import os
import time
from typing import Dict, List, Optional

from .analysis import corpus_bleu


class Progress:
    """The ``progress`` callback of :func:`.schedule.time_batch_sizes` for rows ``specs`` (their order in the
    schedule's ``runners``), writing ``OUT_DIR/progress.json``."""

    FILE = "progress.json"

    def __init__(self, out_dir: str, specs, references: List[str], batch_size: int, budget: Optional[float]):
        self.out_dir, self.specs, self.references, self.batch_size = out_dir, specs, references, batch_size
        self.started = time.perf_counter()
        self.state: Dict = {"time_budget_s": budget, "elapsed_s": 0.0, "finished": False, "bleu": {}, "passes": {}}

    def __call__(self, size: int, timed, rows: List[int], outputs: List[dict]):
        """After a round of batch size ``size``: ``timed`` (:class:`.schedule.Rounds` so far) of the rows ``rows``
        (indices into ``specs``), whose outputs by sentence so far are ``outputs``."""
        self.state["passes"][str(size)] = {
            "rounds_done": len(timed.blocks),
            "sentences_per_round": timed.sentences(),
            "rows": {
                self.specs[k].name: {"seconds_per_round": timed.totals(i), "ratio_vs_ar_greedy": timed.ratios(i)}
                for i, k in enumerate(rows)
            },
        }
        if size == self.batch_size:
            for k, by_sentence in zip(rows, outputs):
                if len(by_sentence) == len(self.references) and self.specs[k].name not in self.state["bleu"]:
                    self.add_bleu(self.specs[k], [by_sentence[i].text for i in range(len(self.references))])
        self.write()

    def add_bleu(self, spec, hyps: List[str]):
        """A row's BLEU, its hypotheses written to ``hyp.<slug>.txt``."""
        self.state["bleu"][spec.name] = corpus_bleu(hyps, self.references)[0]
        with open(os.path.join(self.out_dir, f"hyp.{spec.slug}.txt"), "w", encoding="utf-8") as f:
            f.writelines(h + "\n" for h in hyps)

    def write(self, finished: bool = False):
        self.state["elapsed_s"] = round(time.perf_counter() - self.started, 1)
        self.state["finished"] = finished
        path = os.path.join(self.out_dir, self.FILE)
        with open(path + ".tmp", "w", encoding="utf-8") as f:
            json.dump(self.state, f, indent=1, ensure_ascii=False)
        os.replace(path + ".tmp", path)  # a reader never sees half a file
