"""The project's scripts, sbx (benchmark/sbx_peer.py) and CleanRL's own dqn_jax.py side by side,
one process at a time, alternating, in one sitting (`./benchmark.sh speed` builds the peers' venvs):

    python benchmark/speed_vs_peers.py --sbx-python .venv-sbx/bin/python \
        --cleanrl-python .venv-cleanrl/bin/python --cleanrl-dqn .venv-cleanrl/dqn_jax.py --out DIR

At CleanRL's settings (DQN CartPole-v1 200k steps, SAC Pendulum-v1 15k; every side uniform one-step
replay with the same networks, batch, replay ratio, target period and learning start; the project's
DQN with CleanRL's squared error, --huber-delta 1e30, with which it learns there): whole-process wall
time (imports, compiling and, on the project's side, a one-episode final evaluation included), the
learning phase's env steps/s and the mean of the last 10 training returns (a fast side that does
not learn shows), for --pairs rounds, each side first in turn.

Writes DIR/speed_vs_peers.json (every run) and DIR/speed_vs_peers.md (medians, ranges and ratios).
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

from benchmark_summary import machine, read_throughput, training_return, window_rate

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# dqn_jax.py's CartPole settings in this project's flags (its target period of 500 env steps = 50 SGD steps)
CLEANRL = "--train-frequency 10 --batch-size 128 --buffer-size 10000 --learning-rate 2.5e-4 "
CLEANRL += "--target-network-frequency 50 --learning-starts 10000 --exploration-fraction 0.5 --end-e 0.05 "
CLEANRL += "--hidden-sizes 120 84 --no-anneal-lr"
SAME = {
    "dqn": {
        "ours": f"algos/dqn_prioritized.py --env-id CartPole-v1 --total-timesteps 200000 {CLEANRL} "
        "--no-prioritized --n-step 1 --huber-delta 1e30",
        "sbx": "dqn --env-id CartPole-v1 --total-timesteps 200000",
        # dqn_jax.py's own flags: its target period counts env steps (500 = 50 SGD steps here)
        "cleanrl": "--env-id CartPole-v1 --total-timesteps 200000 --learning-rate 2.5e-4 --buffer-size 10000 "
        "--target-network-frequency 500 --batch-size 128 --start-e 1 --end-e 0.05 --exploration-fraction 0.5 "
        "--learning-starts 10000 --train-frequency 10",
    },
    "sac": {
        "ours": "algos/sac.py --env-id Pendulum-v1 --total-timesteps 15000 --learning-starts 5000 --batch-size 256 "
        "--policy-frequency 2 --target-entropy-scale 1 --target-network-frequency 1 --tau 0.005 --policy-lr 3e-4 "
        "--q-lr 3e-4 --hidden-sizes 256 256 --no-prioritized",
        "sbx": "sac --env-id Pendulum-v1 --total-timesteps 15000",
    },
}
QUIET = ["--eval-every", "10000000", "--eval-episodes", "1", "--checkpoint-every", "0"]
SIDES = ("ours", "before", "sbx", "cleanrl")


def fresh(stem):
    """The scripts start a run only in a new or empty folder, and an earlier sitting's event files
    would mix with this one's: a rerun into the same --out starts from nothing."""
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


def peer_result(log):
    with open(log) as f:
        lines = [line for line in f if line.startswith("PEER ")]
    return json.loads(lines[-1][len("PEER ") :])


def same_settings(a, algo, side, pair):
    """One whole-process run of one side at the same settings: its record."""
    stem = fresh(os.path.join(a.out, f"same-{algo}-{side}-{pair}"))
    seed = ["--seed", str(pair)]
    if side in ("ours", "before"):
        script, *flags = SAME[algo]["ours"].split()
        cmd = [a.python, os.path.join(a.before, script) if side == "before" else script, *flags, *QUIET, *seed]
        cmd += ["--run-dir", stem]
        start, end = timed(cmd, stem + ".log")
        rate, returns, extra = read_throughput(stem)[1], training_return(stem, 2**63, 10), {}
    elif side == "sbx":
        cmd = [a.sbx_python, "benchmark/sbx_peer.py", *SAME[algo]["sbx"].split(), *seed]
        start, end = timed(cmd, stem + ".log")
        peer = peer_result(stem + ".log")
        rate, returns, extra = peer["learning_env_steps_per_s"], peer["last_returns"], {"sbx_kwargs": peer["kwargs"]}
    else:  # dqn_jax.py writes runs/ under its working directory
        os.makedirs(stem)
        cmd = [a.cleanrl_python, a.cleanrl_dqn, *SAME[algo]["cleanrl"].split(), *seed]
        start, end = timed(cmd, stem + ".log", cwd=stem)
        # dqn_jax.py logs charts/SPS in its learning phase only
        rate, returns, extra = window_rate(stem), training_return(stem, 2**63, 10), {}
    print(
        f"same {algo} {side} pair {pair}: {end - start:.1f} s, {rate or 0:.0f} env steps/s, last 10 {returns}",
        flush=True,
    )
    record = dict(algo=algo, side=side, pair=pair, wall=end - start, command=cmd)
    return dict(record, learning_env_steps_per_s=rate, last_returns=returns, **extra)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sbx-python", help="without it, no sbx side")
    parser.add_argument("--cleanrl-python", help="without it, no CleanRL side")
    parser.add_argument("--cleanrl-dqn", help="dqn_jax.py as the cleanrl wheel ships it")
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--out", required=True)
    parser.add_argument("--algos", nargs="+", choices=list(SAME), default=list(SAME))
    parser.add_argument("--before", help="a checkout of the project before a change: one more side, 'before'")
    a = parser.parse_args()
    for name in ("out", "sbx_python", "cleanrl_python", "cleanrl_dqn", "before"):  # the children run in other folders
        if getattr(a, name):
            setattr(a, name, os.path.abspath(getattr(a, name)))
    os.makedirs(a.out, exist_ok=True)
    runs = []
    given = {"ours": True, "before": a.before, "sbx": a.sbx_python, "cleanrl": a.cleanrl_dqn and a.cleanrl_python}
    for algo in a.algos:
        sides = [side for side in SIDES if given[side] and (side == "before" or side in SAME[algo])]
        for pair in range(1, a.pairs + 1):
            for side in sides[pair % len(sides) :] + sides[: pair % len(sides)]:  # each side first in turn
                runs.append(same_settings(a, algo, side, pair))
    with open(os.path.join(a.out, "speed_vs_peers.json"), "w") as f:
        json.dump({"machine": machine(), "date": time.ctime(), "runs": runs}, f, indent=1)
    lines = [
        "| task, same settings | side | whole process, median (range) | learning env steps/s | "
        "last 10 training episodes | whole-process ratio side / project, median (range) |",
        "|---|---|---|---|---|---|",
    ]
    for algo in a.algos:
        same = [r for r in runs if r["algo"] == algo]
        ours = {r["pair"]: r["wall"] for r in same if r["side"] == "ours"}
        for side in SIDES:
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
    with open(os.path.join(a.out, "speed_vs_peers.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
