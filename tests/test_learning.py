"""Learning, tested for real: seeded end-to-end runs that must reach a return threshold."""

import csv
import dataclasses
import functools
import os

import gymnasium as gym
import jax
import numpy as np
import pytest
from helpers import ROOT, load_script, load_tool


def test_dqn_default_run_solves_cartpole_and_ends_solved(tmp_path):
    """Solved = an evaluation (10 greedy episodes) averages >= 475 within 100k steps, and so does the
    last one: the end of a run must be as good as its best. Runs are not reproducible (cpprb seeds its
    sampler from the OS; the priority writer races it), and about 1 default run in 25 misses (3 of 80
    seeds on 2026-12-05, docs/dqn.md), so a run that misses gets one more try. With independent tries
    this fails in about 1 CI run of 700; the tries share the seed, so likely somewhat more often."""
    dqn = load_script("dqn_prioritized")
    runs = []
    for attempt in range(2):
        result = dqn.train(dqn.Args(seed=1, run_dir=str(tmp_path / f"dqn{attempt}")))
        assert result["global_step"] <= 100_000
        with open(os.path.join(result["run_dir"], "eval.csv")) as f:
            evals = [float(row["mean"]) for row in csv.DictReader(f)]
        assert len(evals) == 10, evals
        runs.append(evals)
        if max(evals) >= 475 and evals[-1] >= 475:
            break
    assert max(runs[-1]) >= 475 and runs[-1][-1] >= 475, runs


def test_sac_default_run_reaches_pendulum_threshold(tmp_path):
    sac = load_script("sac")
    result = sac.train(sac.Args(seed=1, run_dir=str(tmp_path / "sac")))
    assert result["global_step"] <= 20_000
    assert result["eval_mean"] >= -200, result


@pytest.mark.parametrize(
    "name", ["pendulum-sac-expert.hdf5", "cartpole-dqn-expert.hdf5", "halfcheetah-sac-medium.hdf5"]
)
def test_bc_on_shipped_datasets_reaches_90_percent_of_the_data(tmp_path, name):
    """The default run, then 20 evaluation episodes of the saved model: the median episode must
    score >= 90% of the data's mean (normalised). The median, not the mean: BC from the 10-episode
    HalfCheetah set now and then stumbles off the data and ends an episode far below it, and one or
    two such episodes decide a mean of 10 (CI failed once so: 83.5 against 84.8, 2 of 10 episodes
    down). Runs are reproducible on one CPU but not across CPUs (XLA compiles for the CPU's vector
    width); over seeds 1-6 compiled for 4 widths here (--xla_cpu_max_isa native/AVX2/AVX/SSE4_2),
    10 of 480 episodes scored under 50, the medians of 20 were 96.1-99.2 against a threshold of 84.8,
    and the mean of 20 would have failed once (82.0, 4 episodes down)."""
    bc = load_script("bc_offline")
    path = os.path.join(ROOT, "data", name)
    meta = bc.read_dataset(path).metadata
    lo, hi = meta["ref_min_score"], meta["ref_max_score"]
    data_score = 100 * (meta["mean_return"] - lo) / (hi - lo)
    args = bc.Args(dataset=[path], seed=1, run_dir=str(tmp_path / "bc"))
    result = bc.train(dataclasses.replace(args, eval_every=args.total_updates))  # no evaluations midway
    # 20 episodes of the saved model, as tools/bc_evaluate.py runs them.
    meta, policy, params, stats = load_tool("bc_evaluate").load_model(os.path.join(result["run_dir"], "model.npz"))
    env_fn = functools.partial(bc.make_env, meta["env_id"])
    returns = bc.evaluate(bc.make_act(policy, meta["mode"]), params, stats, env_fn, 20, args.seed + 10_000)
    scores = 100 * (returns - lo) / (hi - lo)
    assert len(scores) == 20 and np.median(scores) >= 0.9 * data_score, (np.round(scores, 1), data_score)


class MotionEnv(gym.Env):
    """Pixels that only a frame stack can read: a 6x6 dot moves 3 px per step, left or right (chosen
    at reset); reward 1 for naming the direction, 10 steps per episode. One frame cannot tell the
    direction (expected return 5, as random); four stacked frames can from the second step on
    (9.5 at best)."""

    observation_space = gym.spaces.Box(0, 255, (84, 84), np.uint8)
    action_space = gym.spaces.Discrete(2)

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.direction = int(self.np_random.integers(2))
        self.x, self.y = int(self.np_random.integers(24, 55)), int(self.np_random.integers(10, 70))
        self.t = 0
        return self._obs(), {}

    def _obs(self):
        obs = np.zeros((84, 84), np.uint8)
        obs[self.y : self.y + 6, self.x : self.x + 6] = 255
        return obs

    def step(self, action):
        reward = float(action == self.direction)
        self.x += 3 if self.direction else -3
        self.t += 1
        return self._obs(), reward, self.t >= 10, False, {}


gym.register("TestMotion-v0", entry_point=MotionEnv)


def test_dqn_pixels_learn_a_task_that_needs_the_frame_stack(tmp_path):
    """The CNN, the frame store and the stacks decoded from it, end to end: 2,500 steps must beat
    anything a single frame allows (5) by a wide margin."""
    dqn = load_script("dqn_prioritized")
    args = dqn.Args(
        env_id="TestMotion-v0",
        seed=1,
        total_timesteps=2_500,
        learning_starts=500,
        buffer_size=5_000,
        batch_size=16,
        train_frequency=1,
        learning_rate=5e-4,
        anneal_lr=False,
        gamma=0.5,
        n_step=1,
        target_network_frequency=100,
        hidden_sizes=(64,),
        updates_per_call=8,
        exploration_fraction=0.3,
        eval_every=500,
        checkpoint_every=0,
        log_every=500,
        run_dir=str(tmp_path / "motion"),
    )
    result = dqn.train(args)
    assert result["eval_mean"] >= 8.5, result


def test_dqn_learns_minatar_breakout(tmp_path):
    """MinAtar (issue 14), the pixel-like path that learns on a CPU: --preset minatar on
    MinAtar/Breakout-v1 for 30k steps (16 envs, learning from 5k, epsilon still 0.73 at the end: about
    45 s alone on a 2-core CPU) must reach a greedy evaluation (10 episodes, one every 5k steps) of 2.0.
    A uniformly random policy averages 0.3 (206 episodes measured: none above 3, so a mean of 10 at 2.0
    is out of its reach; this test measures it again below). The test sets 3-step returns, which learn
    sooner. Seeds 1-4 of this test's flags on 2026-12-07 (7197824): best evaluations 3.3, 4.3, 3.1, 2.6
    by 30k (at 15k: 2.9, 0.4, 1.9, 2.4, too close to call; 50k, the length before, took 127 s in the
    suite); 1-step learning is checked at 1M on a TPU (docs/atari_minatar.md)."""
    dqn = load_script("dqn_prioritized")
    flags = {
        **dqn.MINATAR_PRESET,
        "n_step": 3,
        "total_timesteps": 30_000,
        "eval_every": 5_000,
        "checkpoint_every": 0,
    }
    args = dqn.Args(**flags, preset="minatar", env_id="MinAtar/Breakout-v1", seed=1, run_dir=str(tmp_path / "m"))
    result = dqn.train(args)
    with open(os.path.join(result["run_dir"], "eval.csv")) as f:
        evals = [float(row["mean"]) for row in csv.DictReader(f)]
    assert max(evals) >= 2.0, evals
    # The random policy through the same evaluation code (epsilon 1), 10 groups of 10 episodes.
    env_fn = functools.partial(dqn.make_env, "MinAtar/Breakout-v1")
    network = dqn.QNetwork(3, args.hidden_sizes, planes=True)
    params = network.init(jax.random.PRNGKey(0), np.zeros((1, 10, 10, 4), np.float32))
    act = dqn.make_act(network.apply, 3)
    random = [dqn.evaluate(act, params, env_fn, 10, 1.0, seed).mean() for seed in range(10)]
    assert max(random) < 2.0 <= max(evals), (random, evals)
