"""Kills with real processes (issue 12): a training run is SIGKILLed at random moments, some
of them in the middle of a checkpoint write, and resumed each time. Every resume starts from
the last complete checkpoint with consistent counters and replay, and the run finishes."""

import csv
import os
import random
import signal
import subprocess
import sys
import time

import pytest
from helpers import ROOT, load_script

dqn = load_script("dqn_prioritized")
SCRIPT = os.path.join(ROOT, "algos", "dqn_prioritized.py")
LEARNING_STARTS, TRAIN_FREQUENCY, K, N_STEP = 200, 2, 4, 3
TOTAL = 20_000
ARGS = ["--hidden-sizes", "32", "32", "--learning-starts", str(LEARNING_STARTS), "--batch-size", "32",
        "--buffer-size", "50000", "--updates-per-call", str(K), "--train-frequency", str(TRAIN_FREQUENCY),
        "--n-step", str(N_STEP), "--eval-episodes", "1", "--eval-every", "1000", "--log-every", "500",
        "--checkpoint-every", "250", "--total-timesteps", str(TOTAL)]


def start(argv, cwd):
    return subprocess.Popen([sys.executable, SCRIPT] + argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=cwd)


def temp_files(run_dir):
    return [n for n in os.listdir(run_dir) if ".tmp." in n] if os.path.isdir(run_dir) else []


def saved_step(run_dir):
    try:
        return dqn.load_npz(run_dir, "checkpoint")[0]["global_step"]
    except dqn.ConfigError:  # none yet
        return -1


def kill_when(proc, run_dir, during_write, rng, after_step, timeout=120):
    """SIGKILL the run once it has checkpointed past `after_step` (so each resume is seen to make
    progress): as soon as a checkpoint's temp file is seen (during_write), or at a random moment.
    Returns whether a temp file was there at the kill."""
    deadline = time.time() + timeout
    while saved_step(run_dir) <= after_step and proc.poll() is None and time.time() < deadline:
        time.sleep(0.01)
    assert proc.poll() is None, "the run ended before it was killed: " + proc.communicate()[1][-2000:]
    assert saved_step(run_dir) > after_step, "no new checkpoint"
    if during_write:
        while time.time() < deadline and proc.poll() is None and not temp_files(run_dir):
            pass  # busy wait: a write takes a few milliseconds
    else:
        time.sleep(rng.uniform(0.0, 1.5))
    caught = bool(temp_files(run_dir))
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    return caught


def check_checkpoint(run_dir, resumes):
    """The checkpoint on disk loads, and its counters and replay agree with each other."""
    meta, arrays = dqn.load_npz(run_dir, "checkpoint")
    step = meta["global_step"]
    assert step % 250 == 0 and 0 < step <= TOTAL
    # SGD steps: the replay ratio, in whole fused calls
    assert int(arrays["train_state/sgd_steps"]) == (step - LEARNING_STARTS) // TRAIN_FREQUENCY // K * K
    # One row per env step, less the n-1 an unfinished n-step window holds; a resume restarts
    # the envs, so the window open at each kill is lost (the replay itself is not).
    rows = len(arrays["replay/priority"])
    assert step - (N_STEP - 1) * (resumes + 1) <= rows <= step
    return step


def test_sigkill_at_random_moments_then_resume_until_done(tmp_path):
    rng = random.Random(12)
    run_dir = str(tmp_path / "run")
    proc = start(ARGS + ["--run-dir", run_dir], str(tmp_path))
    steps, caught = [0], 0
    for i in range(5):
        during_write = i % 2 == 0
        caught += kill_when(proc, run_dir, during_write, rng, steps[-1])
        steps.append(check_checkpoint(run_dir, i))
        proc = start(["--resume", run_dir], str(tmp_path))
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-2000:]
    assert "Traceback" not in err
    assert caught >= 1, "no kill landed during a checkpoint write"
    assert steps == sorted(set(steps))  # each resume went on from where the last one was
    meta, _ = dqn.load_npz(run_dir, "checkpoint")
    assert meta["global_step"] == TOTAL and check_checkpoint(run_dir, 5) == TOTAL
    assert os.path.isfile(os.path.join(run_dir, "model.npz")) and not temp_files(run_dir)
    with open(os.path.join(run_dir, "eval.csv")) as f:
        evals = [int(r["step"]) for r in csv.DictReader(f)]
    assert evals == sorted(set(evals)) and evals[-1] == TOTAL  # one row per step, none twice
