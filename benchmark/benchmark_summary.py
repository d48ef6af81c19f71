"""Summarise benchmark runs: results/summary.md (tables) and results/*.png (learning curves).

Reads ./benchmark.sh's RUNS/<mode>/<config>/<task>/seed<N>{/,.log,.exit} and re-runs nothing; a crashed or
unfinished run is listed, not counted. Per (mode, config, task): the final evaluation (mean +- std, 95%
bootstrap CI), the best, BC's normalised score, steps to the task's threshold, env steps/s and updates/s.

    python benchmark/benchmark_summary.py [--runs runs/bench] [--out results]

matplotlib is optional: without it the tables are still written.
"""

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

import gymnasium
import numpy as np

# The MinAtar paper's DQN, 30 seeds, -v0: the moving average of 100 training returns at 1M and 5M frames (env
# steps), read off the DQN curve of kenjyoung/MinAtar's README figure img/learning_curves.gif.
MINATAR_PAPER_DQN = dict(
    Asterix=(10, 17), Breakout=(9.3, 10), Freeway=(48, 50), Seaquest=(1, 20), SpaceInvaders=(33, 43)
)
NORMALIZED_SCORE_THRESHOLD = 90.0  # BC: 90% of the way from a random policy to the data's
BOOTSTRAP_SAMPLES = 10_000
APEX_TAGS = ("perf/learner_wait_fraction", "perf/replay_ratio", "apex/param_lag", "apex/actor_restarts")


@dataclass
class Run:
    suite: str
    config: str
    task: str
    seed: str
    path: str  # the run dir (may not exist if the script failed early)
    status: str  # "ok", "crashed (...)" or "unfinished"
    env_id: Optional[str] = None
    curve: List[Tuple[int, float]] = field(default_factory=list)  # (step, eval mean)
    normalized: List[float] = field(default_factory=list)  # BC: normalised score per eval
    env_sps: Optional[float] = None
    learning_sps: Optional[float] = None
    updates_per_second: Optional[float] = None
    wall_seconds: Optional[float] = None  # the time the run's processes ran (event files)
    apex: Dict[str, float] = field(default_factory=dict)  # Ape-X: medians of APEX_TAGS over log windows
    budget: Optional[int] = None  # --total-timesteps
    training: Optional[float] = None  # MinAtar: the paper's metric, training_return() at the budget

    @property
    def final(self) -> Optional[float]:
        return self.curve[-1][1] if self.curve else None

    def threshold(self) -> Tuple[Optional[float], str]:
        if self.normalized:
            return NORMALIZED_SCORE_THRESHOLD, "normalised score"
        if self.env_id == "Pendulum-v1":
            return -200.0, "return"  # gymnasium's reward_threshold has none: the SAC issue's bar
        try:
            return gymnasium.spec(self.env_id or "").reward_threshold, "return"
        except gymnasium.error.Error:
            return None, "return"

    def steps_to_threshold(self) -> Optional[int]:
        bar, _ = self.threshold()
        if bar is None:
            return None
        values = self.normalized or [v for _, v in self.curve]
        return next((step for (step, _), v in zip(self.curve, values) if v >= bar), None)


def median(values) -> Optional[float]:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def event_files(folder: str) -> list:
    """The tensorboard event files under folder, however deep, loaded (a resumed run has one per process)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    loaded = []
    for path in sorted(glob.glob(os.path.join(folder, "**", "events.out.tfevents.*"), recursive=True)):
        acc = EventAccumulator(path, size_guidance={"scalars": 0})
        acc.Reload()
        loaded.append(acc)
    return loaded


def tag_events(acc, tag: str) -> List[Tuple[int, float, float]]:
    """(step, wall time, value) of each event of one tag in one loaded event file."""
    return [(e.step, e.wall_time, e.value) for e in acc.Scalars(tag)] if tag in acc.Tags()["scalars"] else []


def scalars(folder: str, tag: str) -> List[Tuple[int, float, float]]:
    """(step, wall time, value) of one tag in every event file under folder, in step order."""
    return sorted(e for acc in event_files(folder) for e in tag_events(acc, tag))


def read_eval_csv(path: str) -> Tuple[List[Tuple[int, float]], List[float]]:
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    curve = [(int(float(r["step"])), float(r["mean"])) for r in rows]
    normalized = [float(r["normalized_score"]) for r in rows if r.get("normalized_score") not in (None, "")]
    return curve, normalized if len(normalized) == len(rows) else []


def read_throughput(run_dir: str) -> Tuple[Optional[float], Optional[float], Optional[float], Optional[float]]:
    """(env steps/s end to end, median env steps/s over the log windows that did SGD updates, median
    SGD updates/s over those windows, wall seconds). A resumed run: its steps over the time its
    processes ran, not counting the gaps between them."""
    last_step, elapsed, learning_sps, ups = None, 0.0, [], []
    for acc in event_files(run_dir):
        sps = tag_events(acc, "charts/SPS")
        if sps:
            last_step, elapsed = sps[-1][0], elapsed + sps[-1][1] - acc.FirstEventTimestamp()
        at_step = {step: value for step, _, value in sps}
        for step, _, value in tag_events(acc, "perf/updates_per_second"):
            if value > 0:
                ups.append(value)
                learning_sps.append(at_step.get(step))
    env_sps = last_step / elapsed if last_step is not None and elapsed > 0 else None
    return env_sps, median(learning_sps), median(ups), (elapsed if elapsed > 0 else None)


def training_return(run_dir: str, until: int, episodes: int = 100) -> Optional[float]:
    """The MinAtar paper's metric: the mean return of the last `episodes` training episodes (epsilon-greedy,
    charts/episodic_return) that ended at or before env step `until`."""
    values = [v for step, _, v in scalars(run_dir, "charts/episodic_return") if step <= until][-episodes:]
    return statistics.mean(values) if values else None


def window_rate(folder: str, since: int = 0) -> Optional[float]:
    """Env steps over the wall time between the first charts/SPS event at or after step `since` and the last
    (a peer's own SPS may count from its start)."""
    sps = [(step, t) for step, t, _ in scalars(folder, "charts/SPS") if step >= since]
    return (sps[-1][0] - sps[0][0]) / (sps[-1][1] - sps[0][1]) if len(sps) > 1 else None


def read_medians(run_dir: str, tags) -> Dict[str, float]:
    """The median over log windows of each of `tags` that the run's event files hold."""
    events = event_files(run_dir)
    values = {tag: [value for acc in events for _, _, value in tag_events(acc, tag)] for tag in tags}
    return {tag: statistics.median(v) for tag, v in values.items() if v}


def load_run(stem: str, root: str) -> Run:
    """stem = ROOT/<mode>/<config>/<task>/seed<N> (the run dir, without .log/.exit)."""
    suite, config, task, seed = os.path.relpath(stem, root).split(os.sep)
    try:
        with open(stem + ".exit") as f:
            code = int(f.read().strip())
    except (OSError, ValueError):
        code = None
    finished = code == 0 or (code is None and os.path.exists(os.path.join(stem, "model.npz")))
    status = "ok" if finished else ("unfinished" if code is None else f"crashed (exit {code})")
    run = Run(suite, config, task, seed.replace("seed", ""), stem, status)
    eval_csv = os.path.join(stem, "eval.csv")
    if status == "ok" and os.path.exists(eval_csv):
        run.curve, run.normalized = read_eval_csv(eval_csv)
    if not run.curve:
        run.status = "crashed (no evaluation)" if status == "ok" else status
        return run
    try:
        with open(os.path.join(stem, "args.json")) as f:
            saved = json.load(f)
        run.env_id = saved.get("args", saved).get("env_id")  # the scripts nest the flags under "args"
        run.budget = saved.get("args", saved).get("total_timesteps")
    except (OSError, ValueError):
        pass
    run.env_sps, run.learning_sps, run.updates_per_second, run.wall_seconds = read_throughput(stem)
    if suite == "apex":
        run.apex = read_medians(stem, APEX_TAGS)
    if suite == "minatar" and run.budget:
        run.training = training_return(stem, run.budget)
    return run


def discover(root: str) -> List[Run]:
    stems = {re.sub(r"\.(log|exit)$", "", path) for path in glob.glob(os.path.join(root, "*", "*", "*", "seed*"))}

    def order(stem):  # by mode, config, task, then seed as a number (seed2 before seed10)
        *names, seed = os.path.relpath(stem, root).split(os.sep)
        return names, int(re.sub(r"\D", "", seed) or 0)

    return [load_run(stem, root) for stem in sorted(stems, key=order)]


def bootstrap_ci(values: List[float], rng: np.random.Generator) -> Tuple[float, float]:
    """95% percentile-bootstrap interval of the mean over seeds."""
    x = np.asarray(values, dtype=np.float64)
    means = x[rng.integers(0, len(x), size=(BOOTSTRAP_SAMPLES, len(x)))].mean(axis=1)
    return float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))


def fmt(x: Optional[float], digits: int = 1) -> str:
    return "-" if x is None else f"{x:,.{digits}f}"


def mean_std(values: List[float]) -> str:
    return f"{np.mean(values):.1f} ± {np.std(values):.1f}"


def table(suite: str, groups: Dict[Tuple[str, str], List[Run]]) -> List[str]:
    lines = [
        "| config | task | final eval (mean ± std) | 95% CI | best eval (mean ± std) | norm. score | steps to "
        "threshold (median, reached) | env steps/s (end to end / learning) | updates/s | runs ok |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    notes = []
    # Algorithm first, then task, then variant: an ablation's variants sit next to each other.
    for (config, task), runs in sorted(groups.items(), key=lambda kv: (kv[0][0].split("-")[0], kv[0][1], kv[0][0])):
        ok = [r for r in runs if r.status == "ok"]
        row = ["no finished run", "-", "-", "-", "-", "-", "-"]
        if ok:
            finals = [r.final for r in ok]
            low, high = bootstrap_ci(finals, np.random.default_rng(0))  # the same runs, the same interval
            bar, kind = ok[0].threshold()
            reached = [s for s in (r.steps_to_threshold() for r in ok) if s is not None]
            steps = fmt(median(reached), 0) if reached else "not reached"
            threshold = "-" if bar is None else f"{steps} ({len(reached)}/{len(ok)} reach {kind} {bar:g})"
            env_sps = median(r.env_sps for r in ok)
            sps = "-" if env_sps is None else f"{fmt(env_sps, 0)} / {fmt(median(r.learning_sps for r in ok), 0)}"
            score = np.mean([r.normalized[-1] for r in ok]) if all(r.normalized for r in ok) else None
            best = mean_std([max(v for _, v in r.curve) for r in ok])  # each run's best evaluation
            ups = fmt(median(r.updates_per_second for r in ok), 0)
            row = [mean_std(finals), f"[{low:.1f}, {high:.1f}]", best, fmt(score), threshold, sps, ups]
        lines.append(f"| {config} | {task} | " + " | ".join(row) + f" | {len(ok)}/{len(runs)} |")
        for r in runs:
            if r.status != "ok":
                where = os.path.join(suite, config, task, "seed" + r.seed)
                notes.append(f"- {config} / {task} / seed {r.seed}: **{r.status}**, see `{where}.log`")
    return lines + ([""] + notes if notes else [])


def apex_table(groups: Dict[Tuple[str, str], List[Run]]) -> List[str]:
    """Ape-X against the number of actors, beside dqn_prioritized.py: medians over seeds of each run's
    whole-run env steps/s and of its log windows' updates/s, learner wait fraction (time waiting for a
    batch over learning time), replay ratio and parameter lag."""
    lines = [
        "| config | task | final eval (mean ± std) | env steps/s | updates/s | learner wait fraction "
        "| replay ratio (samples per env step) | parameter lag (SGD steps) | wall per run | runs ok |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for (config, task), runs in sorted(groups.items()):
        ok = [r for r in runs if r.status == "ok"]
        row = [
            mean_std([r.final for r in ok]) if ok else "-",
            fmt(median(r.env_sps for r in ok), 0),
            fmt(median(r.updates_per_second for r in ok), 0),
            fmt(median(r.apex.get("perf/learner_wait_fraction") for r in ok), 3),
            fmt(median(r.apex.get("perf/replay_ratio") for r in ok), 1),
            fmt(median(r.apex.get("apex/param_lag") for r in ok), 0),
            fmt(median(r.wall_seconds for r in ok), 1) + " s" if ok else "-",
        ]
        lines.append(f"| {config} | {task} | " + " | ".join(row) + f" | {len(ok)}/{len(runs)} |")
    return lines


def pyplot():
    """matplotlib's pyplot drawing to files, or None where matplotlib is not installed (the tables still are)."""
    try:
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    plt.switch_backend("Agg")
    return plt


def minatar_table(groups: Dict[Tuple[str, str], List[Run]]) -> List[str]:
    """MinAtar's games against the paper's DQN on the paper's metric (training_return at the run's budget)."""
    columns = (
        "game, config, budget, last 100 training episodes by seed, mean, paper's DQN, share, final evaluations, ok"
    )
    lines = ["| " + " | ".join(columns.split(", ")) + " |", "|---" * 9 + "|"]
    for (config, task), runs in sorted(groups.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        ok, game = [r for r in runs if r.status == "ok" and r.training is not None], task.split("-")[0]
        budget, mean = median(r.budget for r in ok), statistics.mean(r.training for r in ok) if ok else None
        paper = dict(zip((10**6, 5 * 10**6), MINATAR_PAPER_DQN.get(game, ()))).get(budget)
        share = f"{100 * mean / paper:.0f}%" if mean is not None and paper else "-"
        seeds, finals = ", ".join(fmt(r.training) for r in ok) or "-", ", ".join(fmt(r.final) for r in ok) or "-"
        row = [game, config, fmt(budget, 0), seeds, fmt(mean), fmt(paper), share, finals, f"{len(ok)}/{len(runs)}"]
        lines.append("| " + " | ".join(row) + " |")
    return lines


def minatar_plot(runs: List[Run], out_dir: str) -> Optional[str]:
    """One panel a game: each run's moving average of 100 training returns; the paper's DQN as stars."""
    if (plt := pyplot()) is None:
        return None
    returns = [(r, scalars(r.path, "charts/episodic_return")) for r in runs if r.status == "ok"]
    returns = [(r, points) for r, points in returns if len(points) >= 100]  # a moving average of 100
    if not returns:
        return None
    games, configs = sorted({r.task.split("-")[0] for r, _ in returns}), sorted({r.config for r, _ in returns})
    fig, axes = plt.subplots(1, len(games), figsize=(3.2 * len(games), 3), squeeze=False)
    for ax, game in zip(axes[0], games):
        mine = [(r, points) for r, points in returns if r.task.split("-")[0] == game]
        for r, points in mine:
            steps, _, values = zip(*points)
            average = np.convolve(values, np.ones(100) / 100, mode="valid")
            ax.plot(steps[99:], average, f"C{configs.index(r.config)}", lw=0.8, label=r.config)
        longest = max(r.budget or 0 for r, _ in mine)
        paper = [(b, v) for b, v in zip((10**6, 5 * 10**6), MINATAR_PAPER_DQN.get(game, ())) if b <= longest]
        if paper:
            ax.plot(*zip(*paper), "k*", ms=9, label="paper's DQN")
        legend = dict(zip(*reversed(ax.get_legend_handles_labels())))  # one entry a label
        ax.legend(legend.values(), legend.keys(), fontsize=7)
        ax.set(title=game, xlabel="env steps", ylabel="training return (100 episodes)")
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, "minatar_games.png"), dpi=100)
    plt.close(fig)
    return "minatar_games.png"


def plot(suite: str, task: str, groups: Dict[str, List[Run]], out_dir: str) -> Optional[str]:
    """Mean eval curve per config over the seeds that finished, band = +- one std over seeds."""
    if (plt := pyplot()) is None:
        return None
    finished = {config: ok for config, runs in groups.items() if (ok := [r for r in runs if r.status == "ok"])}
    if not finished:
        return None
    fig, ax = plt.subplots(figsize=(5, 3.4))
    for config, ok in finished.items():
        # The i-th evaluations of the seeds together, at the mean of their steps (Ape-X's differ).
        shortest = min(len(r.curve) for r in ok)
        steps = np.mean([[step for step, _ in r.curve[:shortest]] for r in ok], axis=0)
        values = np.array([[v for _, v in r.curve[:shortest]] for r in ok])
        mean, std = values.mean(axis=0), values.std(axis=0)
        ax.plot(steps, mean, label=f"{config} ({len(ok)} seeds)")
        ax.fill_between(steps, mean - std, mean + std, alpha=0.2)
    is_bc = all(r.normalized for ok in finished.values() for r in ok)
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


def describe_replay_memory(rows: List[dict]) -> List[str]:
    lines = [
        "| replay layout | capacity | RSS | RSS per transition | arrays per transition |",
        "|---|---:|---:|---:|---:|",
    ]
    for m in rows:
        lines.append(
            f"| {m['layout']} | {m['capacity']:,} | {m['rss_bytes'] / 2**30:.2f} GiB | "
            f"{m['rss_bytes_per_transition']:,.0f} B | {m['array_bytes_per_transition']:,.0f} B |"
        )
    return lines + [""]


def write_summary(root: str, out_dir: str) -> str:
    runs = discover(root)
    if not runs:
        fail(f"no runs under {root} (expected <mode>/<config>/<task>/seed<N>)")
    os.makedirs(out_dir, exist_ok=True)
    lines = [
        "# Benchmark summary",
        "",
        f"Made by `benchmark/benchmark_summary.py` from the runs under `{root}`; machine: {machine()}.",
        "Final eval = the evaluation at the end of each run; ± is the std over seeds; the CI is a "
        "95% bootstrap interval of the mean over seeds. Plots: mean over seeds, band ± one std; MinAtar's: each "
        "run's mean of its last 100 training episodes.",
        "",
    ]
    for suite in sorted({r.suite for r in runs}):
        in_suite = [r for r in runs if r.suite == suite]
        groups: Dict[Tuple[str, str], List[Run]] = {}
        for r in in_suite:
            groups.setdefault((r.config, r.task), []).append(r)
        tables = {"apex": apex_table, "minatar": minatar_table}
        lines += [f"## {suite}", ""] + (tables[suite](groups) if suite in tables else table(suite, groups)) + [""]
        memory = os.path.join(root, suite, "replay-memory.jsonl")  # `./benchmark.sh atari` writes it
        if os.path.exists(memory):
            with open(memory) as f:
                lines += describe_replay_memory([json.loads(line) for line in f])
        if suite == "minatar" and (name := minatar_plot(in_suite, out_dir)):
            lines += [f"![minatar]({name})", ""]
        for task in dict.fromkeys(r.task for r in in_suite if suite != "minatar"):
            name = plot(suite, task, {c: rs for (c, t), rs in groups.items() if t == task}, out_dir)
            if name:
                lines += [f"![{suite} {task}]({name})", ""]
    path = os.path.join(out_dir, "summary.md")
    with open(path, "w") as f:
        f.write("\n".join(lines))
    return path


def fail(message: str) -> None:
    print(f"benchmark_summary.py: error: {message}", file=sys.stderr)
    raise SystemExit(2)


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", default="runs/bench", help="root of the benchmark runs")
    parser.add_argument("--out", default="results", help="where summary.md and the plots go")
    args = parser.parse_args(argv)
    if not os.path.isdir(args.runs):
        fail(f"{args.runs} is not a directory")
    print(write_summary(args.runs, args.out))


if __name__ == "__main__":
    main()
