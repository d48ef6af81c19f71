"""Summarise benchmark runs: results/summary.md (tables) and results/*.png (learning curves).

Reads what the runs wrote (eval.csv, args.json, tensorboard events) and re-runs nothing. The
layout is the one benchmark.sh writes:

    RUNS/<suite>/<config>/<task>/seed<N>/       the script's run dir (--run-dir)
    RUNS/<suite>/<config>/<task>/seed<N>.log    its stdout and stderr
    RUNS/<suite>/<config>/<task>/seed<N>.exit   its exit status, written when it ended

<config> is the algorithm and variant (e.g. dqn, dqn-no-per, sac), <task> the env id or the
dataset name. A run is "crashed" when its exit status is non-zero, "unfinished" when it has no
exit status and no final model (killed, or still running); such runs are listed, never dropped
silently, and left out of the statistics.

Per (suite, config, task) the table gives: the final evaluation (the last row of eval.csv: the
evaluation every script runs when it ends) as mean +- std over seeds with a 95% percentile
bootstrap CI of that mean (10,000 resamples), and beside it each run's best evaluation as mean
+- std over seeds; the BC normalised score where there is one; steps
(env steps, or SGD updates for BC) to the first evaluation at or above the task's threshold;
env steps/s end to end (last logged step over the wall time of the event file, evaluations
included) and while learning (median over the log windows that did SGD updates), and the median
SGD updates/s over those windows.

    python benchmark/benchmark_summary.py [--runs runs/bench] [--out results]

matplotlib is optional (pip install matplotlib): without it the tables are still written.
"""

from __future__ import annotations

import argparse
import csv
import glob
import json
import os
import platform
import re
import statistics
import sys
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import numpy as np

# Return thresholds for "steps to threshold": gymnasium's EnvSpec.reward_threshold where it has
# one; Pendulum-v1 has none, so it gets the -200 bar the SAC issue set. BC runs are measured on
# the normalised score instead (90 = 90% of the way from a random to the dataset policy).
RETURN_THRESHOLDS = {
    "CartPole-v1": 475.0,
    "Acrobot-v1": -100.0,
    "MountainCar-v0": -110.0,
    "LunarLander-v3": 200.0,
    "Pendulum-v1": -200.0,
    "HalfCheetah-v5": 4800.0,
    "Hopper-v5": 3800.0,
    "Ant-v5": 6000.0,
}  # Walker2d-v5 has none
NORMALIZED_SCORE_THRESHOLD = 90.0
BOOTSTRAP_SAMPLES = 10_000


@dataclass
class Run:
    suite: str
    config: str
    task: str
    seed: str
    path: str  # the run dir (may not exist if the script failed early)
    status: str  # "ok", "crashed (exit N)" or "unfinished"
    env_id: Optional[str] = None
    curve: List[Tuple[int, float]] = field(default_factory=list)  # (step, eval mean)
    normalized: List[float] = field(default_factory=list)  # BC: normalised score per eval
    env_sps: Optional[float] = None
    learning_sps: Optional[float] = None
    updates_per_second: Optional[float] = None
    wall_seconds: Optional[float] = None  # the time the run's processes ran (event files)
    train_last100: Optional[float] = None  # mean return of its last 100 training episodes
    apex: Dict[str, float] = field(default_factory=dict)  # Ape-X: medians of its perf tags over log windows

    @property
    def final(self) -> Optional[float]:
        return self.curve[-1][1] if self.curve else None

    def threshold(self) -> Tuple[Optional[float], str]:
        if self.normalized:
            return NORMALIZED_SCORE_THRESHOLD, "normalised score"
        return RETURN_THRESHOLDS.get(self.env_id or ""), "return"

    def steps_to_threshold(self) -> Optional[int]:
        bar, _ = self.threshold()
        if bar is None:
            return None
        values = self.normalized or [v for _, v in self.curve]
        return next((step for (step, _), v in zip(self.curve, values) if v >= bar), None)


def read_eval_csv(path: str) -> Tuple[List[Tuple[int, float]], List[float]]:
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    curve = [(int(float(r["step"])), float(r["mean"])) for r in rows]
    normalized = [float(r["normalized_score"]) for r in rows if r.get("normalized_score") not in (None, "")]
    return curve, normalized if len(normalized) == len(rows) else []


def read_throughput(run_dir: str) -> Tuple[Optional[float], Optional[float], Optional[float], Optional[float]]:
    """(env steps/s end to end, median env steps/s over the log windows that did SGD updates,
    median SGD updates/s over those windows, wall seconds), from the run's tensorboard event files."""
    files = sorted(glob.glob(os.path.join(run_dir, "events.out.tfevents.*")))
    if not files:
        return None, None, None, None
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    last_step, elapsed, learning_sps, ups = None, 0.0, [], []
    # A resumed run has one event file per process: its steps over the time the processes ran,
    # not counting the gap between them.
    for path in files:
        acc = EventAccumulator(path, size_guidance={"scalars": 0})
        acc.Reload()
        tags = acc.Tags()["scalars"]
        sps = {e.step: e.value for e in acc.Scalars("charts/SPS")} if "charts/SPS" in tags else {}
        if sps:
            last = acc.Scalars("charts/SPS")[-1]
            last_step, elapsed = last.step, elapsed + last.wall_time - acc.FirstEventTimestamp()
        for e in acc.Scalars("perf/updates_per_second") if "perf/updates_per_second" in tags else []:
            if e.value > 0:
                ups.append(e.value)
                if e.step in sps:
                    learning_sps.append(sps[e.step])

    def median(xs):
        return statistics.median(xs) if xs else None

    env_sps = last_step / elapsed if last_step is not None and elapsed > 0 else None
    return env_sps, median(learning_sps), median(ups), (elapsed if elapsed > 0 else None)


def read_last_training_returns(run_dir: str, last: int = 100) -> Optional[float]:
    """Mean charts/episodic_return of the run's last `last` training episodes (the MinAtar paper's
    measure); a resumed run's earlier event files count up to the step the next one starts from."""
    files = sorted(glob.glob(os.path.join(run_dir, "events.out.tfevents.*")))
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    per_file = []
    for path in files:
        acc = EventAccumulator(path, size_guidance={"scalars": 0})
        acc.Reload()
        if "charts/episodic_return" in acc.Tags()["scalars"]:
            per_file.append([(e.step, e.value) for e in acc.Scalars("charts/episodic_return")])
    returns = []
    for i, events in enumerate(per_file):
        resumed_at = per_file[i + 1][0][0] if i + 1 < len(per_file) and per_file[i + 1] else None
        returns += [v for step, v in events if resumed_at is None or step < resumed_at]
    return float(np.mean(returns[-last:])) if returns else None


APEX_TAGS = ("perf/learner_wait_fraction", "perf/replay_ratio", "apex/param_lag", "apex/actor_restarts")


def read_medians(run_dir: str, tags) -> Dict[str, float]:
    """The median over log windows of each of `tags` that the run's event files hold."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    values: Dict[str, List[float]] = {}
    for path in sorted(glob.glob(os.path.join(run_dir, "events.out.tfevents.*"))):
        acc = EventAccumulator(path, size_guidance={"scalars": 0})
        acc.Reload()
        for tag in set(tags) & set(acc.Tags()["scalars"]):
            values.setdefault(tag, []).extend(e.value for e in acc.Scalars(tag))
    return {tag: statistics.median(v) for tag, v in values.items() if v}


def exit_status(stem: str) -> Optional[int]:
    try:
        with open(stem + ".exit") as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def load_run(stem: str, root: str) -> Run:
    """stem = ROOT/<suite>/<config>/<task>/seed<N> (the run dir, without .log/.exit)."""
    suite, config, task, seed = os.path.relpath(stem, root).split(os.sep)
    code = exit_status(stem)
    finished = code == 0 or (code is None and os.path.exists(os.path.join(stem, "model.npz")))
    status = "ok" if finished else ("unfinished" if code is None else f"crashed (exit {code})")
    run = Run(suite, config, task, seed.replace("seed", ""), stem, status)
    eval_csv = os.path.join(stem, "eval.csv")
    if status == "ok" and not os.path.exists(eval_csv):
        run.status = "crashed (no eval.csv)"
    if run.status != "ok":
        return run
    run.curve, run.normalized = read_eval_csv(eval_csv)
    if not run.curve:
        run.status = "crashed (empty eval.csv)"
        return run
    try:
        with open(os.path.join(stem, "args.json")) as f:
            saved = json.load(f)
        run.env_id = saved.get("args", saved).get("env_id")  # the scripts nest the flags under "args"
    except (OSError, ValueError):
        pass
    run.env_sps, run.learning_sps, run.updates_per_second, run.wall_seconds = read_throughput(stem)
    if suite == "minatar":
        run.train_last100 = read_last_training_returns(stem)
    if suite == "apex":
        run.apex = read_medians(stem, APEX_TAGS)
    return run


def discover(root: str) -> List[Run]:
    stems = set()
    for pattern in ("seed*", "seed*.log", "seed*.exit"):
        for path in glob.glob(os.path.join(root, "*", "*", "*", pattern)):
            stem = path
            for suffix in (".log", ".exit"):
                stem = stem[: -len(suffix)] if stem.endswith(suffix) else stem
            stems.add(stem)

    def order(stem):  # by suite, config, task, then seed as a number (seed2 before seed10)
        *names, seed = os.path.relpath(stem, root).split(os.sep)
        return names, int(re.sub(r"\D", "", seed) or 0)

    return [load_run(stem, root) for stem in sorted(stems, key=order)]


def bootstrap_ci(values: List[float], rng: np.random.Generator) -> Tuple[float, float]:
    """95% percentile-bootstrap interval of the mean over seeds."""
    x = np.asarray(values, dtype=np.float64)
    means = x[rng.integers(0, len(x), size=(BOOTSTRAP_SAMPLES, len(x)))].mean(axis=1)
    return float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))


def summarise_group(runs: List[Run]) -> Dict[str, object]:
    ok = [r for r in runs if r.status == "ok"]
    finals = [r.final for r in ok]
    out: Dict[str, object] = {
        "seeds": len(runs),
        "ok": len(ok),
        "failed": [(r.seed, r.status) for r in runs if r.status != "ok"],
    }
    if not ok:
        return out
    out["final_mean"] = float(np.mean(finals))
    out["final_std"] = float(np.std(finals))
    out["final_ci"] = bootstrap_ci(finals, np.random.default_rng(0))  # same runs, same interval
    best = [max(v for _, v in r.curve) for r in ok]  # the best evaluation of each run, beside its last
    out["best_mean"], out["best_std"] = float(np.mean(best)), float(np.std(best))
    if all(r.normalized for r in ok):
        out["normalized_mean"] = float(np.mean([r.normalized[-1] for r in ok]))
    bar, kind = ok[0].threshold()
    if bar is not None:
        hits = [r.steps_to_threshold() for r in ok]
        reached = [h for h in hits if h is not None]
        out["threshold"] = (bar, kind)
        out["reached"] = len(reached)
        out["steps_to_threshold"] = statistics.median(reached) if reached else None
    for name in ("env_sps", "learning_sps", "updates_per_second"):
        values = [getattr(r, name) for r in ok if getattr(r, name) is not None]
        out[name] = statistics.median(values) if values else None
    return out


def fmt(x: Optional[float], digits: int = 1) -> str:
    return "-" if x is None else f"{x:,.{digits}f}"


# The MinAtar paper's DQN at 5M frames (Young & Tian 2019, arXiv:1903.03176), read off
# its learning curves: approximate, about +-0.5 (+-2 for Space Invaders). Its Seaquest predates
# MinAtar 1.0.11's oxygen fix.
MINATAR_PAPER_DQN = {
    "Breakout": "~9-10",
    "SpaceInvaders": "~45",
    "Freeway": "~50",
    "Asterix": "~12-17",
    "Seaquest": "~16-20",
}


def minatar_table(groups: Dict[Tuple[str, str], List[Run]]) -> List[str]:
    """MinAtar reported as its paper does (training episodes at epsilon 0.1, the mean of the last
    100 of each run), beside the greedy evaluation, the paper's DQN, and the cost of a run."""
    lines = [
        "| config | game | training return, last 100 episodes (mean ± std over seeds) | greedy eval "
        "(mean ± std) | the paper's DQN | env steps/s | wall per run (median) | runs ok |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for (config, task), runs in sorted(groups.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        ok = [r for r in runs if r.status == "ok"]
        train = [r.train_last100 for r in ok if r.train_last100 is not None]
        final = [r.final for r in ok]
        walls = [r.wall_seconds for r in ok if r.wall_seconds is not None]
        sps = [r.env_sps for r in ok if r.env_sps is not None]
        row = [
            f"{np.mean(train):.1f} ± {np.std(train):.1f}" if train else "-",
            f"{np.mean(final):.1f} ± {np.std(final):.1f}" if final else "-",
            MINATAR_PAPER_DQN.get(task, "-"),
            fmt(statistics.median(sps), 0) if sps else "-",
            f"{statistics.median(walls) / 3600:.1f} h" if walls else "-",
        ]
        lines.append(f"| {config} | {task} | " + " | ".join(row) + f" | {len(ok)}/{len(runs)} |")
    return lines


def apex_table(groups: Dict[Tuple[str, str], List[Run]]) -> List[str]:
    """Ape-X against the number of actors, beside dqn_prioritized.py on the same task: medians over
    seeds of each run's whole-run env steps/s and of its log windows' updates/s, learner wait
    fraction (time waiting for a batch over learning time), replay ratio and parameter lag."""
    lines = [
        "| config | task | final eval (mean ± std) | env steps/s | updates/s | learner wait fraction "
        "| replay ratio (samples per env step) | parameter lag (SGD steps) | wall per run | runs ok |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]

    def median(values):
        values = [v for v in values if v is not None]
        return statistics.median(values) if values else None

    for (config, task), runs in sorted(groups.items()):
        ok = [r for r in runs if r.status == "ok"]
        final = [r.final for r in ok]
        row = [
            f"{np.mean(final):.1f} ± {np.std(final):.1f}" if final else "-",
            fmt(median(r.env_sps for r in ok), 0),
            fmt(median(r.updates_per_second for r in ok), 0),
            fmt(median(r.apex.get("perf/learner_wait_fraction") for r in ok), 3),
            fmt(median(r.apex.get("perf/replay_ratio") for r in ok), 1),
            fmt(median(r.apex.get("apex/param_lag") for r in ok), 0),
            fmt(median(r.wall_seconds for r in ok), 1) + " s" if ok else "-",
        ]
        lines.append(f"| {config} | {task} | " + " | ".join(row) + f" | {len(ok)}/{len(runs)} |")
    return lines


def table(suite: str, groups: Dict[Tuple[str, str], List[Run]]) -> List[str]:
    lines = [
        "| config | task | final eval (mean ± std) | 95% CI | best eval (mean ± std) | norm. score | steps to "
        "threshold (median, reached) | env steps/s (end to end / learning) | updates/s | runs ok |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    notes = []
    # Algorithm first, then task, then variant: an ablation's variants sit next to each other.
    ordered = sorted(groups.items(), key=lambda kv: (kv[0][0].split("-")[0], kv[0][1], kv[0][0]))
    for (config, task), runs in ordered:
        s = summarise_group(runs)
        if s["ok"]:
            final = f"{s['final_mean']:.1f} ± {s['final_std']:.1f}"
            ci = f"[{s['final_ci'][0]:.1f}, {s['final_ci'][1]:.1f}]"
            if "threshold" in s:
                bar, kind = s["threshold"]
                steps = fmt(s["steps_to_threshold"], 0) if s["reached"] else "not reached"
                thr = f"{steps} ({s['reached']}/{s['ok']} reach {kind} {bar:g})"
            else:
                thr = "-"
            sps = "-" if s["env_sps"] is None else f"{fmt(s['env_sps'], 0)} / {fmt(s['learning_sps'], 0)}"
            best = f"{s['best_mean']:.1f} ± {s['best_std']:.1f}"
            row = [final, ci, best, fmt(s.get("normalized_mean")), thr, sps, fmt(s["updates_per_second"], 0)]
        else:
            row = ["no finished run", "-", "-", "-", "-", "-", "-"]
        lines.append(f"| {config} | {task} | " + " | ".join(row) + f" | {s['ok']}/{s['seeds']} |")
        for seed, status in s["failed"]:
            notes.append(
                f"- {config} / {task} / seed {seed}: **{status}**, see "
                f"`{os.path.join(suite, config, task, 'seed' + seed)}.log`"
            )
    return lines + ([""] + notes if notes else [])


def plot(suite: str, task: str, groups: Dict[str, List[Run]], out_dir: str) -> Optional[str]:
    """Mean eval curve per config over the seeds that finished, band = +- one std over seeds."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(5, 3.4))
    drawn = False
    for config, runs in groups.items():
        ok = [r for r in runs if r.status == "ok"]
        if not ok:
            continue
        curves = [dict(r.curve) for r in ok]
        steps = sorted(set.intersection(*map(set, curves)))  # evaluated by every seed
        values = np.array([[curve[s] for s in steps] for curve in curves])
        shortest = min(len(r.curve) for r in ok)
        if len(steps) < shortest:
            # Evaluations at steps that differ between seeds (Ape-X counts env steps by whole
            # chunks): the i-th evaluations of the seeds together, at the mean of their steps.
            steps = [float(np.mean([r.curve[i][0] for r in ok])) for i in range(shortest)]
            values = np.array([[v for _, v in r.curve[:shortest]] for r in ok])
        if not steps:
            continue
        mean, std = values.mean(axis=0), values.std(axis=0)
        ax.plot(steps, mean, label=f"{config} ({len(ok)} seeds)")
        ax.fill_between(steps, mean - std, mean + std, alpha=0.2)
        drawn = True
    if not drawn:
        plt.close(fig)
        return None
    is_bc = all(r.normalized for runs in groups.values() for r in runs if r.status == "ok")
    ax.set_xlabel("SGD updates" if is_bc else "env steps")
    ax.set_ylabel("eval return")
    ax.set_title(f"{suite}: {task}")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    name = f"{suite}_{task}.png".replace("/", "_")
    fig.savefig(os.path.join(out_dir, name), dpi=100)
    plt.close(fig)
    return name


def machine() -> str:
    model = platform.processor() or "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            model = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{model}, {os.cpu_count()} cores visible, Python {platform.python_version()}"


def describe_bc_pipeline(p: dict) -> List[str]:
    return [
        f"BC pipeline efficiency ({p['dataset']}, {p['updates_per_call']} x {p['batch_size']} per "
        f"call): {p['efficiency']:.3f} (median over {len(p['ratios'])} repeats); "
        f"{p['updates_per_second_pipeline']:,.0f} updates/s through cpprb + prefetch vs "
        f"{p['updates_per_second_resident']:,.0f} on device-resident batches.",
        "",
    ]


def describe_replay_memory(rows: List[dict]) -> List[str]:
    return (
        ["| replay layout | capacity | RSS | RSS per transition | arrays per transition |", "|---|---:|---:|---:|---:|"]
        + [
            f"| {m['layout']}{' (%d channels)' % m['channels'] if 'channels' in m else ''} | {m['capacity']:,} | "
            f"{m['rss_bytes'] / 2**30:.2f} GiB | "
            f"{m['rss_bytes_per_transition']:,.0f} B | {m['array_bytes_per_transition']:,.0f} B |"
            for m in rows
        ]
        + [""]
    )


def describe_prefetch(p: dict) -> List[str]:
    return [
        f"DQN on pixels, prefetch on vs off ({p['device']}, {p['updates_per_call']} x "
        f"{p['batch_size']} per call): {p['updates_per_second_prefetch_on']:,.1f} vs "
        f"{p['updates_per_second_prefetch_off']:,.1f} updates/s (ratio {p['ratio_on_over_off']:.2f}, "
        f"median over {len(p['on'])} repeats); sampling + device_put "
        f"{p['sample_and_put_ms_per_call']:,.0f} ms per call.",
        "",
    ]


def describe_replay_placement(p: dict) -> List[str]:
    lines = [
        f"Where Ape-X's replay lives ({p['date']}, Ray {p['ray']}; median per call):",
        "",
        "| rows | sample K x B: in the learner | a Ray actor | add a 50-row chunk: in the learner | a Ray actor |",
        "|---|---:|---:|---:|---:|",
    ]
    for r in p["results"]:
        lines.append(
            f"| {r['case']} | {r['sample_in_learner_us'] / 1000:.2f} ms ({r['K']} x {r['B']}) | "
            f"{r['sample_ray_actor_us'] / 1000:.2f} ms | {r['add_in_learner_us'] / 1000:.2f} ms | "
            f"{r['add_ray_actor_us'] / 1000:.2f} ms |"
        )
    return lines + [""]


def describe_costs(p: dict) -> List[str]:
    lines = [
        f"One Ape-X actor and one learner update alone ({p['date']}, {p['device']}), and the actors a "
        "learner keeps up with at a replay ratio R (a projection):",
        "",
        "| task | one actor, env steps/s | learner updates/s (batch) | R | actors |",
        "|---|---:|---:|---:|---:|",
    ]
    for r in p["results"]:
        lines.append(
            f"| {r['env_id']} | {r['actor_env_steps_per_s']:,.0f} | {r['learner_updates_per_s']:,.1f} "
            f"({r['batch_size']}) | {r['replay_ratio']} | {r['actors_the_learner_keeps_up_with']:.2f} |"
        )
    return lines + [""]


# Files that benchmark.sh writes into a suite's folder besides the runs (speed; atari; apex).
SIDE_FILES = {
    "replay-placement.json": describe_replay_placement,
    "costs.json": describe_costs,
    "bc-pipeline.json": describe_bc_pipeline,
    "replay-memory.jsonl": describe_replay_memory,
    "prefetch.json": describe_prefetch,
}


def write_summary(root: str, out_dir: str) -> str:
    runs = discover(root)
    if not runs:
        raise SystemExit(
            f"benchmark/benchmark_summary.py: error: no runs under {root} (expected <suite>/<config>/<task>/seed<N>)"
        )
    os.makedirs(out_dir, exist_ok=True)
    lines = [
        "# Benchmark summary",
        "",
        f"Made by `benchmark/benchmark_summary.py` from the runs under `{root}`; machine: {machine()}.",
        "Final eval = the evaluation at the end of each run; ± is the std over seeds; the CI is a "
        "95% bootstrap interval of the mean over seeds. Plots: mean over seeds, band ± one std.",
        "",
    ]
    for suite in sorted({r.suite for r in runs}):
        in_suite = [r for r in runs if r.suite == suite]
        groups: Dict[Tuple[str, str], List[Run]] = {}
        for r in in_suite:
            groups.setdefault((r.config, r.task), []).append(r)
        tables = {"minatar": minatar_table, "apex": apex_table}
        lines += [f"## {suite}", ""] + (tables[suite](groups) if suite in tables else table(suite, groups)) + [""]
        for name, describe in SIDE_FILES.items():  # measurements benchmark.sh writes beside the runs
            path = os.path.join(root, suite, name)
            if os.path.exists(path):
                with open(path) as f:
                    lines += describe([json.loads(line) for line in f] if name.endswith(".jsonl") else json.load(f))
        for task in dict.fromkeys(r.task for r in in_suite):
            by_config = {c: rs for (c, t), rs in groups.items() if t == task}
            name = plot(suite, task, by_config, out_dir)
            if name:
                lines += [f"![{suite} {task}]({name})", ""]
    path = os.path.join(out_dir, "summary.md")
    with open(path, "w") as f:
        f.write("\n".join(lines))
    return path


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", default="runs/bench", help="root of the benchmark runs")
    parser.add_argument("--out", default="results", help="where summary.md and the plots go")
    args = parser.parse_args(argv)
    if not os.path.isdir(args.runs):
        raise SystemExit(f"benchmark/benchmark_summary.py: error: {args.runs} is not a directory")
    print(write_summary(args.runs, args.out))


if __name__ == "__main__":
    sys.exit(main())
