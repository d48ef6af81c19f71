"""Speed against peers, side by side: the project's scripts, sbx (`sbx-rl`) and CleanRL's own
dqn_jax.py, run by `./benchmark/benchmark.sh speed` one process at a time, alternating, on the same
machine in one sitting.

    python benchmark/speed_vs_peers.py --sbx-python .venv-sbx/bin/python \
        --cleanrl-python .venv-cleanrl/bin/python --cleanrl-dqn .venv-cleanrl/dqn_jax.py --pairs 3 --seeds 5 --out DIR

1. Identical settings (CleanRL's: DQN dqn_jax.py on CartPole-v1 for 200k steps, SAC
   sac_continuous_action.py on Pendulum-v1 for 15k steps; every side uniform one-step replay,
   the same networks, batch, replay ratio, target period and learning start; the project's DQN
   with CleanRL's squared error, --huber-delta 1e30, with which it learns there): whole-process
   wall time (imports, compilation and, on the project's side, its one-episode final evaluation
   included), the env steps/s of the learning phase and the mean return of the last 10 training
   episodes (a fast side that does not learn shows), for --pairs rounds whose order alternates.
2. Time to solve at each one's own best settings (the project's defaults; sbx with the RL-Zoo's
   tuned hyper-parameters): wall seconds from the process start until an evaluation of 10
   episodes first reaches 475 on CartPole-v1 or -200 on Pendulum-v1, for --seeds seeds.

Writes DIR/speed_vs_peers.json (every run) and DIR/speed_vs_peers.md (medians, ranges and ratios).
"""

import argparse
import glob
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
from benchmark_summary import machine, read_throughput  # noqa: E402

SAME = {
    "dqn": {
        "ours": [
            "algos/dqn_prioritized.py",
            "--env-id",
            "CartPole-v1",
            "--total-timesteps",
            "200000",
            "--train-frequency",
            "10",
            "--batch-size",
            "128",
            "--buffer-size",
            "10000",
            "--learning-rate",
            "2.5e-4",
            "--target-network-frequency",
            "50",
            "--learning-starts",
            "10000",
            "--exploration-fraction",
            "0.5",
            "--end-e",
            "0.05",
            "--hidden-sizes",
            "120",
            "84",
            "--no-anneal-lr",
            "--no-prioritized",
            "--n-step",
            "1",
            "--huber-delta",
            "1e30",
        ],
        "sbx": ["dqn", "--env-id", "CartPole-v1", "--total-timesteps", "200000", "--settings", "cleanrl"],
        # dqn_jax.py's own flags: its target period counts env steps (500 = 50 SGD steps here)
        "cleanrl": "--env-id CartPole-v1 --total-timesteps 200000 --learning-rate 2.5e-4 --buffer-size 10000 "
        "--target-network-frequency 500 --batch-size 128 --start-e 1 --end-e 0.05 --exploration-fraction 0.5 "
        "--learning-starts 10000 --train-frequency 10".split(),
    },
    "sac": {
        "ours": [
            "algos/sac.py",
            "--env-id",
            "Pendulum-v1",
            "--total-timesteps",
            "15000",
            "--learning-starts",
            "5000",
            "--batch-size",
            "256",
            "--policy-frequency",
            "2",
            "--target-entropy-scale",
            "1",
            "--target-network-frequency",
            "1",
            "--tau",
            "0.005",
            "--policy-lr",
            "3e-4",
            "--q-lr",
            "3e-4",
            "--hidden-sizes",
            "256",
            "256",
            "--no-prioritized",
            "--n-step",
            "1",
        ],
        "sbx": ["sac", "--env-id", "Pendulum-v1", "--total-timesteps", "15000", "--settings", "cleanrl"],
    },
}
QUIET = ["--eval-every", "10000000", "--eval-episodes", "1", "--checkpoint-every", "0", "--checkpoint-minutes", "0"]
SOLVE = {
    "dqn": {
        "threshold": 475.0,
        "ours": ["algos/dqn_prioritized.py"],
        "budget": 100_000,
        "every": 10_000,
        "sbx": ["dqn", "--env-id", "CartPole-v1", "--settings", "zoo"],
    },
    "sac": {
        "threshold": -200.0,
        "ours": ["algos/sac.py", "--env-id", "Pendulum-v1"],
        "budget": 20_000,
        "every": 1_000,
        "sbx": ["sac", "--env-id", "Pendulum-v1", "--settings", "zoo"],
    },
}


def fresh(stem):
    """The project's scripts start a run only in a new or empty folder (dqn_prioritized.py refuses
    another), and an earlier sitting's event files would mix with this one's: a rerun into the same
    --out starts from nothing."""
    if os.path.isdir(stem) and not os.path.islink(stem):
        shutil.rmtree(stem)
    return stem


def timed(cmd, log, cwd=ROOT):
    start = time.time()
    with open(log, "w") as f:
        code = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=cwd).returncode
    end = time.time()
    if code != 0:
        raise SystemExit(f"speed_vs_peers.py: error: {' '.join(cmd)} failed (exit {code}), see {log}")
    return start, end


def scalars(folder, tag):
    """Every (step, wall time, value) of one tag in the event files under folder, in step order."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = []
    for path in glob.glob(os.path.join(folder, "**", "events.out.tfevents.*"), recursive=True):
        acc = EventAccumulator(path, size_guidance={"scalars": 0})
        acc.Reload()
        if tag in acc.Tags()["scalars"]:
            out += [(e.step, e.wall_time, e.value) for e in acc.Scalars(tag)]
    return sorted(out)


def last_returns(folder):
    returns = [v for _, _, v in scalars(folder, "charts/episodic_return")[-10:]]
    return statistics.mean(returns) if returns else None


def cleanrl_rate(folder):
    """dqn_jax.py logs charts/SPS every 100 steps of its learning phase: its env steps over the wall
    time between the first and the last of those events."""
    sps = scalars(folder, "charts/SPS")
    return (sps[-1][0] - sps[0][0]) / (sps[-1][1] - sps[0][1]) if len(sps) > 1 else None


def peer_result(log):
    with open(log) as f:
        lines = [line for line in f if line.startswith("PEER ")]
    return json.loads(lines[-1][len("PEER ") :])


def first_solve_time(run_dir, threshold):
    """(step, epoch time) of the run's first evaluation at or above the threshold, or None."""
    return next(((st, w) for st, w, v in scalars(run_dir, "eval/episodic_return") if v >= threshold), None)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sbx-python", help="without it, no sbx side")
    parser.add_argument("--cleanrl-python", help="without it, no CleanRL side")
    parser.add_argument("--cleanrl-dqn", help="dqn_jax.py as the cleanrl wheel ships it")
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--out", required=True)
    parser.add_argument("--algos", nargs="+", choices=list(SAME), default=list(SAME))
    parser.add_argument("--before", help="a checkout of the project before a change: one more side, 'before'")
    a = parser.parse_args()
    for name in ("out", "sbx_python", "cleanrl_python", "cleanrl_dqn", "before"):  # the children run in other folders
        if getattr(a, name):
            setattr(a, name, os.path.abspath(getattr(a, name)))
    os.makedirs(a.out, exist_ok=True)
    runs = []
    for algo, cmds in SAME.items():
        if algo not in a.algos:
            continue
        cmds = {**cmds, "before": [os.path.join(a.before, cmds["ours"][0]), *cmds["ours"][1:]]} if a.before else cmds
        given = {"ours": True, "before": a.before, "sbx": a.sbx_python, "cleanrl": a.cleanrl_python and a.cleanrl_dqn}
        sides = [side for side in ("ours", "before", "sbx", "cleanrl") if side in cmds and given[side]]
        for pair in range(1, a.pairs + 1):
            for side in sides[pair % len(sides) :] + sides[: pair % len(sides)]:  # each side first in turn
                stem = fresh(os.path.join(a.out, f"same-{algo}-{side}-{pair}"))
                seed = ["--seed", str(pair)]
                if side in ("ours", "before"):
                    cmd = [a.python, *cmds[side], *QUIET, *seed, "--run-dir", stem]
                    start, end = timed(cmd, stem + ".log")
                    rate, returns, extra = read_throughput(stem)[1], last_returns(stem), {}
                elif side == "sbx":
                    cmd = [a.sbx_python, "benchmark/sbx_peer.py", *cmds["sbx"], *seed]
                    start, end = timed(cmd, stem + ".log")
                    peer = peer_result(stem + ".log")
                    rate, returns = peer["learning_env_steps_per_s"], peer["last_returns"]
                    extra = {"sbx_kwargs": peer["kwargs"]}
                else:  # dqn_jax.py writes runs/ under its working directory
                    os.makedirs(stem)
                    cmd = [a.cleanrl_python, a.cleanrl_dqn, *cmds["cleanrl"], *seed]
                    start, end = timed(cmd, stem + ".log", cwd=stem)
                    rate, returns, extra = cleanrl_rate(stem), last_returns(stem), {}
                runs.append(
                    {
                        "kind": "same",
                        "algo": algo,
                        "side": side,
                        "pair": pair,
                        "wall": end - start,
                        "learning_env_steps_per_s": rate,
                        "last_returns": returns,
                        "command": cmd,
                        **extra,
                    }
                )
                print(
                    f"same {algo} {side} pair {pair}: {end - start:.1f} s, learning {rate or 0:.0f} env steps/s, "
                    f"last 10 episodes {returns}",
                    flush=True,
                )
    for algo, spec in SOLVE.items():
        for seed in range(1, a.seeds + 1 if algo in a.algos and a.sbx_python else 1):
            for side in ("ours", "sbx") if seed % 2 else ("sbx", "ours"):
                stem = os.path.join(a.out, f"solve-{algo}-{side}-{seed}")
                common = f"--seed {seed} --total-timesteps {spec['budget']} --eval-every {spec['every']}".split()
                if side == "ours":
                    quiet = ["--checkpoint-every", "0", "--checkpoint-minutes", "0", "--run-dir", fresh(stem)]
                    cmd = [a.python, *spec["ours"], *common, *quiet]
                    start, end = timed(cmd, stem + ".log")
                    hit = first_solve_time(stem, spec["threshold"])
                    solved = None if hit is None else {"step": hit[0], "seconds": hit[1] - start}
                else:
                    cmd = [
                        a.sbx_python,
                        "benchmark/sbx_peer.py",
                        *spec["sbx"],
                        *common,
                        "--solve",
                        str(spec["threshold"]),
                    ]
                    start, end = timed(cmd, stem + ".log")
                    hit = peer_result(stem + ".log")["solved"]
                    solved = None if hit is None else {"step": hit["step"], "seconds": hit["time"] - start}
                runs.append(
                    {"kind": "solve", "algo": algo, "side": side, "seed": seed, "wall": end - start, "solved": solved}
                )
                print(f"solve {algo} {side} seed {seed}: {solved}", flush=True)
    with open(os.path.join(a.out, "speed_vs_peers.json"), "w") as f:
        json.dump(
            {"machine": machine(), "date": time.ctime(), "runs": runs},
            f,
            indent=1,
        )
    lines = [
        "| task, same settings | side | whole process, median (range) | learning env steps/s | "
        "last 10 training episodes | whole-process ratio side / project, median (range) |",
        "|---|---|---|---|---|---|",
    ]
    for algo in SAME:
        same = [r for r in runs if r["kind"] == "same" and r["algo"] == algo]
        ours = {r["pair"]: r["wall"] for r in same if r["side"] == "ours"}
        for side in ("ours", "before", "sbx", "cleanrl"):
            mine = [r for r in same if r["side"] == side]
            if not mine:
                continue
            walls, rates = [r["wall"] for r in mine], [r["learning_env_steps_per_s"] or 0 for r in mine]
            ratios = [r["wall"] / ours[r["pair"]] for r in mine]
            returns = ", ".join("-" if r["last_returns"] is None else f"{r['last_returns']:.0f}" for r in mine)
            lines.append(
                f"| {algo} | {side} | {statistics.median(walls):.1f} s ({min(walls):.1f}-{max(walls):.1f}) | "
                f"{statistics.median(rates):.0f} | {returns} | "
                f"{statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f}) |"
            )
    if a.seeds:
        lines += ["", "| task, time to solve | project defaults | sbx, RL-Zoo settings |", "|---|---|---|"]
    for algo in [algo for algo in SOLVE if algo in a.algos] if a.seeds else ():
        cells = []
        for side in ("ours", "sbx"):
            mine = [r for r in runs if r["kind"] == "solve" and r["algo"] == algo and r["side"] == side]
            times = [r["solved"]["seconds"] for r in mine if r["solved"]]
            range_ = f"{statistics.median(times):.1f} s ({min(times):.1f}-{max(times):.1f}), " if times else ""
            cells.append(f"{range_}{len(times)}/{len(mine)} solved")
        lines.append(f"| {algo} | {cells[0]} | {cells[1]} |")
    with open(os.path.join(a.out, "speed_vs_peers.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
