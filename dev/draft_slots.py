"""Per-slot accuracy of speculative drafters against the teacher's greedy outputs: where a drafter's tokens per teacher
call are lost.

    python dev/draft_slots.py WORK CKPT [CKPT ...] [--sentences 1000]

WORK: a finished quickstart run (its ``data-bin`` holds ``train.kd_greedy.*``, the teacher's greedy outputs of the
training set, what exact verification accepts). For each ``spec_drafter`` checkpoint, the drafts after every prefix
of every ``--sentences``-th sentence (spread evenly over the training set; one pass of the training criterion's
every-cut forward, a ``--read-teacher-states`` drafter reading the teacher's states as in training) are compared with
the targets: slot i's accuracy (the draft of y_{c+i} right, whatever the slots before it), the share of cuts whose
first i slots are all right (what a teacher call accepts: it keeps drafts up to the first wrong one), and their sum,
the accepted drafts per cut (1 + that estimates tokens per teacher call on training sentences; the test set's is
lower). Prints a markdown table.
"""

import argparse
import os

import torch
from fairseq import checkpoint_utils

from nat_plugins.systems.spec_drafter.loss import SpecDrafterLoss, every_cut_targets


def slot_counts(path: str, work: str, sentences: int, batch_size: int = 50) -> dict:
    """Per-slot right drafts and leading-right runs of the drafter at ``path`` on ``sentences`` training sentences."""
    models, _, task = checkpoint_utils.load_model_ensemble_and_task(
        [path], arg_overrides={"data": os.path.join(work, "data-bin")}
    )
    model = models[0].eval()
    task.cfg.use_distilled, task.cfg.distilled_name = "target", "kd_greedy"
    task.load_dataset("train")
    dataset = task.dataset("train")
    criterion = SpecDrafterLoss(task, label_smoothing=0.0, sentence_avg=False)
    k, pad = model.draft_size, task.target_dictionary.pad()
    right, leading, scored = torch.zeros(k), torch.zeros(k), torch.zeros(k)
    indices = torch.linspace(0, len(dataset) - 1, sentences).long().tolist()
    with torch.no_grad():
        for start in range(0, len(indices), batch_size):
            sample = dataset.collater([dataset[i] for i in indices[start : start + batch_size]])
            target = every_cut_targets(sample["target"], k, pad)
            states = criterion.teacher_states(model, sample) if model.decoder.reads_teacher_states else None
            logits, _ = model(**sample["net_input"], teacher_states=states)
            mask = target.ne(pad).view(target.size(0), -1, k)
            hit = logits.argmax(-1).eq(target).view_as(mask) & mask
            right += hit.sum((0, 1)).float()
            scored += mask.sum((0, 1)).float()
            leading += hit.long().cumprod(dim=2).sum((0, 1)).float()
    return {"right": right / scored, "leading": leading / scored[0], "k": k}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("work", help="a finished quickstart run")
    parser.add_argument("checkpoints", nargs="+", help="spec_drafter checkpoints")
    parser.add_argument("--sentences", type=int, default=1000, help="training sentences, spread evenly")
    args = parser.parse_args()
    work, checkpoints = os.path.abspath(args.work), [os.path.abspath(path) for path in args.checkpoints]
    os.chdir(work)  # the quickstart's checkpoints name their teacher relative to WORK
    print(f"`python dev/draft_slots.py {args.work} {' '.join(args.checkpoints)} --sentences {args.sentences}`\n")
    print("| drafter | accuracy of slot 1, 2, ... | first i slots right, i = 1, 2, ... | accepted drafts / cut |")
    print("|---|---|---|---:|")
    for path in checkpoints:
        counts = slot_counts(path, work, args.sentences)
        right = ", ".join(f"{100 * float(x):.1f}%" for x in counts["right"])
        leading = ", ".join(f"{100 * float(x):.1f}%" for x in counts["leading"])
        print(f"| {os.path.relpath(path, work)} | {right} | {leading} | {float(counts['leading'].sum()):.3f} |")


if __name__ == "__main__":
    main()
