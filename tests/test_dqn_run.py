"""Whole-script behaviour: checkpoints and resume, signals, eval-only, bad input, imports."""

import csv
import os
import signal
import subprocess
import sys
import time

import gymnasium as gym
import numpy as np
import pytest
from helpers import ROOT, import_in_fresh_process, load_script

dqn = load_script("dqn_prioritized")
SCRIPT = os.path.join(ROOT, "algos", "dqn_prioritized.py")

# Small and fast: a few thousand steps of CartPole.
FAST = [
    "--hidden-sizes",
    "32",
    "32",
    "--learning-starts",
    "200",
    "--batch-size",
    "32",
    "--buffer-size",
    "5000",
    "--updates-per-call",
    "4",
    "--eval-episodes",
    "2",
    "--eval-every",
    "1000",
    "--log-every",
    "500",
]


def run_cli(argv):
    return dqn.cli(argv)


def read_eval(run_dir):
    with open(os.path.join(run_dir, "eval.csv")) as f:
        return list(csv.DictReader(f))


def test_import_has_no_side_effects():
    out = import_in_fresh_process("dqn_prioritized")
    assert out.returncode == 0 and "clean" in out.stdout, out.stderr


def test_checkpoint_round_trip_and_resume_continue_counters(tmp_path):
    run_dir = str(tmp_path / "run")
    assert run_cli(FAST + ["--total-timesteps", "2000", "--checkpoint-every", "1000", "--run-dir", run_dir]) == 0
    meta, arrays = dqn.load_npz(run_dir, "checkpoint")
    assert meta["global_step"] == 2000
    first_sgd = int(arrays["train_state/sgd_steps"])
    assert first_sgd == (2000 - 200) // 2 // 4 * 4  # replay ratio kept, in whole calls of 4
    stored = len(arrays["replay/priority"])
    assert stored > 1900  # n-step keeps at most n-1 per env pending
    assert os.path.isfile(os.path.join(run_dir, "model.npz"))

    # Restoring the saved train state into a fresh template gives back the same arrays.
    args = dqn.Args(hidden_sizes=(32, 32))
    net = dqn.QNetwork(2, args.hidden_sizes)
    template = dqn.init_train_state(net, dqn.make_optimizer(args, 10), (4,), dqn.jax.random.PRNGKey(9))
    restored = dqn.restore_tree(template, arrays, "train_state/", run_dir)
    for name, value in dqn.tree_arrays("train_state/", restored).items():
        np.testing.assert_array_equal(value, arrays[name])

    # Resume and extend to 3000 steps: counters continue, evaluation goes on from 2000.
    assert run_cli(["--resume", run_dir, "--total-timesteps", "3000"]) == 0
    meta2, arrays2 = dqn.load_npz(run_dir, "checkpoint")
    assert meta2["global_step"] == 3000
    assert int(arrays2["train_state/sgd_steps"]) == (3000 - 200) // 2 // 4 * 4
    assert meta2["episodes"] > meta["episodes"]
    steps = [int(r["step"]) for r in read_eval(run_dir)]
    assert steps == sorted(steps) and steps[-1] == 3000 and 2000 in steps
    with open(os.path.join(run_dir, "args.json")) as f:
        assert '"total_timesteps": 3000' in f.read()


def test_eval_only_loads_model(tmp_path, capsys):
    run_dir = str(tmp_path / "run")
    assert run_cli(FAST + ["--total-timesteps", "600", "--eval-epsilon", "0.25", "--run-dir", run_dir]) == 0
    capsys.readouterr()
    model = os.path.join(run_dir, "model.npz")
    assert run_cli(["--eval-only", "--load", model, "--eval-episodes", "3"]) == 0
    assert "over 3 episodes (epsilon 0.25)" in capsys.readouterr().out  # the run's own protocol
    assert run_cli(["--eval-only", "--load", model, "--eval-episodes", "2", "--eval-epsilon", "0.5"]) == 0
    assert "over 2 episodes (epsilon 0.5)" in capsys.readouterr().out  # unless given


def test_sigterm_writes_checkpoint_and_resume_continues(tmp_path):
    run_dir = str(tmp_path / "run")
    proc = subprocess.Popen(
        [sys.executable, SCRIPT]
        + FAST
        + ["--total-timesteps", "1000000", "--checkpoint-every", "0", "--run-dir", run_dir],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=str(tmp_path),
    )
    deadline = time.time() + 120
    while time.time() < deadline and not os.path.exists(os.path.join(run_dir, "eval.csv")):
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "Traceback" not in err and "--resume" in out
    stopped = dqn.load_npz(run_dir, "checkpoint")[0]["global_step"]
    assert 1000 <= stopped < 1_000_000
    assert run_cli(["--resume", run_dir, "--total-timesteps", str(stopped + 500)]) == 0
    assert dqn.load_npz(run_dir, "checkpoint")[0]["global_step"] == stopped + 500


# --- bad input: one clear line, non-zero exit, no traceback ------------------------------------


class MatrixEnv(gym.Env):
    observation_space = gym.spaces.Box(-1.0, 1.0, (3, 3), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, seed=None, options=None):
        return self.observation_space.sample(), {}

    def step(self, action):
        return self.observation_space.sample(), 0.0, False, False, {}


gym.register("TestMatrixObs-v0", entry_point=MatrixEnv)


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--env-id", "Pendulum-v1"], "Discrete actions"),
        (["--env-id", "NoSuchEnv-v9"], "cannot make env"),
        (["--env-id", "TestMatrixObs-v0"], "flat vectors or uint8 images"),
        (["--max-episode-frames", "0"], "--max-episode-frames must be positive"),
        (["--preset", "atari", "--adam-eps", "-1"], "--adam-eps must be positive"),
        (["--batch-size", "512", "--buffer-size", "256"], "larger than --buffer-size"),
        (["--buffer-size", "0"], "--buffer-size must be positive"),
        (["--num-envs", "-1"], "--num-envs must be positive"),
        (["--gamma", "1.5"], "--gamma must be in"),
        (["--resume", "/nonexistent/run"], "no args.json"),
        (["--eval-only", "--load", "/nonexistent/model.npz"], "no such file"),
        (["--eval-only"], "needs --load"),
    ],
)
def test_bad_input_is_one_clear_line(argv, message, capsys):
    assert run_cli(argv) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1 and "Traceback" not in err


def test_bad_input_from_the_command_line_has_no_traceback():
    out = subprocess.run(
        [sys.executable, SCRIPT, "--env-id", "MountainCarContinuous-v0"], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 2
    assert "Traceback" not in out.stderr and "Discrete actions" in out.stderr
