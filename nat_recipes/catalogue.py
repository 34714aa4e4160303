"""The catalogue of the systems the Multi30k quickstart trains, decodes and checks: one block per system.

For every preset (``cpu``, ``cpu-long``, ``gpu``: run_scripts/common.sh) a system's block says which configurations
of the system the run trains (the recipe scripts of examples/multi30k and their arguments, step by step), the
training budget of each of its recipes (updates, learning rate and warm-up per preset, which the scripts ask for with
``student_args``), the benchmark rows each configuration decodes (display name, checkpoint, fairseq-generate
arguments), the quality targets the report (:mod:`.run_report`) checks on those rows and the numbers the README states
for them. A target or paired test that names a row its preset does not make is an error (:func:`check`), and so
is a target whose row a finished benchmark lacks (:class:`MissingRow`). The scripts read the catalogue through its
command line (run from the repository root, or with it on PYTHONPATH as run_scripts/common.sh sets it), one item per
line:

    python -m nat_recipes.catalogue steps --preset P --work W --data-bin D --teacher T --checkpoint-name N
        one training step per line, tab-separated: JOB, STEP, SCRIPT (relative to the repository), its arguments
        (run_scripts/quickstart.sh runs the steps of a job in order, jobs side by side)
    python -m nat_recipes.catalogue speed-steps ... --save-dir DIR
        the fairseq-train steps, each with the recipe its speed is compared with (run_scripts/train_speed.sh)
    python -m nat_recipes.catalogue options --preset P [--latency-sentences N]
        the preset's benchmark options, one word per line
    python -m nat_recipes.catalogue rows --preset P --work W ... [--only SYSTEM] [--values K,...] [--existing]
        the benchmark options of the rows (--system, --paired-test), one word per line
    python -m nat_recipes.catalogue budget --preset P [--updates N] RECIPE
        a student recipe's UPDATES LR WARMUP on the preset (run_scripts/common.sh's student_args)

A new system is one block below (its configure function and its :class:`System`: configurations per preset,
budgets, targets, README claims), added to :data:`SYSTEMS`; a system's key, with '-' for '_', is its
architecture's prefix and its recipe script's name. A new preset is one :class:`Preset` in :data:`PRESETS` and its
configurations and targets in the systems' blocks.
"""

import argparse
import os
import statistics
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

from nat_plugins.bench.rows import (
    TEACHER_BEAM,
    TEACHER_GREEDY,
    RowSpec,
    ctranslate2_specs,
    npd_args,
    npd_name,
    plugin_int8_spec,
    plugin_layout_spec,
    teacher_specs,
)

EXAMPLES = "examples/multi30k"
# train_speed's reference: the teacher's recipe trained on the distilled targets, the batches of most students
TEACHER_ON_DISTILLED = "teacher-on-distilled"
LENGTH_LIMIT = ("--generate-args", "--max-len-a 1.2 --max-len-b 10")
# the rows every benchmark of the presets makes besides the catalogue's: the teacher by fairseq (beam 4, greedy), by the
# plugin's greedy loop and, on the CPU presets, its int8 decoder and CTranslate2 (float32 and int8)
REFERENCE_SPECS = (
    teacher_specs("", 4)
    + [plugin_layout_spec(""), plugin_int8_spec("")]
    + ctranslate2_specs("", 4, ["float32", "int8"])
)
REFERENCE_ROWS = tuple(spec.name for spec in REFERENCE_SPECS)
TEACHER_BEAM_ROW, TEACHER_GREEDY_ROW, TEACHER_GREEDY_PLUGIN_ROW, TEACHER_INT8_DECODER_ROW = REFERENCE_ROWS[:4]
CT2_GREEDY_ROW, CT2_INT8_GREEDY_ROW = REFERENCE_ROWS[-3], REFERENCE_ROWS[-1]  # CTranslate2 greedy, float32 and int8
# the rows' "made" notes that several systems share
INIT_ALL = (
    "--init-from-ar-scope all: every teacher parameter that fits, decoder layers included (the paper: encoder, "
    "embeddings and output projection)"
)


@dataclass(frozen=True)
class Preset:
    """What a preset changes in the benchmark: the options of its protocol on its device, the default number of
    batch-1 latency sentences (None: the whole test set), the decoding options of the rows whose layers only draft
    (``Row.drafts``) and, for a preset with a ``--time-budget``, the rows decoded only if it leaves time for them
    (``--optional-row``, highest priority first)."""

    device_options: Tuple[str, ...]
    latency_sentences: Optional[int]
    draft_args: Tuple[str, ...]
    optional_rows: Tuple[str, ...] = ()

    def benchmark_options(self, latency_sentences: Optional[int] = None) -> List[str]:
        """The benchmark's options of this preset; ``latency_sentences`` replaces its default."""
        sentences = latency_sentences or self.latency_sentences
        latency = ["--latency-sentences", str(sentences)] if sentences else []
        return list(self.device_options) + latency + list(LENGTH_LIMIT)


@dataclass(frozen=True)
class Budget:
    """A student recipe's training budget (``student_args RECIPE`` in run_scripts/common.sh): on the cpu preset
    ``updates`` updates of 4,096 tokens with ``warmup`` of them warm-up, the learning rate ``lr`` decaying linearly to
    0 (cpu-long: :data:`CPU_LONG_FACTOR` times the updates and the warm-up); on the GPU :data:`GPU_STUDENT_UPDATES`
    updates of 8,192 tokens (``gpu_updates`` where set), a tenth of them warm-up, at ``gpu_lr`` (None: ``lr``). A
    student starts from the
    teacher's weights: a fresh Adam at a high rate would move every weight at once, so recipes that train the whole
    model stay at <= 5e-4 on the GPU."""

    updates: int
    lr: str
    warmup: int
    gpu_lr: Optional[str] = None
    gpu_updates: Optional[int] = None

    def for_preset(self, preset: str, updates: Optional[int] = None) -> Tuple[int, str, int]:
        """(updates, learning rate, warm-up updates) on ``preset``; ``updates`` (STUDENT_UPDATES) replaces the
        preset's number of updates (on the GPU, the warm-up follows it)."""
        if preset == "gpu":
            total = updates or self.gpu_updates or GPU_STUDENT_UPDATES
            return total, self.gpu_lr or self.lr, (total + 9) // 10
        factor = CPU_LONG_FACTOR if preset == "cpu-long" else 1
        return updates or self.updates * factor, self.lr, self.warmup * factor


CPU_LONG_FACTOR = 4  # cpu-long trains every student this many times the cpu preset's updates (and warm-up)
GPU_STUDENT_UPDATES = 600  # the GPU preset's ~13-minute plan (examples/multi30k/README.md)


# every preset decodes with one length limit for every row (Multi30k targets are ~1.1x the source), so an undertrained
# model that never emits EOS stops there instead of at fairseq's default 200 tokens.
# CPU presets: 100 sentences timed after 10 of warm-up (machine noise is ±15% between runs; ~1 min per 100), the
# teacher decoded by CTranslate2 too (the production baseline a fast decoder has to beat), and the layers that only
# draft (blockwise heads 2..k, the speculative drafter) in int8: the output is the same, each call reads fewer bytes.
# GPU (fp16): 210 sentences at batch 1 (the first 10 warm-up), batch 64; no CTranslate2 (its newest wheel,
# 4.8.5, is built against CUDA 12's cuBLAS, which the GPU machines here, CUDA 13, lack). The GPU machine is lent for
# 15 minutes: the benchmark gets 3 of them (--time-budget), planned from every row's warm-up: the teacher rows and the
# headline rows first, then the GPU_OPTIONAL_ROWS while time is left (eager decoding at batch 1 is kernel launches and
# Python: ~100 ms a sentence, 17 rows x 200 sentences did not end in 6 minutes).
# The quickstart times batch 1 and 64 (its --batch-size); cpu-long adds 8 and 32 for the speed-against-batch-size
# table and plot (the two middle sizes are a third of the quickstart's benchmark time).
# --solo: every greedy engine also timed alone in its own process, at its best OpenMP setting (bench/solo.py)
CPU_DEVICE_OPTIONS = (
    "--cpu",
    "--warmup",
    "10",
    "--batch-size",
    "64",
    "--ctranslate2",
    "--int8-decoder-row",
    "--solo",
)
GPU_DEVICE_OPTIONS = ("--fp16", "--warmup", "10", "--batch-size", "64", "--time-budget", "180")
GPU_OPTIONAL_ROWS = (  # the most time for the least news on a GPU, the newsiest first
    "Blockwise k=4 fine-tuned, exact",
    "SAT K=2, beam 4",
    "Speculative k=8, relaxed",
    "NAT, average fertility",
    "Speculative k=8, greedy steps only",
    "NAT, NPD S=10",
    "NAT+FT, argmax fertility",
    "NAT+FT, NPD S=10",
)
PRESETS = {
    "cpu": Preset(CPU_DEVICE_OPTIONS + ("--batch-sizes", "1,64"), 110, ("--int8-drafts",)),
    "cpu-long": Preset(CPU_DEVICE_OPTIONS + ("--batch-sizes", "1,8,32,64"), 110, ("--int8-drafts",)),
    "gpu": Preset(GPU_DEVICE_OPTIONS, 210, (), GPU_OPTIONAL_ROWS),
}


@dataclass(frozen=True)
class RunPath:
    """A path of the run that a step's or a row's argument stands for (:meth:`Run.resolve`)."""

    name: str


DATA_BIN, TEACHER, SAVE_DIR, LINKS = RunPath("data-bin"), RunPath("teacher"), RunPath("save-dir"), RunPath("links")


@dataclass(frozen=True)
class Checkpoint:
    """The checkpoint that step ``step`` leaves for decoding (WORK/ckpt/STEP/<the run's checkpoint name>)."""

    step: str


Word = Union[str, int, RunPath, Checkpoint]


@dataclass(frozen=True)
class Run:
    """A quickstart run's paths: its work directory, data-bin and teacher checkpoint, the file a student's training
    leaves for decoding (run_scripts/common.sh's STUDENT_CHECKPOINT) and, for train_speed, one scratch directory
    every step saves into instead of its own WORK/ckpt/STEP."""

    work: str
    data_bin: str
    teacher: str
    checkpoint_name: str
    save_dir: Optional[str] = None

    def checkpoint(self, step: str, name: Optional[str] = None) -> str:
        """WORK/ckpt/STEP/NAME (None: the run's checkpoint name)."""
        return os.path.join(self.work, "ckpt", step, name or self.checkpoint_name)

    def resolve(self, word: Word, step: str = "") -> str:
        """The text of a step's (``step``) or a row's argument."""
        if isinstance(word, Checkpoint):
            return self.checkpoint(word.step)
        paths = {
            DATA_BIN: self.data_bin,
            TEACHER: self.teacher,
            SAVE_DIR: self.save_dir or os.path.join(self.work, "ckpt", step),
            LINKS: os.path.join(self.work, "links"),  # eflomal is not deterministic: its links are kept
        }
        return paths[word] if isinstance(word, RunPath) else str(word)


@dataclass(frozen=True)
class Step:
    """One step of a run: ``name`` (its .done marker and log; it saves into WORK/ckpt/NAME) runs the bash script
    ``script`` (relative to the repository) with ``args``. ``compared_with``: the recipe whose updates/s train_speed
    divides this one's by, trained on the same batches (None: not a fairseq-train recipe, not timed)."""

    name: str
    script: str
    args: Tuple[Word, ...]
    compared_with: Optional[str] = TEACHER_ON_DISTILLED

    def command(self, run: Run) -> List[str]:
        return [self.script] + [run.resolve(word, self.name) for word in self.args]


@dataclass(frozen=True)
class Row:
    """A benchmark row: ``name`` decodes the checkpoint of step ``step`` with the fairseq-generate arguments
    ``args`` (and the preset's draft options when ``drafts``). ``plugin``: a plugin system's row (False: a
    baseline: fairseq's own models, the teacher trained on). ``made``: how the row's model was initialised and
    decoded where that departs from, or chooses within, its paper (the report's "How each row was made").
    ``teacher_greedy``: the row prints the teacher's greedy output (its verifier is the teacher itself), which the
    benchmark checks and a run on your own teacher promises (:func:`own_teacher_targets`); a row exact to a fine-tuned
    verifier is not. ``checkpoint``: the file of the step's it decodes (None: the run's checkpoint name; a model trained
    with the teacher's recipe decodes the checkpoint that recipe selects, as the teacher's rows do)."""

    name: str
    step: str
    args: Tuple[Word, ...]
    drafts: bool = False
    plugin: bool = True
    made: str = ""
    teacher_greedy: bool = False
    checkpoint: Optional[str] = None

    def checkpoint_path(self, run: Run) -> str:
        return run.checkpoint(self.step, self.checkpoint)

    def spec(self, run: Run, preset: Preset) -> RowSpec:
        args = [run.resolve(word) for word in self.args] + list(preset.draft_args if self.drafts else ())
        return RowSpec(self.name, self.checkpoint_path(run), args)


@dataclass(frozen=True)
class Job:
    """Steps that run one after the other (each may need the one before); jobs run side by side. A job is named by
    its first step."""

    steps: Tuple[Step, ...]

    @property
    def name(self) -> str:
        return self.steps[0].name


def student_step(name: str, script: str, *extra: Word, **options) -> Step:
    """Step ``name``: ``examples/multi30k/SCRIPT DATA_BIN TEACHER SAVE_DIR EXTRA...``, the students' recipes' calling
    convention (``options``: the :class:`Step`'s others)."""
    return Step(name, f"{EXAMPLES}/{script}", (DATA_BIN, TEACHER, SAVE_DIR, *extra), **options)


def job(*steps: Step) -> Job:
    """A job of ``steps``, in order."""
    return Job(steps)


@dataclass(frozen=True)
class Config:
    """One configuration of a system: the jobs that train it (a job that two configurations share trains once), its
    benchmark rows and the paired bootstrap tests (baseline row, system row) of their BLEU."""

    jobs: Tuple[Job, ...]
    rows: Tuple[Row, ...]
    paired_tests: Tuple[Tuple[str, str], ...] = ()


class CatalogueError(ValueError):
    """The catalogue contradicts itself (a target or paired test names a row its preset does not make, ...)."""


class MissingRow(KeyError):
    """A target names a row the finished benchmark does not have."""

    def __str__(self):
        return str(self.args[0])


@dataclass
class Measured:
    """A finished benchmark as the targets read it: its ``results.json`` rows by name, its paired tests and the
    names of its preset's plugin rows."""

    rows: Dict[str, dict]
    paired_tests: List[dict]
    plugin_rows: Tuple[str, ...]

    def row(self, name: str) -> dict:
        if name not in self.rows:
            raise MissingRow(
                f"a target names the row {name!r}, which the benchmark did not make (rows: {list(self.rows)})"
            )
        return self.rows[name]

    def role(self, role: str) -> dict:
        """The reference row with ``role`` (the teacher's beam or greedy row)."""
        found = [row for row in self.rows.values() if row.get("role") == role]
        if not found:
            raise MissingRow(f"the targets need the benchmark's {role} row, which it did not make")
        return found[0]

    def same_output(self, row: dict, greedy: dict) -> bool:
        """Whether ``row`` prints the teacher's greedy output (``greedy``: the greedy teacher row, which does): the
        benchmark checked it against that row token for token in every timed pass, batch 1 and every batch size
        (its ``exact_check``), and every sentence that differs is a floating-point near-tie (at the first differing
        token the teacher's log-probabilities of the two tokens differ by less than the run's tolerance). A row the
        benchmark did not check does not."""
        if row["name"] == greedy["name"]:
            return True
        passes = row.get("exact_check")
        return bool(passes) and all(check["differ"] == check["near_ties"] for check in passes.values())

    def exactness(self, row: dict, greedy: dict) -> Tuple[bool, str]:
        """:meth:`same_output` and its words for a target's line: a row without an exact check fails as one (the
        benchmark checks only a row whose verifier has the teacher's weights), not as "differs from greedy"."""
        if row["name"] != greedy["name"] and not row.get("exact_check"):
            return False, NO_EXACT_CHECK
        same = self.same_output(row, greedy)
        return same, "identical to greedy" if same else "differs from greedy"


NO_EXACT_CHECK = "no exactness check (the row's verifier is not the teacher's weights)"


@dataclass(frozen=True)
class RowTarget:
    """A target on one row, ``row``."""

    row: str

    @property
    def rows(self) -> Tuple[str, ...]:
        return (self.row,)


@dataclass(frozen=True)
class BleuShare(RowTarget):
    """BLEU >= ``minimum`` of the teacher's beam BLEU (and batch-1 latency >= ``min_speedup`` x the teacher's
    ``over``: "beam" or "greedy" search)."""

    minimum: float
    min_speedup: float = 0.0
    over: str = "beam"

    @property
    def what(self) -> str:
        at = f" at >= {self.min_speedup}x vs the teacher's {self.over}" if self.min_speedup else ""
        return f"{self.row}: BLEU >= {100 * self.minimum:.0f}% of the teacher's beam{at}"

    def check(self, measured: Measured) -> Tuple[str, bool]:
        row, beam = measured.row(self.row), measured.role(TEACHER_BEAM)["bleu"]
        share = row["bleu"] / beam if beam > 0 else 0.0  # a teacher at 0 BLEU (a smoke run) is no bar to clear
        speedup = row.get(f"latency_speedup_vs_ar_{self.over}") or 0.0
        return (
            f"{100 * share:.1f}% at {speedup:.2f}x vs {self.over}",
            share >= self.minimum and speedup >= self.min_speedup,
        )


@dataclass(frozen=True)
class ExactBlockwise(RowTarget):
    """Exact acceptance: the teacher's greedy output (or, with ``max_bleu_loss``, its BLEU minus that), a mean
    accepted block >= ``min_block`` and a batch-1 speedup over greedy >= ``min_speedup``."""

    min_block: float
    max_bleu_loss: Optional[float] = None
    min_speedup: float = 0.0

    @property
    def what(self) -> str:
        quality = (
            "= the teacher's greedy output" if self.max_bleu_loss is None else f"BLEU >= greedy - {self.max_bleu_loss}"
        )
        at = f", >= {self.min_speedup}x vs greedy" if self.min_speedup else ""
        return f"{self.row}: {quality}, mean accepted block >= {self.min_block}{at}"

    def check(self, measured: Measured) -> Tuple[str, bool]:
        row, greedy = measured.row(self.row), measured.role(TEACHER_GREEDY)
        block, speedup = row.get("tokens_per_call") or 0.0, row.get("latency_speedup_vs_ar_greedy") or 0.0
        if self.max_bleu_loss is None:
            ok, quality = measured.exactness(row, greedy)
        else:
            ok = greedy["bleu"] - row["bleu"] <= self.max_bleu_loss
            quality = f"BLEU {row['bleu']:.2f} (greedy {greedy['bleu']:.2f})"
        return (
            f"{quality}, block {block:.2f}, {speedup:.2f}x vs greedy",
            ok and block >= self.min_block and speedup >= self.min_speedup,
        )


@dataclass(frozen=True)
class Speculative(RowTarget):
    """Speculative decoding: exact verification prints the teacher's greedy output, relaxed keeps at least its BLEU;
    both at a batch-1 speed-up over fairseq's greedy search >= ``min_speedup`` (each engine alone where the run timed
    it so: :func:`speedup_vs_greedy`), >= ``min_tokens_per_call`` tokens per teacher call and >= ``min_vs_ct2`` times
    CTranslate2's float32 greedy search (the same measurement; unchecked where the run has no such row). Shown besides:
    the drafter's and the teacher's ms per call."""

    min_speedup: float
    exact: bool = True
    min_tokens_per_call: float = 0.0
    min_vs_ct2: float = 0.0

    @property
    def what(self) -> str:
        quality = "= the teacher's greedy output" if self.exact else "BLEU >= the teacher's greedy"
        bars = [f">= {self.min_speedup}x vs greedy"]
        if self.min_tokens_per_call:
            bars.append(f">= {self.min_tokens_per_call} tokens per teacher call")
        if self.min_vs_ct2:
            bars.append(f">= {self.min_vs_ct2}x CTranslate2 float32 greedy")
        return f"{self.row}: {quality}, {', '.join(bars)}"

    def check(self, measured: Measured) -> Tuple[str, bool]:
        row, greedy = measured.row(self.row), measured.role(TEACHER_GREEDY)
        speedup, how = speedup_vs_greedy(row)
        speedup = speedup or 0.0
        if self.exact:
            ok, quality = measured.exactness(row, greedy)
        else:
            ok = row["bleu"] >= greedy["bleu"]
            quality = f"BLEU {row['bleu']:.2f} (greedy {greedy['bleu']:.2f})"
        tokens = row.get("tokens_per_step") or 0.0
        drafter, teacher = row.get("drafting_ms_per_call"), row.get("verify_ms_per_call")
        text = f"{quality}, {tokens:.2f} tokens per teacher call" + (
            f" (drafter {drafter:.2f} ms, teacher {teacher:.2f} ms a call)" if drafter and teacher else ""
        )
        text += f", {speedup:.2f}x vs greedy ({how})"
        ok &= speedup >= self.min_speedup and tokens >= self.min_tokens_per_call
        ct2 = speedup_vs_greedy(measured.rows[CT2_GREEDY_ROW])[0] if CT2_GREEDY_ROW in measured.rows else None
        if ct2:
            text += f", {speedup / ct2:.2f}x CTranslate2 float32 greedy"
            ok &= speedup / ct2 >= self.min_vs_ct2
        return text, ok


@dataclass(frozen=True)
class OnnxDeployment(RowTarget):
    """The NAT through ONNX Runtime (``row``) against CTranslate2's greedy search of the teacher (``ct2_row``, float32
    or int8) at batch 1, each engine alone where the run timed it so: at least ``min_vs_ct2`` times its speed, and
    either the PyTorch NAT's tokens (``pytorch_row``) up to near-ties in every timed pass (float32: the row's
    ``twin_check``) or, with ``max_bleu_loss`` (int8 weights, another precision), at most that below its BLEU."""

    pytorch_row: str
    ct2_row: str
    min_vs_ct2: float
    max_bleu_loss: Optional[float] = None

    @property
    def rows(self) -> Tuple[str, ...]:
        return (self.row, self.pytorch_row)

    @property
    def what(self) -> str:
        quality = (
            f"the tokens of {self.pytorch_row} in every timed pass"
            if self.max_bleu_loss is None
            else f"BLEU >= {self.pytorch_row}'s - {self.max_bleu_loss}"
        )
        return f"{self.row}: {quality}, batch 1 >= {self.min_vs_ct2}x {self.ct2_row}"

    def check(self, measured: Measured) -> Tuple[str, bool]:
        row, pytorch = measured.row(self.row), measured.row(self.pytorch_row)
        if self.max_bleu_loss is None:
            passes = (row.get("twin_check") or {}).get("passes") or {}
            differ = sum(check["differ"] for check in passes.values())
            real = differ - sum(check["near_ties"] for check in passes.values())
            ok = bool(passes) and real == 0
            quality = (
                "no token check (no PyTorch row to compare with)"
                if not passes
                else f"{differ} sentences differ ({real} by more than a near-tie; passes: {', '.join(passes)})"
            )
        else:
            ok = pytorch["bleu"] - row["bleu"] <= self.max_bleu_loss
            quality = f"BLEU {row['bleu']:.2f} ({self.pytorch_row} {pytorch['bleu']:.2f})"
        speedup, how = speedup_vs_greedy(row)
        ct2 = speedup_vs_greedy(measured.rows[self.ct2_row])[0] if self.ct2_row in measured.rows else None
        if not (speedup and ct2):
            return f"{quality}; no {self.ct2_row} row to compare speed with", False
        return f"{quality}, {speedup / ct2:.2f}x {self.ct2_row} ({how})", ok and speedup / ct2 >= self.min_vs_ct2


@dataclass(frozen=True)
class PrintsTeacherGreedy(RowTarget):
    """A row that decodes the teacher's greedy search another way (exact verify-accept decoding, the plugin's greedy
    loop): its output is the teacher's greedy output in every timed pass, up to floating-point near-ties (its
    ``exact_check``, the solo pass included), its BLEU the greedy row's, and batch 1 at least ``min_speedup`` x
    fairseq's greedy search, each engine alone where the run timed it so (else round-robin)."""

    min_speedup: float = 1.0

    @property
    def what(self) -> str:
        return f"{self.row}: = the teacher's greedy output in every timed pass, its BLEU, >= {self.min_speedup}x greedy"

    def check(self, measured: Measured) -> Tuple[str, bool]:
        row, greedy = measured.row(self.row), measured.role(TEACHER_GREEDY)
        same, quality = measured.exactness(row, greedy)
        bleu_equal = abs(row["bleu"] - greedy["bleu"]) < 0.005
        speedup, how = speedup_vs_greedy(row)
        speedup = speedup or 0.0
        passes = ", ".join(row.get("exact_check") or {})
        text = (
            f"{quality}{f' (passes: {passes})' if passes else ''}, BLEU {row['bleu']:.2f} "
            f"(greedy {greedy['bleu']:.2f}), {speedup:.2f}x vs greedy ({how})"
        )
        return text, same and bleu_equal and speedup >= self.min_speedup


@dataclass(frozen=True)
class BleuGain:
    """``system``'s BLEU gain over ``baseline`` >= ``minimum`` (paired bootstrap p-value shown; with ``max_p``, met
    only when the run's paired test of the two gives p <= ``max_p``), at most ``max_slowdown`` slower at batch 1 (the
    median over rounds of the paired ratio of their batch-1 times)."""

    system: str
    baseline: str
    minimum: float
    max_slowdown: Optional[float] = None
    max_p: Optional[float] = None

    @property
    def rows(self) -> Tuple[str, ...]:
        return (self.system, self.baseline)

    @property
    def what(self) -> str:
        limit = f" at <= {100 * self.max_slowdown:.0f}% slower" if self.max_slowdown is not None else ""
        significant = f", p <= {self.max_p}" if self.max_p is not None else ""
        return f"{self.system} vs {self.baseline}: >= {self.minimum:+} BLEU{significant}{limit}"

    def check(self, measured: Measured) -> Tuple[str, bool]:
        system, baseline = measured.row(self.system), measured.row(self.baseline)
        delta = system["bleu"] - baseline["bleu"]
        test = next(
            (
                t
                for t in measured.paired_tests
                if t["system"] == self.system and t.get("baseline", self.baseline) == self.baseline
            ),
            None,
        )
        # the one statistic of every speed-up: the median of the per-round paired ratios (the same blocks, one round)
        paired = [a / b for a, b in zip(system["latency_round_seconds"], baseline["latency_round_seconds"])]
        slower = statistics.median(paired) - 1
        text = f"{delta:+.2f} BLEU" + (f" (p = {test['p_value']:.3f})" if test else "") + f", {100 * slower:+.0f}% time"
        significant = self.max_p is None or (test is not None and test["p_value"] <= self.max_p)
        return text, delta >= self.minimum and significant and (
            self.max_slowdown is None or slower <= self.max_slowdown
        )


@dataclass(frozen=True)
class AboveFairseq:
    """Every plugin row above fairseq's own models (``theirs``) on BLEU or on batch-1 speed (``both``: on both, vs
    the first of them)."""

    theirs: Tuple[str, ...]
    both: bool

    @property
    def rows(self) -> Tuple[str, ...]:
        return self.theirs

    @property
    def what(self) -> str:
        return "every plugin row above fairseq's NAT/CMLM " + (
            "on BLEU and speed (vs NAT)" if self.both else "on BLEU or on speed"
        )

    def check(self, measured: Measured) -> Tuple[str, bool]:
        theirs = [measured.row(name) for name in (self.theirs[:1] if self.both else self.theirs)]
        verdicts, ok = [], True
        for name in measured.plugin_rows:
            row = measured.row(name)
            better_bleu = all(row["bleu"] > t["bleu"] for t in theirs)
            faster = all(row["latency_ms_median"] < t["latency_ms_median"] for t in theirs)
            ok &= (better_bleu and faster) if self.both else (better_bleu or faster)
            verdict = {(True, True): "BLEU and speed", (True, False): "BLEU", (False, True): "speed"}
            verdicts.append(f"{name}: {verdict.get((better_bleu, faster), 'neither')}")
        return "; ".join(verdicts), ok


# A README number holds when a fresh run measures BLEU no more than this below it (students trained for minutes move
# by ~0.5 BLEU between seeds: docs/design-notes.md, Encoder-NAD-AD over three seeds) ...
CLAIM_BLEU_TOLERANCE = 1.0
# ... and a speed-up at least this share of it (one machine's runs minutes apart differ by 10-30%)
CLAIM_SPEED_SHARE = 0.75


def speedup_vs_greedy(row: dict, batch: str = "latency") -> Tuple[Optional[float], str]:
    """A row's speed-up over fairseq's greedy teacher, ``batch`` "latency" (batch 1) or "throughput" (the batched
    pass): the one-process-per-engine measurement where the run made one (each engine alone at its best setting,
    what a user meets), else the round-robin one; and which of the two it is."""
    key = f"{batch}_speedup_vs_ar_greedy"
    solo = (row.get("solo") or {}).get(key)
    if solo is not None:
        return solo, "each engine alone"
    return row.get(key), "round-robin"


def speed_text(speedup: float) -> str:
    """A speed-up as the README writes it: two significant digits below 10 (0.71×, 5.2×), whole numbers above."""
    return f"{speedup:.2f}×" if speedup < 1 else f"{speedup:.1f}×" if speedup < 10 else f"{speedup:.0f}×"


@dataclass(frozen=True)
class Claim(RowTarget):
    """A number the README states for ``row``: its BLEU (``exact``: the teacher's greedy output instead) and its
    batch-1 speed-up over fairseq's greedy search (``batched``: the batched pass's too). Met when BLEU is at most
    :data:`CLAIM_BLEU_TOLERANCE` below the claim (exact rows: the teacher's greedy output up to near-ties) and each
    speed-up at least :data:`CLAIM_SPEED_SHARE` of its claim (:func:`speedup_vs_greedy`)."""

    bleu: float
    speedup: float
    exact: bool = False
    batched: Optional[float] = None

    @property
    def what(self) -> str:
        quality = "= the teacher's greedy output" if self.exact else f"BLEU >= {self.bleu - CLAIM_BLEU_TOLERANCE:.2f}"
        speeds = [f"batch 1 >= {CLAIM_SPEED_SHARE * self.speedup:.2f}x"]
        if self.batched is not None:
            speeds.append(f"batched >= {CLAIM_SPEED_SHARE * self.batched:.2f}x")
        return f"README: {self.row} {self.text()} ({quality}, {', '.join(speeds)} vs greedy)"

    def text(self) -> str:
        """The claim as the README's systems table writes it: ``BLEU / speed-up×`` (``(batch 64: x×)``)."""
        batched = f" (batch 64: {speed_text(self.batched)})" if self.batched is not None else ""
        return f"{self.bleu:.2f} / {speed_text(self.speedup)}{batched}"

    def check(self, measured: Measured, speed: bool = True) -> Tuple[str, bool]:
        """The claim against the run; ``speed`` False: its BLEU (or exactness) only (a run on another CPU kind than
        the claims': :data:`CLAIMS_CPU_KIND`)."""
        row = measured.row(self.row)
        if self.exact:
            ok, quality = measured.exactness(row, measured.role(TEACHER_GREEDY))
            quality = f"BLEU {row['bleu']:.2f}, " + ("the teacher's greedy output" if ok else quality)
        else:
            ok = row["bleu"] >= self.bleu - CLAIM_BLEU_TOLERANCE
            quality = f"BLEU {row['bleu']:.2f}"
        if not speed:
            return quality, ok
        speed, how = speedup_vs_greedy(row)
        ok &= speed is not None and speed >= CLAIM_SPEED_SHARE * self.speedup
        text = f"{quality}, batch 1 {speed or 0.0:.2f}x ({how})"
        if self.batched is not None:
            batched, how = speedup_vs_greedy(row, "throughput")
            ok &= batched is not None and batched >= CLAIM_SPEED_SHARE * self.batched
            text += f", batched {batched or 0.0:.2f}x ({how})"
        return text, ok


Target = Union[BleuShare, ExactBlockwise, Speculative, PrintsTeacherGreedy, BleuGain, AboveFairseq, Claim]


@dataclass(frozen=True)
class System:
    """One system of the catalogue, one block below: ``values`` maps a preset to the configurations it runs (a value
    each, e.g. K; a preset it is absent from runs none), ``configure`` makes a value's :class:`Config`, ``targets``
    are the preset's quality bars on its rows, ``budgets`` its recipes' training budgets (by the name the recipe
    passes to ``student_args``) and ``claims`` the numbers the README states for its rows on a preset (the README's
    systems table: :data:`README_CLAIMS`)."""

    key: str
    values: Dict[str, Tuple]
    configure: Callable[..., Config]
    targets: Dict[str, Tuple[Target, ...]] = field(default_factory=dict)
    budgets: Dict[str, Budget] = field(default_factory=dict)
    claims: Dict[str, Tuple[Claim, ...]] = field(default_factory=dict)


# --- blockwise: Blockwise parallel decoding (Stern et al. 2018) ------------------------------------------------------


def blockwise(k: int) -> Config:
    """Blockwise parallel decoding (Stern et al. 2018): heads on the frozen teacher, then everything fine-tuned from
    that checkpoint; decoded with exact acceptance."""
    frozen, finetuned = f"blockwise-{k}-frozen", f"blockwise-{k}-finetuned"
    exact = ("--beam", "1", "--block-accept", "exact")
    return Config(
        jobs=(
            job(
                student_step(frozen, "blockwise.sh", k, "frozen"),
                Step(finetuned, f"{EXAMPLES}/blockwise.sh", (DATA_BIN, Checkpoint(frozen), SAVE_DIR, k, "finetuned")),
            ),
        ),
        rows=(
            Row(
                f"Blockwise k={k} frozen, exact",
                frozen,
                exact,
                drafts=True,
                made="heads trained on the frozen teacher",
                teacher_greedy=True,
            ),
            Row(
                f"Blockwise k={k} fine-tuned, exact",
                finetuned,
                exact,
                drafts=True,
                made="all parameters fine-tuned from the frozen stage, head 1 + one random head per update",
            ),
        ),
    )


BLOCKWISE = System(
    "blockwise",
    {"cpu": (4,), "cpu-long": (4,), "gpu": (4,)},
    blockwise,
    targets={
        "cpu-long": (
            ExactBlockwise("Blockwise k=4 frozen, exact", 1.5),
            ExactBlockwise("Blockwise k=4 fine-tuned, exact", 2.0, max_bleu_loss=1.0),
        ),
        "gpu": (
            ExactBlockwise("Blockwise k=4 frozen, exact", 1.0, min_speedup=1.5),
            ExactBlockwise("Blockwise k=4 fine-tuned, exact", 2.0, max_bleu_loss=1.0, min_speedup=1.5),
        ),
    },
    budgets={
        # blockwise heads on the frozen teacher: only new heads learn, at a high rate
        "blockwise-frozen": Budget(100, "3e-3", 20),
        # every parameter, from the frozen stage, at a low rate
        "blockwise-finetuned": Budget(40, "2e-4", 10),
    },
    claims={"cpu": (Claim("Blockwise k=4 frozen, exact", 28.57, 1.5, exact=True, batched=1.1),)},
)


# --- spec-drafter: Speculative decoding (Xia et al. 2023) ------------------------------------------------------------


def spec_drafter(k: int) -> Config:
    """Speculative decoding (Xia et al. 2023): a shallow non-autoregressive drafter proposes k tokens, the teacher
    verifies them in one call; exact verification prints the teacher's greedy output, relaxed (top-3 within 1 nat)
    accepts more."""
    step = f"spec-drafter-{k}"
    verify = ("--beam", "1", "--spec-drafter-teacher", TEACHER)
    relaxed = ("--spec-drafter-verify", "relaxed", "--spec-drafter-beta", "3", "--spec-drafter-tau", "1")
    return Config(
        jobs=(job(student_step(step, "spec_drafter.sh", k)),),
        rows=(
            Row(
                f"Speculative k={k}, exact",
                step,
                verify,
                drafts=True,
                made="--init-from-ar-scope all: the teacher's encoder (frozen), embeddings, output projection and "
                "first decoder layer (Xia et al. describe no initialisation from the teacher); drafter trained on "
                "the teacher's greedy outputs; beyond the paper: each prefix token's input adds the teacher's "
                "decoder state before it (--read-teacher-states)",
                teacher_greedy=True,
            ),
            Row(
                f"Speculative k={k}, relaxed",
                step,
                verify + relaxed,
                made="top-3 within 1 nat of the teacher's best (Xia et al.'s relaxed verification)",
            ),
            Row(
                f"Speculative k={k}, greedy steps only",
                step,
                verify + ("--max-drafting-sentences", "0"),
                made="no drafts: the teacher's greedy search in the exact rows' decoder loop (what drafting adds)",
                teacher_greedy=True,
            ),
        ),
    )


SPEC_DRAFTER = System(
    "spec-drafter",
    {"cpu": (3,), "cpu-long": (3,), "gpu": (8,)},
    spec_drafter,
    targets={
        # the main job's: what exact speculative decoding should reach on a CPU (not met yet: docs/design-notes.md,
        # "What a speculative step costs at batch 1")
        "cpu": (Speculative("Speculative k=3, exact", 2.5, min_tokens_per_call=3.0, min_vs_ct2=1.0),),
        "cpu-long": (Speculative("Speculative k=3, exact", 1.5),),
        "gpu": (
            Speculative("Speculative k=8, exact", 1.5),
            Speculative("Speculative k=8, relaxed", 1.5, exact=False),
        ),
    },
    budgets={
        # the drafter learns per update more than per sentence: on the CPU 2,400 updates of 512 tokens (the script sets
        # --max-tokens 512) at 2e-3 (the mask embedding and the queries start from nothing) drafted 2.14 tokens per
        # teacher call against 1.90 for 600 (k=3, greedy targets; docs/design-notes.md)
        "spec-drafter": Budget(2400, "2e-3", 40, gpu_lr="1e-3"),
    },
    claims={"cpu": (Claim("Speculative k=3, exact", 28.57, 1.8, exact=True, batched=1.1),)},
)


# --- sat: Semi-Autoregressive Transformer (Wang et al. 2018) ---------------------------------------------------------

# examples/multi30k/sat.sh: the paper's model plus two options against the stutter of a group's positions
SAT_MADE = f"{INIT_ALL}; beyond the paper: --group-slot-embedding and --group-repeat-bias; CPU presets: lr 2e-3"


def sat(k: int) -> Config:
    """Semi-Autoregressive Transformer (Wang et al. 2018) on distilled data, greedy and beam 4."""
    step = f"sat-{k}"
    return Config(
        jobs=(job(student_step(step, "sat.sh", k)),),
        rows=(
            Row(f"SAT K={k}, greedy", step, ("--beam", "1"), made=SAT_MADE),
            Row(f"SAT K={k}, beam 4", step, ("--beam", "4"), made=SAT_MADE),
        ),
    )


SAT = System(
    "sat",
    {"cpu": (2,), "cpu-long": (2, 4), "gpu": (2,)},
    sat,
    targets={
        "cpu-long": (BleuShare("SAT K=2, beam 4", 0.95), BleuShare("SAT K=4, greedy", 0.80)),
        "gpu": (BleuShare("SAT K=2, greedy", 0.95, 1.5, over="greedy"),),
    },
    budgets={
        # CPU 2e-3: on the quickstart's data (150 updates) 81.2-81.7% of the teacher's beam BLEU, 5.6-6.5% of words
        # repeating the one before (teacher greedy: 4.0%), against 71.6% and 12.6% at 5e-4 (docs/design-notes.md)
        "sat": Budget(150, "2e-3", 20, gpu_lr="5e-4"),
    },
    claims={"cpu": (Claim("SAT K=2, greedy", 24.13, 2.2),)},
)


# --- recover-sat: RecoverSAT (Ran et al. 2020) -----------------------------------------------------------------------


@dataclass(frozen=True)
class Segments:
    """A RecoverSAT configuration: ``k`` segments; ``nonempty_first`` (beyond the paper): a target shorter than K
    subwords is cut into one-subword segments with the empty ones last (``--nonempty-segments-first``), where EQUAL
    leaves them between the non-empty ones (Multi30k's targets, ~14 subwords, are near K = 10)."""

    k: int
    nonempty_first: bool = False


def recover_sat(value: Union[int, Segments]) -> Config:
    """RecoverSAT (Ran et al. 2020): K segments in parallel (``value``: K or a :class:`Segments`)."""
    segments = value if isinstance(value, Segments) else Segments(value)
    k, step, name, extra = segments.k, f"recover-sat-{segments.k}", f"RecoverSAT K={segments.k}", ()
    made = (
        f"{INIT_ALL}; splits at any subword (eq. 5-6), p annealed over 2/3 of training, q = 0.5, DEL-only loss on "
        "injected segments; CPU: lr 2e-3"
    )
    if segments.nonempty_first:
        step, name, extra = f"{step}-nonempty-first", f"{name}, empty segments last", ("--nonempty-segments-first",)
        made += "; a target shorter than K cut into one-subword segments, the empty ones last (beyond the paper)"
    return Config(
        jobs=(job(student_step(step, "recover_sat.sh", k, *extra)),),
        rows=(Row(name, step, ("--beam", "1"), made=made),),
    )


RECOVER_SAT = System(
    "recover-sat",
    {"cpu": (2,), "cpu-long": (2, 10, Segments(10, nonempty_first=True)), "gpu": (2,)},
    recover_sat,
    targets={
        # K=10, the paper's operating point (-0.85 BLEU at 4.3x): 4x the teacher's beam is ~2.5x its greedy here
        "cpu-long": (BleuShare("RecoverSAT K=2", 0.95), BleuShare("RecoverSAT K=10", 0.90, 4.0)),
        "gpu": (BleuShare("RecoverSAT K=2", 0.95, 1.5, over="greedy"),),
    },
    budgets={"recover-sat": Budget(100, "2e-3", 20, gpu_lr="5e-4")},
    claims={"cpu": (Claim("RecoverSAT K=2", 24.38, 2.3),)},
)


# --- fertility-nat: NAT with fertility and noisy parallel decoding (Gu et al. 2018) ----------------------------------

NAT_INIT = (
    "--init-from-ar-scope all: encoder, embeddings, output projection and the decoder layers that fit (the paper: "
    "the encoder); one-hidden-layer fertility predictor (the paper: softmax classifier)"
)


@dataclass(frozen=True)
class Npd:
    """A noisy-parallel-decoding row of the NAT: ``samples`` candidates ranked by the teacher's log-probability per
    token (the default, as the authors' released code ranks them) or, ``eq8_sum``, by the plain sum of the paper's
    eq. 8, which on Multi30k keeps shorter candidates and fell below argmax decoding (docs/design-notes.md, *Which
    candidate NPD should keep*)."""

    samples: int
    eq8_sum: bool = False
    onnx: bool = False  # the CPU presets: also the ONNX Runtime rows (with_onnx_rows)


ARGMAX = "argmax fertility"
ONNX_STEP = "fertility-nat-onnx"
ONNX_ROWS = {"float32": "NAT, argmax fertility (ONNX Runtime)", "int8": "NAT, argmax fertility (ONNX Runtime int8)"}


@dataclass(frozen=True)
class OnnxRow(Row):
    """A row of the NAT decoded by ONNX Runtime: ``step`` is the export step, which links the NAT's checkpoint into
    its directory beside the graphs (examples/multi30k/fertility_nat_onnx.sh), decoded with ``--onnx-model`` its
    ``graphs`` subdirectory (``float32`` or ``int8``)."""

    graphs: str = "float32"

    def spec(self, run: Run, preset: Preset) -> RowSpec:
        spec = super().spec(run, preset)
        graphs = os.path.join(os.path.dirname(spec.checkpoint), self.graphs)
        return RowSpec(spec.name, spec.checkpoint, spec.args + ["--onnx-model", graphs])


def with_onnx_rows(config: Config) -> Config:
    """``config`` with the trained NAT exported to ONNX (step fertility-nat-onnx, after its training) and decoded
    with argmax fertilities by ONNX Runtime on the CPU, float32 (the PyTorch row's tokens up to near-ties) and int8
    weights (another precision: its own BLEU), rows beside the PyTorch argmax row."""
    export = Step(ONNX_STEP, f"{EXAMPLES}/fertility_nat_onnx.sh", (Checkpoint("fertility-nat"), SAVE_DIR), None)
    steps = list(config.jobs[0].steps)
    steps.insert([step.name for step in steps].index("fertility-nat") + 1, export)
    decoding = ("--beam", "1", "--fertility-decoding", "argmax")
    made = {
        "float32": f"{NAT_INIT}; its pass exported by nat-export-onnx and run by ONNX Runtime (float32)",
        "int8": f"{NAT_INIT}; its pass exported by nat-export-onnx --int8 (int8 weights, ONNX Runtime's dynamic "
        "quantization) and run by ONNX Runtime",
    }
    onnx = tuple(OnnxRow(name, ONNX_STEP, decoding, made=made[kind], graphs=kind) for kind, name in ONNX_ROWS.items())
    at = [row.name for row in config.rows].index(f"NAT, {ARGMAX}") + 1
    rows = config.rows[:at] + onnx + config.rows[at:]
    return Config(jobs=(job(*steps),) + config.jobs[1:], rows=rows, paired_tests=config.paired_tests)


def fertility_nat(value: Union[int, Npd]) -> Config:
    """NAT with fertility (Gu et al. 2018): eflomal fertilities on the distilled targets (links kept), then the NAT,
    decoded with argmax, average and noisy parallel decoding (``value``: S fertility samples rescored by the teacher,
    or an :class:`Npd`). One training serves every S."""
    npd = value if isinstance(value, Npd) else Npd(value)
    decoding = ("--beam", "1", "--fertility-decoding")
    npd_made = (
        f"{NAT_INIT}; the S candidates are the argmax fertilities and S-1 samples "
        "(--npd-candidates argmax_and_samples; the paper: S samples)"
    )
    name, args = npd_name(npd.samples), tuple(npd_args(npd.samples, TEACHER))
    if npd.eq8_sum:
        name, args = f"{name}, eq. 8 sum", args + ("--npd-ranking", "sum")
        npd_made += "; ranked by the teacher's log-probability, summed (--npd-ranking sum: the paper's eq. 8)"
    else:
        npd_made += (
            "; ranked by the teacher's log-probability per token (--npd-ranking mean, as the authors' released code "
            "ranks them; the paper's eq. 8: the sum)"
        )
    fine_tuned = (
        f"{NAT_INIT}; then fine-tuned towards the teacher (eq. 11: reverse KL + REINFORCE, λ = 0.25; the fertilities' "
        "reward per output position, --rkl-reward mean, beyond the paper: its sum shortened the outputs)"
    )
    config = Config(
        jobs=(
            job(
                Step("fertility", "run_scripts/fertility.sh", (DATA_BIN, "--save-links", LINKS), compared_with=None),
                student_step("fertility-nat", "fertility_nat.sh"),
                student_step("fertility-nat-rkl", "fertility_nat_rkl.sh", Checkpoint("fertility-nat")),
            ),
        ),
        rows=(
            Row("NAT, argmax fertility", "fertility-nat", decoding + ("argmax",), made=NAT_INIT),
            Row("NAT, average fertility", "fertility-nat", decoding + ("average",), made=NAT_INIT),
            Row(name, "fertility-nat", args, made=npd_made),
            # the paper's NAT+FT rows (Table 1): the same decodings after the fine-tuning
            Row(f"NAT+FT, {ARGMAX}", "fertility-nat-rkl", decoding + ("argmax",), made=fine_tuned),
            Row(f"NAT+FT, {name[5:]}", "fertility-nat-rkl", args, made=fine_tuned + npd_made[len(NAT_INIT) :]),
        ),
        paired_tests=(
            ("NAT, argmax fertility", name),
            ("NAT, argmax fertility", f"NAT+FT, {ARGMAX}"),
            (f"NAT+FT, {ARGMAX}", f"NAT+FT, {name[5:]}"),
        ),
    )
    return with_onnx_rows(config) if npd.onnx else config


# the NAT deployed through ONNX Runtime against the best autoregressive engine on a CPU, CTranslate2 (batch 1)
ONNX_TARGETS = (
    OnnxDeployment(ONNX_ROWS["float32"], f"NAT, {ARGMAX}", CT2_GREEDY_ROW, 1.0),
    OnnxDeployment(ONNX_ROWS["int8"], f"NAT, {ARGMAX}", CT2_INT8_GREEDY_ROW, 1.5, max_bleu_loss=0.3),
)
# Gu et al. Table 1: the fine-tuning and NPD each add BLEU (NAT+FT+NPD S=10 over NAT+FT, +1.0 to +1.8 on WMT/IWSLT)
NPD_TARGETS = (
    BleuGain(f"NAT+FT, {ARGMAX}", f"NAT, {ARGMAX}", 0.0, max_p=0.05),
    BleuGain("NAT+FT, NPD S=10", f"NAT+FT, {ARGMAX}", 0.5, max_p=0.05),
)
# on the CPU NPD keeps S=10: S=100 decodes 100 candidates per sentence, ~10 min of the batched pass on 2 cores
FERTILITY_NAT = System(
    "fertility-nat",
    {"cpu": (Npd(10, onnx=True),), "cpu-long": (Npd(10, onnx=True), Npd(10, eq8_sum=True, onnx=True)), "gpu": (10,)},
    fertility_nat,
    targets={
        "cpu": ONNX_TARGETS + NPD_TARGETS,
        "cpu-long": ONNX_TARGETS
        + NPD_TARGETS
        + (
            BleuShare("NAT, argmax fertility", 0.70),
            BleuShare("NAT, NPD S=10", 0.78),
            BleuGain("NAT, NPD S=10", "NAT, argmax fertility", 0.0, max_p=0.05),  # Gu et al. Table 1: NPD > argmax
        ),
        "gpu": (BleuShare("NAT, argmax fertility", 0.80, 5.0, over="greedy"),),
    },
    # the fine-tuning: from the trained NAT at a lower rate (the student already fits the distilled targets)
    budgets={
        "fertility-nat": Budget(120, "5e-4", 20),
        "fertility-nat-rkl": Budget(40, "2e-4", 4, gpu_lr="1e-4", gpu_updates=300),
    },
    claims={"cpu": (Claim("NAT, argmax fertility", 22.99, 4.2), Claim(f"NAT+FT, {ARGMAX}", 24.63, 5.5))},
)


# --- nad-ad: Encoder-NAD-AD (Zhou et al. 2020), trained as its AR twin, the teacher, was ---------------------------

NAD_AD_ROW = "Encoder-NAD-AD, beam 4"
# the fine-tune protocol's budget (NAD_AD_INIT=teacher examples/multi30k/nad_ad.sh and its same-updates baseline
# ar_baseline.sh; dev/nad_ad_seeds.sh PROTOCOL=teacher): no preset trains it, as it gained nothing over 3 seeds
NAD_AD_BUDGET = Budget(30, "5e-4", 10, gpu_updates=400)


def nad_ad(_value=None) -> Config:
    """Encoder-NAD-AD in the paper's protocol: the whole model trained jointly from random weights with the teacher's
    own recipe (updates, schedule, batches, seed; validation and checkpoint selection), so that the run's teacher is
    its AR twin; the paired bootstrap test of the gain over the teacher's beam row."""
    return Config(
        jobs=(job(student_step("nad-ad", "nad_ad.sh")),),
        rows=(
            Row(
                NAD_AD_ROW,
                "nad-ad",
                ("--beam", "4"),
                checkpoint="checkpoint_best.pt",
                made="from random weights with the teacher's recipe (the paper's protocol; its AR twin is the "
                "teacher, same updates and seed); the NAD scores with the AD's output layer (tied)",
            ),
        ),
        paired_tests=((TEACHER_BEAM_ROW, NAD_AD_ROW),),
    )


NAD_AD = System(
    "nad-ad",
    {"cpu": (None,), "cpu-long": (None,), "gpu": (None,)},
    nad_ad,
    # Zhou et al.: +0.59 to +1.14 BLEU over the AR twin
    targets={
        "cpu-long": (BleuGain(NAD_AD_ROW, TEACHER_BEAM_ROW, 0.5, max_p=0.05),),
        "gpu": (BleuGain(NAD_AD_ROW, TEACHER_BEAM_ROW, 0.5, max_slowdown=0.10, max_p=0.05),),
    },
    budgets={"nad-ad": NAD_AD_BUDGET, "ar-baseline": NAD_AD_BUDGET},
    claims={"cpu": (Claim(NAD_AD_ROW, 28.76, 0.67),)},
)


# --- fairseq: fairseq's own NAT and CMLM, for comparison (cpu-long) --------------------------------------------------

FAIRSEQ_NAT_ROW, FAIRSEQ_CMLM_ROW = "fairseq NAT (nonautoregressive_transformer)", "fairseq CMLM, 10 iterations"
FAIRSEQ_BUDGET = (
    "from scratch, the plugin NAT's updates (cpu-long: 480) on the distilled targets: a fraction of the plugin NAT's "
    "budget, which starts from the teacher (dev/fairseq_peers.sh: the teacher's + the NAT's updates)"
)


def fairseq_nat(_value=None) -> Config:
    """fairseq's own NAT and CMLM (Mask-Predict, 10 iterations) at the NAT's number of updates, from scratch."""
    script = f"{EXAMPLES}/fairseq_nat.sh"
    lev = ("--task", "translation_lev", "--iter-decode-max-iter")
    return Config(
        jobs=tuple(job(Step(f"fairseq-{model}", script, (DATA_BIN, SAVE_DIR, model))) for model in ("nat", "cmlm")),
        rows=(
            Row(FAIRSEQ_NAT_ROW, "fairseq-nat", lev + ("0",), plugin=False, made=FAIRSEQ_BUDGET),
            Row(FAIRSEQ_CMLM_ROW, "fairseq-cmlm", lev + ("9",), plugin=False, made=FAIRSEQ_BUDGET),
        ),
    )


FAIRSEQ = System(
    "fairseq",
    {"cpu-long": (None,)},
    fairseq_nat,
    targets={"cpu-long": (AboveFairseq((FAIRSEQ_NAT_ROW, FAIRSEQ_CMLM_ROW), both=False),)},
    budgets={
        # fairseq's own NAT and CMLM, from scratch, with the plugin NAT's budget; the CMLM at fairseq's README rate
        # 5e-4: at 2e-3 it never leaves the unigram plateau (the learning tests' synthetic task, 128-d, 600 updates:
        # 0.0 BLEU against 19.8 at 5e-4; tests/test_fairseq_peers.py)
        "fairseq-nat": Budget(120, "2e-3", 20),
        "fairseq-cmlm": Budget(120, "5e-4", 20),
    },
)


# --- the teacher's rows, which every run makes besides the systems' (REFERENCE_ROWS) ---------------------------------

# the README's claims on them: its systems table's last line
REFERENCE_CLAIMS: Dict[str, Tuple[Claim, ...]] = {
    "cpu": (
        Claim(TEACHER_BEAM_ROW, 29.55, 0.62),
        Claim(TEACHER_GREEDY_ROW, 28.57, 1.0),
        Claim(TEACHER_GREEDY_PLUGIN_ROW, 28.57, 1.6, exact=True),
        Claim(TEACHER_INT8_DECODER_ROW, 28.63, 2.2),
        Claim(CT2_INT8_GREEDY_ROW, 28.42, 11.0, batched=4.9),
    ),
}


# the bars on them: the plugin's greedy loop, the floor under every exact row, at >= 2.2x fairseq's greedy search
REFERENCE_TARGETS: Dict[str, Tuple[Target, ...]] = {"cpu": (PrintsTeacherGreedy(TEACHER_GREEDY_PLUGIN_ROW, 2.2),)}


# --- the catalogue: every system's block above, in the order a run trains and decodes them ---------------------------

# The CPU presets train one headline configuration of every system (cpu-long adds SAT K=4, RecoverSAT K=10, NPD
# ranked by length-normalised scores and fairseq's own models, and its students train 4x longer); the GPU preset the
# configurations its targets are about (docs/results.md).
SYSTEMS: Tuple[System, ...] = (BLOCKWISE, SPEC_DRAFTER, SAT, RECOVER_SAT, FERTILITY_NAT, NAD_AD, FAIRSEQ)
# every student recipe's budget, from its system's block (examples/multi30k/*.sh pass their name to student_args)
BUDGETS: Dict[str, Budget] = {name: budget for system in SYSTEMS for name, budget in system.budgets.items()}
# the README's systems table, row by row: the systems whose claims it states, in its order (the teacher's last)
README_ORDER = ("fertility-nat", "sat", "recover-sat", "blockwise", "nad-ad", "spec-drafter")


def readme_claims(preset: str) -> Tuple[Claim, ...]:
    """The claims of the README's systems table on ``preset``, in the table's order (:data:`README_ORDER`)."""
    systems = {system.key: system for system in SYSTEMS}
    claims = [claim for key in README_ORDER for claim in systems[key].claims.get(preset, ())]
    return tuple(claims) + REFERENCE_CLAIMS.get(preset, ())


# The speed and BLEU the README's systems table states for the main job (PRESET=cpu), one claim per cell: its report
# checks each against the run (met/missed), and tests/test_recipes.py that the README prints these numbers.
# The CPU kind they were measured on (the README names it): speed-ups move with the CPU (an Intel Xeon's differ from
# an AMD EPYC's), so a run on another kind has the claims' BLEU and exactness checked, and their speed-ups not.
CLAIMS_CPU_KIND: Dict[str, str] = {"cpu": "AMD EPYC"}
CPU_KINDS = ("AMD EPYC", "Intel Xeon")


def cpu_kind(device: str) -> Optional[str]:
    """The kind (:data:`CPU_KINDS`) of the CPU a benchmark's device line names (its ``meta["device"]``, e.g. "AMD EPYC
    7B13 (2 threads)", "Intel(R) Xeon(R) CPU @ 2.20GHz (2 threads)"), None for another kind or a GPU."""
    words = device.replace("(R)", " ").split()
    return next((kind for kind in CPU_KINDS if all(word in words for word in kind.split())), None)


README_CLAIMS: Dict[str, Tuple[Claim, ...]] = {
    preset: readme_claims(preset) for preset in PRESETS if readme_claims(preset)
}


Only = Union[None, str, Sequence[str]]  # a system's key, several, or None: every system


def selected_systems(only: Only) -> List[System]:
    """The systems ``only`` names (every one for None), in the catalogue's order."""
    keys = [only] if isinstance(only, str) else only
    unknown = [key for key in keys or () if key not in [s.key for s in SYSTEMS]]
    if unknown:
        raise CatalogueError(f"no system {unknown[0]!r} in the catalogue (systems: {[s.key for s in SYSTEMS]})")
    return [system for system in SYSTEMS if keys is None or system.key in keys]


def configs(preset: str, only: Only = None, values: Optional[Sequence] = None) -> List[Config]:
    """The configurations a run of ``preset`` trains and decodes, system by system (``only``: those systems', and with
    ``values`` instead of the preset's when given)."""
    systems = selected_systems(only)
    return [
        system.configure(value)
        for system in systems
        for value in (system.values.get(preset, ()) if values is None else values)
    ]


def unique(items: list, what: str) -> list:
    """``items`` in order, each once (a job or row two configurations share); two different ones of one name are an
    error."""
    kept: Dict[str, object] = {}
    for item in items:
        if kept.setdefault(item.name, item) != item:
            raise CatalogueError(f"two different {what} are named {item.name!r}")
    return list(kept.values())


def jobs(preset: str, only: Only = None, values: Optional[Sequence] = None) -> List[Job]:
    """The training jobs of a run, in order."""
    return unique([job for config in configs(preset, only, values) for job in config.jobs], "jobs")


def rows(preset: str, only: Only = None, values: Optional[Sequence] = None) -> List[Row]:
    """The benchmark rows of a run, in order."""
    return unique([row for config in configs(preset, only, values) for row in config.rows], "rows")


def paired_tests(preset: str, only: Only = None, values: Optional[Sequence] = None) -> List[Tuple[str, str]]:
    """The paired bootstrap tests (baseline row, system row) of a run."""
    tests = [test for config in configs(preset, only, values) for test in config.paired_tests]
    return list(dict.fromkeys(tests))


def targets(preset: str, only: Only = None) -> List[Target]:
    """The quality bars of a run of ``preset``, system by system, then the teacher rows' and the README's claims on it
    (``only``: the bars of those systems, no others: the README's numbers are the quickstart's own teacher's)."""
    bars = [target for system in selected_systems(only) for target in system.targets.get(preset, ())]
    if only is not None:
        return bars
    return bars + list(REFERENCE_TARGETS.get(preset, ())) + list(README_CLAIMS.get(preset, ()))


def own_teacher_targets(preset: str, only: Only, measured_rows: Sequence[dict]) -> List[Target]:
    """The bars of a run on a user's own teacher: what its command promises (the README), not the Multi30k targets,
    which are about the quickstart's teacher on Multi30k. :class:`PrintsTeacherGreedy` for every row of the finished
    benchmark (``results.json`` rows) that it checked against the teacher's greedy output (an ``exact_check``) or that
    prints it by design (the plugin's greedy loop, the catalogue's ``teacher_greedy`` rows of ``only``), which
    misses its bar without a check."""
    promised = {TEACHER_GREEDY_PLUGIN_ROW} | {row.name for row in rows(preset, only) if row.teacher_greedy}
    names = [row["name"] for row in measured_rows if row.get("exact_check") or row["name"] in promised]
    return [PrintsTeacherGreedy(name) for name in names]


def made_notes(preset: str, only: Only = None) -> List[Tuple[str, str]]:
    """(row name, how it was made) of the rows of ``preset`` (``only``: of those systems) that carry a note."""
    return [(row.name, row.made) for row in rows(preset, only) if row.made]


def plugin_rows(preset: str) -> Tuple[str, ...]:
    """The names of the rows of ``preset`` decoded by a plugin system."""
    return tuple(row.name for row in rows(preset) if row.plugin)


def check():
    """Raise :class:`CatalogueError` where the catalogue contradicts itself: a preset it does not know, a step or row
    name used twice, a row decoding a step its preset does not train, a step starting from a checkpoint its job has
    not made before it, a target or paired test naming a row its preset does not make, a budget two systems name, a
    README claim on a row its system does not make, a system with claims that :data:`README_ORDER` leaves out."""
    for system in SYSTEMS:
        unknown = (set(system.values) | set(system.targets) | set(system.claims)) - set(PRESETS)
        if unknown:
            raise CatalogueError(f"system {system.key!r} names presets {sorted(unknown)} (presets: {list(PRESETS)})")
    budgets = [name for system in SYSTEMS for name in system.budgets]
    twice = [name for name in budgets if budgets.count(name) > 1]
    if twice:
        raise CatalogueError(f"two systems name the budget {twice[0]!r}")
    claiming = [system.key for system in SYSTEMS if system.claims]
    if sorted(README_ORDER) != sorted(claiming):
        raise CatalogueError(f"README_ORDER {README_ORDER} is not the systems with README claims ({claiming})")
    for preset in PRESETS:
        steps = [step for job in jobs(preset) for step in job.steps]
        unique(steps, "steps")
        names = [row.name for row in rows(preset)] + list(REFERENCE_ROWS)
        for job in jobs(preset):
            for index, step in enumerate(job.steps):
                before = [s.name for s in job.steps[:index]]
                needs = [word.step for word in step.args if isinstance(word, Checkpoint) and word.step not in before]
                if needs:
                    raise CatalogueError(f"step {step.name!r} starts from {needs[0]!r}, which its job has not trained")
        for row in rows(preset):
            if row.step not in [step.name for step in steps]:
                raise CatalogueError(f"{preset}: row {row.name!r} decodes step {row.step!r}, which the preset lacks")
        for system in SYSTEMS:
            made = [row.name for row in rows(preset, system.key)]
            strays = [claim.row for claim in system.claims.get(preset, ()) if claim.row not in made]
            if strays:
                raise CatalogueError(f"{preset}: {system.key!r} claims the row {strays[0]!r}, which it does not make")
        named = [(f"target {t.what!r}", name) for t in targets(preset) for name in t.rows]
        named += [(f"paired test {test}", name) for test in paired_tests(preset) for name in test]
        named += [("an optional row", name) for name in PRESETS[preset].optional_rows]
        for what, name in named:
            if name not in names:
                raise CatalogueError(f"{preset}: {what} names the row {name!r}, which the preset does not make")


def emit(lines: List[List[str]]):
    """Print tab-separated fields, one line each (bash splits a line with read -a, a list of lines with mapfile)."""
    for fields in lines:
        bad = [f for f in fields if "\t" in f or "\n" in f]
        if bad:
            raise CatalogueError(f"{bad[0]!r}: a tab or a newline cannot pass to bash")
        print("\t".join(fields))


def main(argv: Optional[List[str]] = None):
    parser = argparse.ArgumentParser(prog="python -m nat_recipes.catalogue", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    preset = argparse.ArgumentParser(add_help=False)
    preset.add_argument("--preset", required=True, choices=list(PRESETS), help="the run's size preset")
    run = argparse.ArgumentParser(add_help=False, parents=[preset])
    run.add_argument("--work", required=True, help="the run's work directory (students save into WORK/ckpt/STEP)")
    run.add_argument("--data-bin", required=True, help="the run's data-bin")
    run.add_argument("--teacher", required=True, help="the AR teacher's checkpoint")
    run.add_argument(
        "--checkpoint-name",
        required=True,
        help="the file a student's training leaves for decoding (run_scripts/common.sh STUDENT_CHECKPOINT)",
    )
    run.add_argument(
        "--only",
        type=lambda text: text.split(","),
        metavar="SYSTEM[,SYSTEM...]",
        help=f"these systems' steps or rows only (of {', '.join(s.key for s in SYSTEMS)})",
    )
    run.add_argument(
        "--values",
        type=lambda text: [int(value) for value in text.split(",")],
        metavar="V,V,...",
        help="with --only: these configurations (integers: K, or NPD's S) instead of the preset's",
    )
    commands.add_parser("steps", parents=[run], help="the training steps: JOB, STEP, SCRIPT, ARGS (tab-separated)")
    speed = commands.add_parser(
        "speed-steps",
        parents=[run],
        help="the fairseq-train steps (the teacher's recipe on the distilled targets first): STEP, the recipe it is "
        "compared with, SCRIPT, ARGS (tab-separated)",
    )
    speed.add_argument("--save-dir", required=True, help="where every step saves (a scratch directory)")
    options = commands.add_parser("options", parents=[preset], help="the preset's benchmark options")
    options.add_argument(
        "--latency-sentences", type=int, metavar="N", help="batch-1 latency on N sentences (default: the preset's)"
    )
    bench = commands.add_parser(
        "rows", parents=[run], help="the benchmark options of the rows (--system, --paired-test)"
    )
    bench.add_argument("--existing", action="store_true", help="only the rows whose checkpoint exists")
    budget = commands.add_parser("budget", parents=[preset], help="a student recipe's UPDATES LR WARMUP on the preset")
    budget.add_argument("recipe", choices=list(BUDGETS), help="the recipe (examples/multi30k/*.sh)")
    budget.add_argument("--updates", type=int, help="replaces the preset's number of updates (STUDENT_UPDATES)")
    args = parser.parse_args(argv)
    check()
    if args.command == "budget":
        print(*BUDGETS[args.recipe].for_preset(args.preset, args.updates))
        return
    if args.command == "options":
        emit([[word] for word in PRESETS[args.preset].benchmark_options(args.latency_sentences)])
        return
    try:
        selected_systems(args.only)
    except CatalogueError as err:
        parser.error(f"--only: {err}")
    if args.values is not None and len(args.only or ()) != 1:
        parser.error("--values needs --only SYSTEM (one system)")
    selection = (args.preset, args.only, args.values)
    context = Run(args.work, args.data_bin, args.teacher, args.checkpoint_name, getattr(args, "save_dir", None))
    if args.command == "steps":
        emit([[job.name, s.name] + s.command(context) for job in jobs(*selection) for s in job.steps])
    elif args.command == "speed-steps":
        teacher = Step(
            TEACHER_ON_DISTILLED, "run_scripts/train_teacher.sh", (DATA_BIN, SAVE_DIR, "--use-distilled", "target")
        )
        steps = [teacher] + [s for job in jobs(*selection) for s in job.steps if s.compared_with is not None]
        emit([[s.name, s.compared_with] + s.command(context) for s in steps])
    else:
        kept = [row for row in rows(*selection) if not args.existing or os.path.exists(row.checkpoint_path(context))]
        words = [w for row in kept for w in ("--system", row.spec(context, PRESETS[args.preset]).option())]
        names = {row.name for row in kept}
        words += [w for name in PRESETS[args.preset].optional_rows if name in names for w in ("--optional-row", name)]
        for baseline, system in paired_tests(*selection):
            if {baseline, system} <= names | {TEACHER_BEAM_ROW, TEACHER_GREEDY_ROW}:  # the benchmark's own teacher rows
                words += ["--paired-test", f"{baseline}::{system}"]
        emit([[word] for word in words])


if __name__ == "__main__":
    main()
