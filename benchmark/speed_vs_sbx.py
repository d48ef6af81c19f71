"""Speed against a peer, side by side: the project's scripts and sbx (`sbx-rl`), run by
`./benchmark/benchmark.sh speed` one process at a time, alternating, on the same machine in one sitting.

    python benchmark/speed_vs_sbx.py --sbx-python .venv-sbx/bin/python --pairs 3 --seeds 5 --out DIR

1. Identical settings (CleanRL's: DQN dqn_jax.py on CartPole-v1 for 200k steps, SAC
   sac_continuous_action.py on Pendulum-v1 for 15k steps; both sides uniform one-step replay,
   the same networks, batch, replay ratio, target period and learning start): whole-process wall
   time (imports, compilation and, on the project's side, its one-episode final evaluation
   included) and the env steps/s of the learning phase, for --pairs pairs whose order alternates.
2. Time to solve at each one's own best settings (the project's defaults; sbx with the RL-Zoo's
   tuned hyper-parameters): wall seconds from the process start until an evaluation of 10
   episodes first reaches 475 on CartPole-v1 or -200 on Pendulum-v1, for --seeds seeds.

Writes DIR/speed_vs_sbx.json (every run) and DIR/speed_vs_sbx.md (medians, ranges and ratios).
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
        ],
        "sbx": ["dqn", "--env-id", "CartPole-v1", "--total-timesteps", "200000", "--settings", "cleanrl"],
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


def timed(cmd, log):
    start = time.time()
    with open(log, "w") as f:
        code = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT).returncode
    end = time.time()
    if code != 0:
        raise SystemExit(f"speed_vs_sbx.py: error: {' '.join(cmd)} failed (exit {code}), see {log}")
    return start, end


def peer_result(log):
    with open(log) as f:
        lines = [line for line in f if line.startswith("PEER ")]
    return json.loads(lines[-1][len("PEER ") :])


def first_solve_time(run_dir, threshold):
    """Epoch time of the run's first evaluation at or above the threshold (tensorboard events)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    for path in sorted(glob.glob(os.path.join(run_dir, "events.out.tfevents.*"))):
        acc = EventAccumulator(path, size_guidance={"scalars": 0})
        acc.Reload()
        if "eval/episodic_return" in acc.Tags()["scalars"]:
            for e in acc.Scalars("eval/episodic_return"):
                if e.value >= threshold:
                    return e.step, e.wall_time
    return None


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sbx-python", required=True)
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--out", required=True)
    a = parser.parse_args()
    os.makedirs(a.out, exist_ok=True)
    runs = []
    for algo, cmds in SAME.items():
        for pair in range(1, a.pairs + 1):
            order = ("ours", "sbx") if pair % 2 else ("sbx", "ours")
            for side in order:
                stem = os.path.join(a.out, f"same-{algo}-{side}-{pair}")
                if side == "ours":
                    cmd = [a.python, *cmds["ours"], *QUIET, "--seed", str(pair), "--run-dir", fresh(stem)]
                else:
                    cmd = [a.sbx_python, "benchmark/sbx_peer.py", *cmds["sbx"], "--seed", str(pair)]
                start, end = timed(cmd, stem + ".log")
                peer = None if side == "ours" else peer_result(stem + ".log")
                rate = read_throughput(stem)[1] if side == "ours" else peer["learning_env_steps_per_s"]
                runs.append(
                    {
                        "kind": "same",
                        "algo": algo,
                        "side": side,
                        "pair": pair,
                        "wall": end - start,
                        "learning_env_steps_per_s": rate,
                        "command": cmd,
                        **({} if peer is None else {"sbx_kwargs": peer["kwargs"]}),
                    }
                )
                print(
                    f"same {algo} {side} pair {pair}: {end - start:.1f} s, learning {rate or 0:.0f} env steps/s",
                    flush=True,
                )
    for algo, spec in SOLVE.items():
        for seed in range(1, a.seeds + 1):
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
    with open(os.path.join(a.out, "speed_vs_sbx.json"), "w") as f:
        json.dump(
            {"machine": machine(), "date": time.ctime(), "runs": runs},
            f,
            indent=1,
        )
    lines = ["| task | project | sbx | ratio sbx / project |", "|---|---|---|---|"]
    for algo in SAME:
        ours = [r["wall"] for r in runs if r["kind"] == "same" and r["algo"] == algo and r["side"] == "ours"]
        peer = [r["wall"] for r in runs if r["kind"] == "same" and r["algo"] == algo and r["side"] == "sbx"]
        ratios = [p / o for o, p in zip(ours, peer)]
        lines.append(
            f"| {algo}, same settings, whole process (median of {len(ours)} pairs) | "
            f"{statistics.median(ours):.1f} s | {statistics.median(peer):.1f} s | "
            f"{statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f}) |"
        )
    for algo in SOLVE:
        for side in ("ours", "sbx"):
            times = [
                r["solved"]["seconds"]
                for r in runs
                if r["kind"] == "solve" and r["algo"] == algo and r["side"] == side and r["solved"]
            ]
            total = sum(1 for r in runs if r["kind"] == "solve" and r["algo"] == algo and r["side"] == side)
            text = (
                f"{statistics.median(times):.1f} s ({min(times):.1f}-{max(times):.1f}), {len(times)}/{total} solved"
                if times
                else f"0/{total} solved"
            )
            lines.append(
                f"| {algo}, time to solve, {'project defaults' if side == 'ours' else 'sbx, RL-Zoo settings'} "
                f"| {text if side == 'ours' else ''} | {text if side == 'sbx' else ''} | |"
            )
    with open(os.path.join(a.out, "speed_vs_sbx.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
