"""Signalled runs, counting aborts: a researcher's seed loop calling SCRIPT's train() with Ctrl-C (SIGINT) sent at
a random moment, half of them with a second Ctrl-C soon after (inside the stop path: the checkpoint, the cleanup).
Each run must end with a clean stop (KeyboardInterrupt out of the loop: killed by SIGINT), never a signal of its
own (SIGABRT: glibc's abort on a corrupted heap; SIGSEGV), and its checkpoint, where one was
written, must resume: train() again from the folder, to its saved step (no env step, the checks of a resume and
the final evaluation).

  python benchmark/stress.py SCRIPT [--runs N] [--jobs J] [--out DIR] [--repo DIR]

SCRIPT: dqn, sac or apex. --repo runs the scripts of another checkout (an older commit's worktree). Prints one
line per run and the counts; results.jsonl in --out. Exit 1 if any run aborted or a checkpoint did not load."""

import argparse
import collections
import json
import os
import random
import shlex
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

# A seed loop as a researcher writes it: train() for each seed, stopping when Ctrl-C raises KeyboardInterrupt.
# The flags keep the run busy (learning, prefetch, evaluations, checkpoints) for longer than the signal waits.
CHILD = """
import dataclasses, importlib.util, os, sys
spec = importlib.util.spec_from_file_location("algo", sys.argv[1])
algo = importlib.util.module_from_spec(spec)
spec.loader.exec_module(algo)
args = algo.parse_args(sys.argv[3:])
if os.environ.get("STRESS_JAX_FIRST"):  # the caller used JAX before train(): its CPU client is made with the defaults
    algo.jax.numpy.zeros(1).block_until_ready()
for seed in (1, 2, 3):
    algo.train(dataclasses.replace(args, seed=seed, run_dir=f"{sys.argv[2]}/seed{seed}"))
"""
RESUME = """
import dataclasses, importlib.util, json, sys
import numpy as np
spec = importlib.util.spec_from_file_location("algo", sys.argv[1])
algo = importlib.util.module_from_spec(spec)
spec.loader.exec_module(algo)
meta, _ = algo.load_npz(sys.argv[2] + "/checkpoint.npz", "checkpoint")
args = algo.parse_args(["--resume", sys.argv[2], "--total-timesteps", str(max(1, meta["global_step"]))])
print(json.dumps(algo.train(dataclasses.replace(args, eval_episodes=1))))
"""
FLAGS = {
    "dqn": ["--total-timesteps", "400000", "--eval-every", "5000", "--checkpoint-every", "4000"],
    "sac": ["--total-timesteps", "100000", "--eval-every", "2000", "--checkpoint-every", "1500"],
    "apex": ["--num-actors", "2", "--total-timesteps", "400000", "--eval-every", "5000", "--checkpoint-every", "4000"],
}
SCRIPTS = {"dqn": "dqn_prioritized.py", "sac": "sac.py", "apex": "apex_dqn.py"}


def one(i: int, opts) -> dict:
    rng = random.Random(i)
    folder = os.path.join(opts.out, f"run{i:04d}")
    script = os.path.join(opts.repo, "algos", SCRIPTS[opts.script])
    env = dict(os.environ, PYTHONFAULTHANDLER="1", STRESS_JAX_FIRST="1" if opts.jax_first else "")
    command = [sys.executable, "-c", CHILD, script, folder] + (
        shlex.split(opts.flags) if opts.flags else FLAGS[opts.script]
    )
    with open(folder + ".log", "wb") as log:
        child = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
        first = rng.uniform(opts.earliest, opts.latest)
        second = first + rng.uniform(0.0, 3.0) if rng.random() < 0.5 else None
        start = time.monotonic()
        for at in (first, second):
            if at is None:
                continue
            try:
                child.wait(timeout=max(0.0, start + at - time.monotonic()))
                break  # ended before the signal
            except subprocess.TimeoutExpired:
                child.send_signal(signal.SIGINT)
        try:
            rc = child.wait(timeout=300)
        except subprocess.TimeoutExpired:
            child.kill()
            rc = "hung"
    text = open(folder + ".log", errors="replace").read()
    result = {"run": i, "rc": rc, "first": round(first, 2), "second": second and round(second, 2)}
    # rc -2: KeyboardInterrupt left the seed loop (Python then dies of SIGINT, as a shell expects)
    result["abort"] = rc not in (0, -2, 130) or "Fatal Python error" in text or "corrupted" in text
    checkpoint = os.path.join(folder, "seed1", "checkpoint.npz")
    result["checkpoint"] = os.path.isfile(checkpoint)
    if result["checkpoint"]:
        resume = [sys.executable, "-c", RESUME, script, os.path.dirname(checkpoint)]
        done = subprocess.run(resume, capture_output=True, text=True, timeout=600)
        result["loaded"] = done.returncode == 0
        if not result["loaded"]:
            result["load_error"] = (done.stderr.strip().splitlines() or ["?"])[-1]
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("script", choices=sorted(SCRIPTS))
    parser.add_argument("--runs", type=int, default=150)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--earliest", type=float, default=6.0, help="seconds after the start (imports, compiles)")
    parser.add_argument("--latest", type=float, default=20.0)
    parser.add_argument("--flags", help="the script's flags (default: FLAGS[SCRIPT])")
    parser.add_argument("--jax-first", action="store_true", help="the loop uses JAX before train() (async dispatch)")
    parser.add_argument("--out", default="runs/stress")
    parser.add_argument("--repo", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    opts = parser.parse_args()
    opts.out = os.path.join(opts.out, opts.script)
    os.makedirs(opts.out, exist_ok=True)
    counts = collections.Counter()
    with ThreadPoolExecutor(opts.jobs) as pool, open(os.path.join(opts.out, "results.jsonl"), "a") as out:
        for result in pool.map(lambda i: one(i, opts), range(opts.runs)):
            print(json.dumps(result), flush=True)
            out.write(json.dumps(result) + "\n")
            out.flush()
            counts["runs"] += 1
            counts["aborts"] += result["abort"]
            counts["checkpoints"] += result["checkpoint"]
            counts["loaded"] += result.get("loaded", False)
    print(f"{opts.script}: {dict(counts)}")
    return int(counts["aborts"] > 0 or counts["loaded"] < counts["checkpoints"])


if __name__ == "__main__":
    sys.exit(main())
