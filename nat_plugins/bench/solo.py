"""``nat-benchmark --solo``: every engine timed alone in its own process, at the settings that suit it on this machine.

The round-robin pass (:mod:`.schedule`) times all rows in one process, under one OpenMP wait policy, with torch's
OpenMP team and CTranslate2's beside each other. A policy that suits one runtime can slow another (on an Intel Xeon,
``OMP_WAIT_POLICY=ACTIVE`` made CTranslate2 int8 2.2× slower than its default), so the solo pass gives each engine a
process of its own, in the setting a short measurement picks for it:

* engines: fairseq's greedy teacher (the anchor), every plugin row (the teacher in the plugin's linear layout, the
  ``--system`` and NPD rows) and the CTranslate2 greedy rows (float32 and int8); the beam rows of the teacher are left
  to the round-robin pass;
* settings: ``OMP_WAIT_POLICY`` (unset, PASSIVE, ACTIVE) and threads (1 or all cores), set in the child's environment
  (with ``OMP_NUM_THREADS``) before its runtimes load; at 1 thread only the default policy is measured: a policy
  decides what the idle threads of a team do, and one thread has no idle team;
* calibration, per engine: for each runtime family (torch: fairseq and plugin rows; CTranslate2) one process per
  setting times every engine of the family on the first ``--solo-calibration-sentences`` timed sentences (after one
  untimed pass over them); each engine takes the setting of its least median time per sentence. The first torch
  process at a thread count also chooses the CPU linear layout there (:mod:`nat_plugins.engine.cpu_linear`), which
  every later process at that thread count is given (``NAT_LINEAR_LAYOUT``). A run timing fewer sentences than the
  default calibration's 8 (a smoke run) is not calibrated: every engine runs in the runtimes' default setting;
* rounds: one process per engine, loaded once in its setting, times the same batch-1 block of round ``r`` as every
  other engine (the round-robin pass's blocks; with ``--solo-batched`` also the ``--batch-size`` block), each round
  after the benchmark's warm-up sentences; the engines' order is shuffled every round with ``--seed``; the anchor
  times block 0 again at the end (its drift);
* one process runs at a time: a child stops itself (``SIGSTOP``) once loaded and after every command, so its OpenMP
  team cannot spin while another engine is timed, and this process only waits (its CPU time over the solo pass is
  reported: near 0 when it held no spinning team of its own; hence the pass runs before this process loads any row).

Per engine: the median over rounds of the paired ratio (fairseq greedy's block seconds / the engine's, the same block
and round) with its min-max, ms per sentence, the setting and linear layout used, and the timed sentences whose output
differs from the round-robin pass's (:meth:`Solo.check_outputs`). A child gets its job (the row specs, the benchmark's
options, its thread count) as a JSON file, its commands as JSON lines on stdin, and answers in JSON files
(``python -m nat_plugins.bench.solo JOB``); its log is ``OUT_DIR/solo/<name>.log``.
"""

import argparse
import json
import logging
import os
import random
import resource
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Dict, List, Optional, Sequence

import torch

from ..engine import STATE, WeightFirstLinear, linear_layout_choice
from .ctranslate2_rows import ctranslate2_runners
from .measure import FairseqRunner, SoloOutput, generation_cfg, load_split
from .progress import progress_line
from .report import ratio_cell
from .rows import (
    CT2_GREEDY,
    SYSTEM,
    TEACHER_GREEDY,
    TEACHER_GREEDY_PLUGIN,
    BenchmarkError,
    RowSpec,
    spread,
    teacher_specs,
)
from .schedule import Rounds, interleaved_blocks, round_orders, time_unit, units_of, unsettled

logger = logging.getLogger("nat_plugins.bench.benchmark")

SOLO_ROLES = (TEACHER_GREEDY, TEACHER_GREEDY_PLUGIN, SYSTEM, CT2_GREEDY)
TORCH_FAMILY, CT2_FAMILY = "torch", "ctranslate2"
WAIT_POLICIES = (None, "PASSIVE", "ACTIVE")  # None: unset, the runtime's default
DEFAULT_CALIBRATION_SENTENCES = 8
FAIRSEQ_LAYOUT = "torch (fairseq's nn.Linear)"  # the anchor's layers, not swapped by the plugin


def add_solo_options(parser: argparse.ArgumentParser):
    """The benchmark's options of the solo pass."""
    parser.add_argument(
        "--solo",
        action="store_true",
        help="also time every greedy engine (fairseq greedy, the plugin rows, CTranslate2 greedy) alone in its own "
        "process, at the OpenMP wait policy and thread count a short calibration picks for it: a table beside the "
        "round-robin one (CPU only)",
    )
    parser.add_argument(
        "--solo-batched",
        action="store_true",
        help="with --solo: also time the --batch-size pass in every engine's process (batch 1 only by default)",
    )
    parser.add_argument(
        "--solo-calibration-sentences",
        type=int,
        default=None,
        metavar="N",
        help="with --solo: timed sentences of the calibration of every engine in every setting (default: 8; a run "
        "timing fewer is not calibrated: every engine in the runtimes' default setting)",
    )


@dataclass(frozen=True)
class Setting:
    """The process setting of an engine: ``OMP_WAIT_POLICY`` (None: unset) and its thread count."""

    omp_wait_policy: Optional[str]
    threads: int

    @property
    def label(self) -> str:
        return f"{self.omp_wait_policy or 'unset'}, {self.threads} thread{'s' if self.threads > 1 else ''}"

    def environment(self, extra: Dict[str, str]) -> Dict[str, str]:
        """This process's environment with the setting (and ``extra``) in it."""
        env = {key: value for key, value in os.environ.items() if key != "OMP_WAIT_POLICY"}
        if self.omp_wait_policy:
            env["OMP_WAIT_POLICY"] = self.omp_wait_policy
        env["OMP_NUM_THREADS"] = str(self.threads)
        return {**env, **extra}


def settings(cores: int) -> List[Setting]:
    """The candidate settings: 1 thread (default policy: one thread has no idle team) and every policy on ``cores``."""
    return [Setting(None, 1)] + ([Setting(policy, cores) for policy in WAIT_POLICIES] if cores > 1 else [])


def available_cores() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def family(spec: RowSpec) -> str:
    return CT2_FAMILY if spec.role == CT2_GREEDY else TORCH_FAMILY


class Child:
    """A solo process (``python -m nat_plugins.bench.solo JOB``) in the environment ``env``. It loads its engines
    and stops itself; :meth:`run` hands it a command and waits until it has answered and stopped again."""

    def __init__(self, job: dict, env: Dict[str, str], directory: str, name: str):
        self.name, self.directory = name, directory
        job_file = os.path.join(directory, f"{name}.job.json")
        with open(job_file, "w", encoding="utf-8") as f:
            json.dump(job, f)
        self.log_file = os.path.join(directory, f"{name}.log")
        with open(self.log_file, "w", encoding="utf-8") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", __name__, job_file],
                stdin=subprocess.PIPE,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                text=True,
            )
        self.commands, start = 0, time.perf_counter()
        self._wait(os.WUNTRACED)  # loaded
        self.start_seconds = time.perf_counter() - start  # interpreter, imports and engines loaded

    def run(self, passes: List[dict]) -> dict:
        """Time the ``passes`` (:func:`time_engine`) in the child; its answer."""
        answer = os.path.join(self.directory, f"{self.name}.{self.commands}.json")
        self.commands += 1
        self.process.stdin.write(json.dumps({"passes": passes, "out": answer}) + "\n")
        self.process.stdin.flush()
        os.kill(self.process.pid, signal.SIGCONT)
        self._wait(os.WUNTRACED)
        with open(answer, encoding="utf-8") as f:
            return json.load(f)

    def close(self):
        """End the child (end of its commands) and wait for it to exit."""
        self.process.stdin.close()
        os.kill(self.process.pid, signal.SIGCONT)
        self._wait(0)

    def kill(self):
        """End the child now, if it still runs (cleanup after an error)."""
        if self.process.returncode is None:
            self.process.stdin.close()
            os.kill(self.process.pid, signal.SIGKILL)  # a stopped process too
            self._wait(0, check=False)

    def _wait(self, options: int, check: bool = True):
        """Wait until the child stops (``os.WUNTRACED``) or exits; a :class:`BenchmarkError` with its log when it
        exits where it should have stopped or fails."""
        _, status = os.waitpid(self.process.pid, options)
        if os.WIFSTOPPED(status):
            return
        self.process.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait again
        if check and (options & os.WUNTRACED or self.process.returncode != 0):
            with open(self.log_file, encoding="utf-8", errors="replace") as f:
                tail = f.read()[-3000:]
            raise BenchmarkError(f"solo process {self.name} exited ({self.process.returncode}):\n{tail}")


@dataclass
class Solo:
    """The solo pass's results: ``summary`` (``results.json`` "solo"), ``rows`` (every engine's "solo" dict by row
    name) and ``outputs`` (every engine's hypotheses of its timed sentences, by batch size and sentence)."""

    summary: dict
    rows: Dict[str, dict]
    outputs: Dict[str, Dict[int, Dict[int, SoloOutput]]] = field(repr=False)

    def check_outputs(self, outputs: Dict[str, dict]):
        """Count, per engine, the timed batch-1 sentences whose hypothesis differs from the round-robin pass's
        ``outputs`` (row name -> sentence -> :class:`.measure.Output`)."""
        for name, by_size in self.outputs.items():
            differing = sum(not out.same_as(outputs[name][i]) for i, out in by_size[1].items())
            self.rows[name]["differing_sentences"] = differing
            if differing:
                logger.warning("solo: %s differs from its round-robin output on %d sentences", name, differing)
        self.summary["differing_sentences"] = sum(row["differing_sentences"] for row in self.rows.values())

    def markdown(self, rows) -> str:
        """The solo tables of ``results.md``: every engine's setting, layout and speed beside its round-robin ratio
        (``rows``: the benchmark's :class:`.rows.Row` s), and every setting's calibration."""
        summary, batched = self.summary, len(self.summary["batch_sizes"]) > 1
        drift = ", ".join(f"batch {size}: {100 * value:+.1f}%" for size, value in summary["anchor_drift"].items())
        titles = ["OMP_WAIT_POLICY", "threads", "linear layout", "ms / sent", "latency × vs greedy", "round-robin"]
        titles += ["sent/s (batch)", "throughput × vs greedy", "round-robin"] if batched else []
        lines = [
            f"Solo (`--solo`): every engine alone in its own process, one process running at a time ("
            f"{summary['processes']} processes, {summary['wall_seconds']:.0f} s; this process meanwhile used "
            f"{summary['orchestrator_cpu_seconds']:.1f} s of CPU), each in the OMP_WAIT_POLICY and thread count of its "
            f"fastest calibration; {summary['rounds']} rounds on the round-robin pass's blocks, the engines in a "
            "random order per round; × fairseq greedy: the median of the per-round paired ratios (their range), "
            f"beside the round-robin pass's; drift of fairseq greedy: {drift}; ≠: timed sentences whose output "
            "differs from the round-robin pass's",
            "",
            "| system | " + " | ".join(titles) + " | ≠ |",
            "|---|---|---:|---|" + "---:|" * (len(titles) - 3) + "---:|",
        ]
        for row in rows:
            solo = self.rows.get(row.name)
            if solo is None:
                continue
            cells = [
                solo["omp_wait_policy"] or "(unset)",
                str(solo["threads"]),
                solo["linear_layout"] or "–",
                f"{solo['ms_per_sentence']:.1f}",
                ratio_cell(solo["latency_ratio_rounds"], solo["latency_unsettled"]),
                ratio_cell(row.latency_ratio_rounds),
            ]
            if batched:
                cells += [
                    f"{solo['sent_per_s']:.1f}",
                    ratio_cell(solo["throughput_ratio_rounds"], solo["throughput_unsettled"]),
                    ratio_cell(row.throughput_ratio_rounds),
                ]
            cells.append(str(solo.get("differing_sentences", "–")))
            lines.append(f"| {row.name} | " + " | ".join(cells) + " |")
        calibration = summary["calibration"]
        labels = [Setting(**setting).label for setting in summary["settings"]]
        if not calibration["sentences"]:
            lines += [
                "",
                f"Solo calibration: none (fewer than {DEFAULT_CALIBRATION_SENTENCES} sentences timed): every "
                f"engine in the runtimes' default setting ({labels[0]})",
            ]
            return "\n".join(lines)
        lines += [
            "",
            f"Solo calibration ({calibration['granularity']}): median ms per sentence over its "
            f"{calibration['sentences']} sentences in every setting, the chosen one in bold",
            "",
            "| system | " + " | ".join(labels) + " |",
            "|---|" + "---:|" * len(labels),
        ]
        for name, seconds in calibration["seconds"].items():
            chosen = Setting(**summary["chosen"][name]).label
            cells = [f"{1000 * seconds[label]:.1f}" for label in labels]
            cells = [f"**{cell}**" if label == chosen else cell for label, cell in zip(labels, cells)]
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
        return "\n".join(lines)

    def add_to(self, results: dict):
        """Put the pass into ``results.json``'s content: top-level ``solo`` and every row's ``solo`` dict (None for
        the rows not timed alone)."""
        results["solo"] = self.summary
        for row in results["rows"]:
            row["solo"] = self.rows.get(row["name"])


def run_solo(args, specs: List[RowSpec], num_sentences: int, warmup_ids, latency_ids, length_order) -> Solo:
    """The solo pass (module docstring) over the solo engines of ``specs`` (``SOLO_ROLES``), on the round-robin
    pass's sentences: batch 1 on ``latency_ids`` after ``warmup_ids``, batched on ``length_order``."""
    if not args.cpu and torch.cuda.is_available():
        raise BenchmarkError("--solo times CPU engines (OpenMP wait policy and threads): add --cpu or drop --solo")
    if not hasattr(signal, "SIGSTOP"):
        raise BenchmarkError("--solo stops the processes it is not timing (SIGSTOP): not on this platform")
    timed = len(latency_ids)
    # a run timing fewer sentences than the default calibration (a smoke run) is not calibrated: a few sentences
    # pick a setting by noise, and its processes would be most of the pass's time
    calibration_sentences = args.solo_calibration_sentences or (
        DEFAULT_CALIBRATION_SENTENCES if timed >= DEFAULT_CALIBRATION_SENTENCES else 0
    )
    if args.solo_calibration_sentences is not None and not 1 <= calibration_sentences <= timed:
        raise BenchmarkError(f"--solo-calibration-sentences must be between 1 and the {timed} timed sentences")
    engines = [spec for spec in specs if spec.role in SOLO_ROLES]
    anchor = next(k for k, spec in enumerate(engines) if spec.role == TEACHER_GREEDY)
    directory = os.path.join(args.out_dir, "solo")
    os.makedirs(directory, exist_ok=True)
    job = {"args": vars(args), "num_sentences": num_sentences}
    passes = [Pass(1, units_of(1, warmup_ids), interleaved_blocks(units_of(1, latency_ids), args.rounds))]
    if args.solo_batched:
        batches = units_of(args.batch_size, length_order)
        passes.append(Pass(args.batch_size, batches[:1], interleaved_blocks(batches, args.rounds)))
    wall, cpu = time.perf_counter(), process_cpu_seconds()
    if calibration_sentences:
        calibration_units = units_of(1, latency_ids[:calibration_sentences])
        calibration = calibrate(engines, settings(available_cores()), job, calibration_units, directory, args.seed)
    else:
        calibration = Calibration.default(engines, Setting(None, available_cores()))
    schedule = time_rounds(engines, anchor, calibration, job, passes, directory, args.seed)
    summary = {
        "protocol": "every engine alone in its own process, one process running at a time; per engine the "
        "setting (OMP_WAIT_POLICY, threads) of its fastest calibration; rounds of the round-robin pass's blocks, "
        "the engines shuffled every round (--seed); anchor: fairseq greedy",
        "engines": [spec.name for spec in engines],
        "rounds": args.rounds,
        "seed": args.seed,
        "batch_sizes": [p.batch_size for p in passes],
        **calibration.to_json(),
        **schedule.to_json(),
        "processes": len(calibration.processes) + len(engines),
        "wall_seconds": time.perf_counter() - wall,
        "orchestrator_cpu_seconds": process_cpu_seconds() - cpu,
    }
    rows = {spec.name: engine_row(k, schedule, calibration) for k, spec in enumerate(engines)}
    return Solo(summary, rows, schedule.outputs)


def process_cpu_seconds() -> float:
    """User + system CPU seconds of this process (not of its children)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


@dataclass
class Pass:
    """One batch size of the solo rounds: its warm-up units (decoded before every round's block, off the clock) and
    its blocks (one per round, :func:`.schedule.interleaved_blocks`)."""

    batch_size: int
    warmup: List[List[int]]
    blocks: List[List[List[int]]]

    def command(self, round_index: int) -> dict:
        """The pass as a child's command (:func:`time_engine`) in round ``round_index``."""
        return {"batch_size": self.batch_size, "warmup": self.warmup, "units": self.blocks[round_index]}


@dataclass
class Calibration:
    """Every engine's median seconds per calibration sentence in every setting (``seconds[name][label]``), the
    setting chosen for it, and the linear layout each thread count's first torch process chose
    (``LayoutChoice`` of engine/cpu_linear.py as JSON)."""

    settings: List[Setting]
    sentences: int
    seconds: Dict[str, Dict[str, float]]
    chosen: Dict[str, Setting]
    layouts: Dict[int, dict]
    processes: List[dict]  # per calibration process: family, setting, pid and seconds to start

    @classmethod
    def default(cls, engines: Sequence[RowSpec], setting: Setting) -> "Calibration":
        """No calibration: every engine in ``setting`` (the runtimes' default policy on every core), each torch
        process choosing its linear layout itself."""
        return cls([setting], 0, {}, {spec.name: setting for spec in engines}, {}, [])

    def environment(self, spec: RowSpec) -> Dict[str, str]:
        """The environment of ``spec``'s process: its setting, and the torch family's linear layout at its threads."""
        setting = self.chosen[spec.name]
        layout = self.layouts.get(setting.threads) if family(spec) == TORCH_FAMILY else None
        return setting.environment({"NAT_LINEAR_LAYOUT": layout["layout"]} if layout else {})

    def to_json(self) -> dict:
        return {
            "settings": [asdict(s) for s in self.settings],
            "calibration": {
                "granularity": "engine: each setting's process times every engine of its runtime family",
                "sentences": self.sentences,
                "seconds": self.seconds,
                "processes": self.processes,
            },
            "chosen": {name: asdict(setting) for name, setting in self.chosen.items()},
            "linear_layout": {str(threads): layout for threads, layout in self.layouts.items()},
        }


def job_of(job: dict, engines: Sequence[RowSpec], threads: int) -> dict:
    """The job file of a child that loads ``engines`` (one runtime family) at ``threads`` threads."""
    return {**job, "engines": [asdict(spec) for spec in engines], "family": family(engines[0]), "threads": threads}


def calibrate(engines, candidates, job, units, directory, seed) -> Calibration:
    """One process per runtime family and setting (in an order shuffled with ``seed``), each timing every engine of
    the family on ``units`` (sentences) after one untimed pass; each engine gets the setting of its least median
    seconds per sentence (one preempted sentence does not decide)."""
    rng = random.Random(seed)
    seconds = {spec.name: {} for spec in engines}
    layouts, processes = {}, []
    families = [name for name in (TORCH_FAMILY, CT2_FAMILY) if any(family(spec) == name for spec in engines)]
    started = time.perf_counter()
    for name in families:
        members = [spec for spec in engines if family(spec) == name]
        for setting in rng.sample(candidates, len(candidates)):
            what = f"each engine alone, calibration: {name} at {setting.label}"
            done, total = len(processes), len(families) * len(candidates)
            logger.info(progress_line(what, done, total, time.perf_counter() - started))
            child = Child(
                job_of(job, members, setting.threads),
                setting.environment({}),
                directory,
                f"calibrate-{name}-{len(processes)}",
            )
            try:
                answer = child.run([{"batch_size": 1, "warmup": units, "units": units}])
                child.close()
            finally:
                child.kill()
            processes.append({"family": name, "setting": setting.label, "pid": answer["pid"]})
            processes[-1]["start_seconds"] = child.start_seconds
            for engine in answer["engines"]:
                seconds[engine["name"]][setting.label] = statistics.median(engine["seconds"][0])
            if answer["linear_layout"] is not None:
                layouts.setdefault(setting.threads, answer["linear_layout"])
    by_label = {setting.label: setting for setting in candidates}
    chosen = {name: by_label[min(times, key=times.get)] for name, times in seconds.items()}
    return Calibration(candidates, sum(map(len, units)), seconds, chosen, layouts, processes)


@dataclass
class SoloSchedule:
    """The timings of the solo rounds: one :class:`.schedule.Rounds` per batch size (``seconds[engine][round]`` per
    unit, ``order`` the engines in the order timed), what each engine's process reported, and its hypotheses."""

    names: List[str]
    timed: List[Rounds]
    # per engine: pid, OMP_WAIT_POLICY, OMP_NUM_THREADS and threads as the child saw them, its linear layout, the
    # seconds it took to start
    processes: List[dict]
    outputs: Dict[str, Dict[int, Dict[int, SoloOutput]]]

    def to_json(self) -> dict:
        return {
            "order": [[self.names[k] for k in order] for order in self.timed[0].order],
            "per_round_seconds": {
                name: {str(timed.batch_size): timed.totals(k) for timed in self.timed}
                for k, name in enumerate(self.names)
            },
            "anchor": self.names[self.timed[0].anchor],
            "anchor_drift": {str(timed.batch_size): timed.drift for timed in self.timed},
            "engine_processes": dict(zip(self.names, self.processes)),
        }


def time_rounds(engines, anchor, calibration: Calibration, job, passes: List[Pass], directory, seed) -> SoloSchedule:
    """One process per engine in its chosen setting, launched one at a time; ``len(blocks)`` rounds, each timing
    every engine on the round's block of every pass, the engines in the round's order of
    :func:`.schedule.round_orders` (seeded with ``seed``); the anchor re-times block 0 at the end."""
    rounds = len(passes[0].blocks)
    orders = round_orders(len(engines), rounds, seed, passes[0].batch_size)
    children = []
    try:
        for k, spec in enumerate(engines):
            setting = calibration.chosen[spec.name]
            job_k = job_of(job, [spec], setting.threads)
            children.append(Child(job_k, calibration.environment(spec), directory, f"engine-{k}"))
        seconds = [[[None] * rounds for _ in engines] for _ in passes]
        outputs, processes = {spec.name: {} for spec in engines}, [None] * len(engines)
        started = time.perf_counter()
        for r, order in enumerate(orders):
            for position, k in enumerate(order):
                answer = children[k].run([p.command(r) for p in passes])
                what, done = (
                    f"each engine alone, round {r + 1} of {rounds}: {engines[k].name}",
                    r * len(order) + position,
                )
                logger.info(progress_line(what, done + 1, rounds * len(order), time.perf_counter() - started))
                (engine,) = answer["engines"]
                for p, unit_seconds in enumerate(engine["seconds"]):
                    seconds[p][k][r] = unit_seconds
                for size, by_sentence in engine["outputs"].items():
                    kept = outputs[engines[k].name].setdefault(int(size), {})
                    kept.update(
                        {int(i): SoloOutput(text, ids and tuple(ids)) for i, (text, ids) in by_sentence.items()}
                    )
                processes[k] = {key: answer[key] for key in ("pid", "omp_wait_policy", "omp_num_threads", "threads")}
                processes[k].update(linear_layout=engine["linear_layout"], start_seconds=children[k].start_seconds)
        (end,) = children[anchor].run([p.command(0) for p in passes])["engines"]
        for child in children:
            child.close()
    finally:
        for child in children:
            child.kill()
    timed = [
        Rounds(p.batch_size, p.blocks, seconds[i], orders, anchor, sum(end["seconds"][i])) for i, p in enumerate(passes)
    ]
    return SoloSchedule([spec.name for spec in engines], timed, processes, outputs)


def ratio_summary(ratios: List[float], prefix: str) -> dict:
    """The median over rounds of per-round paired ratios, every round's, their min and max, and the flag."""
    return {
        f"{prefix}_speedup_vs_ar_greedy": statistics.median(ratios),
        f"{prefix}_ratio_rounds": ratios,
        f"{prefix}_ratio_min": min(ratios),
        f"{prefix}_ratio_max": max(ratios),
        f"{prefix}_ratio_spread": spread(ratios),
        f"{prefix}_unsettled": unsettled(ratios),
    }


def engine_row(k: int, schedule: SoloSchedule, calibration: Calibration) -> dict:
    """Engine ``k``'s ``solo`` dict of ``results.json``: its ratios to fairseq greedy (batch 1 and, when timed,
    batched), ms per sentence, and the setting, layout and process it ran in."""
    ones = schedule.timed[0]
    per_sentence = [1000 * seconds / n for seconds, n in zip(ones.totals(k), ones.sentences())]
    process = schedule.processes[k]
    row = {
        **ratio_summary(ones.ratios(k), "latency"),
        "ms_per_sentence": statistics.median(per_sentence),
        "omp_wait_policy": process["omp_wait_policy"],
        "threads": process["threads"],
        "linear_layout": process["linear_layout"],
        "pid": process["pid"],
        "setting": calibration.chosen[schedule.names[k]].label,
    }
    for batched in schedule.timed[1:]:
        rates = [n / seconds for n, seconds in zip(batched.sentences(), batched.totals(k))]
        row.update(ratio_summary(batched.ratios(k), "throughput"), sent_per_s=statistics.median(rates))
    return row


# ----- the child process -----------------------------------------------------------------------------------------


def load_engines(args, specs: List[RowSpec], threads: int, num_sentences: int):
    """The runners of ``specs`` (one runtime family) as the round-robin pass loads them: :class:`.measure.FairseqRunner`
    at ``threads`` torch threads, or CTranslate2 translators at ``threads`` intra-op threads (torch at 1 thread)."""
    if family(specs[0]) == CT2_FAMILY:
        torch.set_num_threads(1)  # torch only collates here: no second OpenMP team beside CTranslate2's
        anchor = teacher_specs(args.teacher, args.teacher_beam)[1]
        task, dataset = load_split(generation_cfg(args, anchor, False), anchor.name)
        return ctranslate2_runners(args, specs, task, dataset, False, threads)
    torch.set_num_threads(threads)
    return [FairseqRunner(spec, generation_cfg(args, spec, False), args.seed, num_sentences) for spec in specs]


def engine_layout(runner) -> Optional[str]:
    """The CPU linear layout a runner's models compute in (None: CTranslate2's own)."""
    generation = getattr(getattr(runner, "decoder", None), "generation", None)
    if generation is None:
        return None
    swapped = any(type(m) is WeightFirstLinear for model in generation.models for m in model.modules())
    return linear_layout_choice().layout if swapped else FAIRSEQ_LAYOUT


def time_engine(runner, passes: List[dict]) -> dict:
    """Every pass of a command: its warm-up units decoded off the clock, then its units timed
    (:func:`.schedule.time_unit`); every timed sentence's hypothesis kept, by batch size: its text and its token ids
    (None where the engine does not give them)."""
    seconds, outputs = [], {}
    for p in passes:
        for unit in p["warmup"]:
            runner.decode(runner.inputs(unit))
        seconds.append([time_unit(runner, unit, time.perf_counter) for unit in p["units"]])
        kept = {i: runner.outputs[i] for unit in p["units"] for i in unit}
        outputs[str(p["batch_size"])] = {i: [out.text, out.ids and list(out.ids)] for i, out in kept.items()}
        runner.outputs = {}
    return {"name": runner.spec.name, "seconds": seconds, "outputs": outputs, "linear_layout": engine_layout(runner)}


def child_main(job_file: str):
    """A solo process: load the job's engines, stop; then per command on stdin time them, answer, stop."""
    logging.basicConfig(level=os.environ.get("LOGLEVEL", "WARNING").upper(), stream=sys.stderr)
    with open(job_file, encoding="utf-8") as f:
        job = json.load(f)
    args = argparse.Namespace(**job["args"])
    specs = [RowSpec(**spec) for spec in job["engines"]]
    runners = load_engines(args, specs, job["threads"], job["num_sentences"])
    os.kill(os.getpid(), signal.SIGSTOP)
    for line in sys.stdin:
        command = json.loads(line)
        engines = [time_engine(runner, command["passes"]) for runner in runners]
        answer = {  # the process and its setting as it sees them
            "pid": os.getpid(),
            "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
            "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
            # torch's threads, or the intra-op threads CTranslate2 was given
            "threads": torch.get_num_threads() if job["family"] == TORCH_FAMILY else job["threads"],
            "engines": engines,
            "linear_layout": linear_layout_choice().to_json() if STATE.model_shapes else None,
        }
        with open(command["out"], "w", encoding="utf-8") as f:
            json.dump(answer, f)
        os.kill(os.getpid(), signal.SIGSTOP)


if __name__ == "__main__":
    child_main(sys.argv[1])
