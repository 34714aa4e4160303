"""Results as they are made: ``progress.json`` in the benchmark's output directory, rewritten after every timing round,
so a run cut off (a machine lent for minutes, a killed job) still leaves every row it decoded.

It holds, per batch size, the rounds done and each row's seconds and sentences per round with its paired ratios to
fairseq's greedy teacher so far (:mod:`.schedule`); once the batched pass of ``--batch-size`` has decoded the whole
split, every row's BLEU, with its hypotheses in ``hyp.<slug>.txt`` (the files the final report writes too).

After every row's block of a pass (the cold pass, each round) a ``benchmark progress:`` line goes to the log: the pass,
the row, how much of the pass is done and the time it has left at its pace so far (run_scripts/step.sh shows the
latest one on the terminal)."""

import json
import logging
import os
import time
from typing import Dict, List, Optional

from .analysis import corpus_bleu

logger = logging.getLogger("nat_plugins.bench.benchmark")
PREFIX = "benchmark progress:"  # the lines run_scripts/quickstart.sh looks for


def progress_line(what: str, done: int, total: int, seconds: float) -> str:
    """``benchmark progress: WHAT (D of T of the pass done, ~S s left in it)``: the time left at the pace so far."""
    left = f"~{seconds / done * (total - done):.0f} s left in it" if done else "its pace not known yet"
    return f"{PREFIX} {what} ({done} of {total} of the pass done, {left})"


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

    def row_done(self, size: int, phase: str, row: int, done: int, total: int, seconds: float):
        """The :data:`.schedule.RowDone` line of row ``row`` (an index into ``specs``) at batch size ``size``."""
        what = f"batch {size}, {phase}: {self.specs[row].name}"
        logger.info(progress_line(what, done, total, seconds))

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
