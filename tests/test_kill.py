"""Kills with real processes (issue 12): a training run of each script is SIGKILLed at random
moments, some of them in the middle of a checkpoint write, and resumed each time. Every resume
starts from the last complete checkpoint with consistent counters and replay, makes progress,
and the run finishes with one evaluation row per step."""

import csv
import os
import random
import signal
import subprocess
import sys
import time

import pytest
from helpers import ROOT, load_script

MODULES = {name: load_script(name) for name in ("dqn_prioritized", "sac", "bc_offline")}
EVERY = 250  # env steps (DQN, SAC) or updates (BC) between checkpoints
SMALL = [
    "--hidden-sizes",
    "32",
    "32",
    "--batch-size",
    "32",
    "--eval-episodes",
    "1",
    "--log-every",
    "500",
    "--checkpoint-every",
    str(EVERY),
]
# script: (flags, total, learning_starts, train_frequency, K, n_step)
# Totals of 6,000: past the last kill (at most 4 x 4 x 250 steps in; the figure's 5 kills: 5 x 4 x 250).
CONFIGS = {
    "dqn_prioritized": (
        SMALL
        + [
            "--learning-starts",
            "200",
            "--buffer-size",
            "50000",
            "--updates-per-call",
            "4",
            "--train-frequency",
            "2",
            "--n-step",
            "3",
            "--eval-every",
            "1000",
            "--total-timesteps",
            "6000",
        ],
        6_000,
        200,
        2,
        4,
        3,
    ),
    "sac": (
        SMALL
        + [
            "--learning-starts",
            "200",
            "--buffer-size",
            "50000",
            "--updates-per-call",
            "4",
            "--eval-every",
            "1000",
            "--total-timesteps",
            "6000",
        ],
        6_000,
        200,
        1,
        4,
        1,
    ),
    "bc_offline": (
        SMALL
        + [
            "--updates-per-call",
            "10",
            "--eval-every",
            "1000",
            "--total-updates",
            "6000",
            "--dataset",
            os.path.join(ROOT, "data", "pendulum-sac-expert.hdf5"),
        ],
        6_000,
        0,
        1,
        10,
        1,
    ),
}


def start(script, argv, cwd):
    return subprocess.Popen(
        [sys.executable, os.path.join(ROOT, "algos", f"{script}.py")] + argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=cwd,
    )


def temp_files(run_dir):
    return [n for n in os.listdir(run_dir) if ".tmp." in n] if os.path.isdir(run_dir) else []


def progress(script, run_dir):
    """The checkpoint's step (env steps; BC: updates), or -1 while there is none."""
    module = MODULES[script]
    try:
        meta, arrays = module.load_npz(run_dir, "checkpoint")
    except module.ConfigError:
        return -1
    return int(arrays["train_state/sgd_steps"]) if script == "bc_offline" else meta["global_step"]


def kill_when(proc, script, run_dir, during_write, rng, after, timeout=180):
    """SIGKILL the run once it has checkpointed past a random target 1-4 checkpoints beyond
    `after` (chosen by step, not by time, so a faster machine kills at the same places, and each
    resume is seen to make progress): the instant the next checkpoint's temp file appears
    (during_write), or a random few milliseconds after the target. Returns whether a temp file
    was there at the kill."""
    target = after + EVERY * rng.randint(1, 4)
    deadline = time.time() + timeout
    while progress(script, run_dir) < target and proc.poll() is None and time.time() < deadline:
        time.sleep(0.002)
    assert proc.poll() is None, "the run ended before it was killed: " + proc.communicate()[1][-2000:]
    assert progress(script, run_dir) >= target, "no new checkpoint"
    if during_write:
        while time.time() < deadline and proc.poll() is None and not temp_files(run_dir):
            pass  # busy wait: a write takes a few milliseconds
    else:
        time.sleep(rng.uniform(0.0, 0.05))
    caught = bool(temp_files(run_dir))
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    return caught


def check_checkpoint(script, run_dir, resumes):
    """The checkpoint on disk loads, and its counters and replay agree with each other."""
    _, total, starts, frequency, k, n_step = CONFIGS[script]
    meta, arrays = MODULES[script].load_npz(run_dir, "checkpoint")
    sgd = int(arrays["train_state/sgd_steps"])
    if script == "bc_offline":
        assert sgd % EVERY == 0 or sgd == total
        assert arrays["priority"].shape == (4000,)  # one per row of the dataset
        return sgd
    step = meta["global_step"]
    assert (step % EVERY == 0 or step == total) and 0 < step <= total
    assert sgd == (step - starts) // frequency // k * k  # the replay ratio, in whole fused calls
    # One row per env step, less the n-1 an unfinished n-step window holds; a resume restarts
    # the envs, so the window open at each kill is lost (the replay itself is not).
    rows = len(arrays["replay/priority"])
    assert step - (n_step - 1) * (resumes + 1) <= rows <= step
    return step


def kill_and_resume(script, tmp_path, seed, kills=4):
    """Returns (kills that landed during a checkpoint write, checkpoint steps seen)."""
    rng = random.Random(seed)
    run_dir = str(tmp_path / "run")
    proc = start(script, CONFIGS[script][0] + ["--run-dir", run_dir], str(tmp_path))
    steps, caught = [0], 0
    for i in range(kills):
        caught += kill_when(proc, script, run_dir, i % 2 == 0, rng, steps[-1])
        steps.append(check_checkpoint(script, run_dir, i))
        proc = start(script, ["--resume", run_dir], str(tmp_path))
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 0 and "Traceback" not in err, err[-2000:]
    total = CONFIGS[script][1]
    assert steps == sorted(set(steps))  # each resume went on from where the last one was
    assert check_checkpoint(script, run_dir, kills) == total
    assert os.path.isfile(os.path.join(run_dir, "model.npz")) and not temp_files(run_dir)
    with open(os.path.join(run_dir, "eval.csv")) as f:
        evals = [int(r["step"]) for r in csv.DictReader(f)]
    assert evals == sorted(set(evals)) and evals[-1] == total  # one row per step, none twice
    return caught, steps


@pytest.mark.parametrize("script", list(CONFIGS))
def test_sigkill_at_random_moments_then_resume_until_done(script, tmp_path):
    caught, _ = kill_and_resume(script, tmp_path, seed=12)
    assert caught >= 1, "no kill landed during a checkpoint write"


if __name__ == "__main__":
    # The figure in docs/reliability.md: python tests/test_kill.py ROUNDS
    import json
    import pathlib
    import tempfile

    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 4
    for script in CONFIGS:
        landed = 0
        for r in range(rounds):
            with tempfile.TemporaryDirectory() as tmp:
                landed += kill_and_resume(script, pathlib.Path(tmp), seed=1000 + r, kills=5)[0]
        print(
            json.dumps(
                {
                    "script": script,
                    "runs": rounds,
                    "kills": 5 * rounds,
                    "during_a_write": landed,
                    "resumed_and_finished": rounds,
                }
            ),
            flush=True,
        )
