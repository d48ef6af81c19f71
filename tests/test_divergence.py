"""A learner that produces a non-finite TD error (or loss) stops the run with one line naming the
SGD step, in all three scripts, and never writes that value into the sum tree; and BC's nll with
prioritized sampling, whose loss goes negative, keeps a finite score (issue 11)."""

import glob
import os

import gymnasium as gym
import numpy as np
import pytest
from helpers import ROOT, load_script
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

dqn, sac, bc = load_script("dqn_prioritized"), load_script("sac"), load_script("bc_offline")


class PoisonedRewards(gym.Env):
    """A trivial task whose reward becomes NaN from the 400th step of each env on: whatever the
    learner does, a TD target built from such a transition is not finite."""

    def __init__(self, continuous: bool = False):
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
        self.action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32) if continuous else gym.spaces.Discrete(2)
        self.t = 0

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(3, np.float32), {}

    def step(self, action):
        self.t += 1
        reward = np.nan if self.t >= 400 else 0.0
        return np.full(3, (self.t % 7) / 7, np.float32), reward, False, self.t % 50 == 0, {}


gym.register("TestPoisonedRewards-v0", entry_point=PoisonedRewards)
gym.register("TestPoisonedRewardsBox-v0", entry_point=PoisonedRewards, kwargs={"continuous": True})

COMMON = [
    "--hidden-sizes",
    "16",
    "--learning-starts",
    "200",
    "--batch-size",
    "32",
    "--buffer-size",
    "2000",
    "--updates-per-call",
    "4",
    "--eval-every",
    "100000",
    "--total-timesteps",
    "3000",
]


@pytest.mark.parametrize(
    "script,env_id,extra",
    [
        (dqn, "TestPoisonedRewards-v0", ["--prioritized"]),
        (dqn, "TestPoisonedRewards-v0", ["--no-prioritized"]),
        (sac, "TestPoisonedRewardsBox-v0", ["--prioritized"]),
        (sac, "TestPoisonedRewardsBox-v0", ["--no-prioritized"]),
    ],
    ids=["dqn-per", "dqn-uniform", "sac-per", "sac-uniform"],
)
def test_a_non_finite_td_error_ends_the_run_in_one_line_naming_the_step(script, env_id, extra, tmp_path, capsys):
    run_dir = str(tmp_path / "run")
    assert script.cli(COMMON + extra + ["--env-id", env_id, "--run-dir", run_dir]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert "diverged" in err and "SGD step" in err
    step = int(err.split("SGD step ")[1].split(";")[0])
    # The poisoned transitions enter the replay from env step 400; learning starts at 200 with
    # one SGD step per env step (SAC) or per 2 (DQN), fused 4 per call. A call's batches may be
    # drawn after they were asked for (the prefetch thread runs late under load), so the call
    # made at env step 400, whose first step is 4 before that step's count, may hold one.
    per_step = 2 if script is dqn else 1
    assert (400 - 200) // per_step - 4 < step <= (3000 - 200) // per_step
    # A diverged run saves neither a model nor a checkpoint of the diverged parameters.
    assert not os.path.exists(os.path.join(run_dir, "model.npz"))
    assert not os.path.exists(os.path.join(run_dir, "checkpoint.npz"))
    assert os.path.isfile(os.path.join(run_dir, "args.json"))  # the folder itself was written
    # The episodes before the failure reached the event file (written at exit, before any log
    # tick flushed them), without waiting for the garbage collector to close it.
    (events,) = glob.glob(os.path.join(run_dir, "events.out.tfevents.*"))
    acc = EventAccumulator(events, size_guidance={"scalars": 0})
    acc.Reload()
    assert len(acc.Scalars("charts/episodic_return")) >= 400 // 50  # episodes end every 50 steps


def test_bc_divergence_is_one_line_naming_the_step(monkeypatch, tmp_path, capsys):
    real = bc.per_example_loss

    def always_nan(policy, mode, params, obs, action):
        loss, priority = real(policy, mode, params, obs, action)
        return loss * np.nan, priority * np.nan  # every step: the first call is already bad

    monkeypatch.setattr(bc, "per_example_loss", always_nan)
    data = os.path.join(ROOT, "data", "pendulum-sac-expert.hdf5")
    assert (
        bc.cli(
            [
                "--dataset",
                data,
                "--total-updates",
                "100",
                "--updates-per-call",
                "10",
                "--batch-size",
                "32",
                "--hidden-sizes",
                "16",
                "--run-dir",
                str(tmp_path / "run"),
            ]
        )
        == 1
    )
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "diverged" in err and "SGD step 1;" in err, err


def test_bc_nll_with_prioritized_sampling_keeps_a_finite_score(tmp_path, capsys):
    """Before issue 11 the negative nll went into cpprb as a priority and the score came out NaN."""
    data = os.path.join(ROOT, "data", "pendulum-sac-expert.hdf5")
    run_dir = str(tmp_path / "run")
    assert (
        bc.cli(
            [
                "--dataset",
                data,
                "--loss",
                "nll",
                "--prioritized",
                "--total-updates",
                "2000",
                "--eval-episodes",
                "2",
                "--eval-every",
                "100000",
                "--run-dir",
                run_dir,
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    score = float(out.split("normalised score ")[1].split(";")[0])
    assert np.isfinite(score)
    priority = bc.load_npz(run_dir, "checkpoint")[1]["priority"]
    assert np.all(np.isfinite(priority)) and np.all(priority >= 0)
