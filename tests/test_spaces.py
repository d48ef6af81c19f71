"""Spaces as gymnasium declares them: a Discrete(n, start=s) action space gets actions s..s+n-1 from
every script and tool that acts (the networks and the replay hold the indexes 0..n-1), and BC reads
a dataset's actions as the env takes them."""

import functools

import gymnasium as gym
import jax
import numpy as np
import pytest
from gymnasium.envs.classic_control import CartPoleEnv
from helpers import load_script, load_tool

dqn = load_script("dqn_prioritized")
apex = load_script("apex_dqn")
bc = load_script("bc_offline")
START = -1


class ShiftedCartPole(gym.Env):
    """CartPole whose two actions are -1 and 0 (Discrete(2, start=-1)); any other action is an error."""

    def __init__(self, **kwargs):
        self.inner = CartPoleEnv(**kwargs)
        self.observation_space, self.action_space = self.inner.observation_space, gym.spaces.Discrete(2, start=START)

    def reset(self, *, seed=None, options=None):
        return self.inner.reset(seed=seed, options=options)

    def step(self, action):
        if not self.action_space.contains(action):
            raise ValueError(f"action {action!r} outside {self.action_space}")
        return self.inner.step(int(action) - START)


ID = "ShiftedCartPole-v1"
if ID not in gym.registry:
    gym.register(ID, entry_point=ShiftedCartPole, max_episode_steps=200)


def shifted_envs(num_envs, video=None):
    return gym.make_vec(
        ID, num_envs, vectorization_mode="sync", vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP}
    )


def test_dqn_acts_and_evaluates_inside_a_discrete_space_that_starts_at_minus_one(tmp_path):
    args = dqn.Args(
        env_id=ID,
        total_timesteps=600,
        learning_starts=200,
        batch_size=32,
        eval_every=300,
        eval_episodes=2,
        checkpoint_every=0,
        run_dir=str(tmp_path / "run"),
    )
    result = dqn.train(args, shifted_envs)  # an action outside the space raises inside the env
    assert result["global_step"] == 600 and np.isfinite(result["eval_mean"])


def test_dqn_dataset_keeps_the_actions_the_env_took():
    network = dqn.QNetwork(2, (16,))
    params = network.init(jax.random.PRNGKey(0), np.zeros((1, 4), np.float32))
    tool = load_tool("dqn_dataset")
    _, data = tool.rollout(dqn.make_act(network.apply, 2), params, shifted_envs, 3, 0.5, seed=1)
    assert set(np.unique(data["actions"])) == {START, START + 1}


def test_apex_actor_and_evaluation_act_inside_the_space():
    args = apex.Args(env_id=ID, hidden_sizes=(16,), chunk_size=50)
    network = apex.QNetwork(2, args.hidden_sizes)
    params = network.init(jax.random.PRNGKey(0), np.zeros((1, 4), np.float32))
    actor = apex.Actor(args, index=0, num_actors=1, seed=3)  # epsilon 0.4: both actions
    chunk = actor.collect([(0, (params, params))])
    assert set(np.unique(chunk["transitions"]["action"])) == {0, 1}  # the replay keeps indexes
    act = apex.make_act(network.apply, 2)
    returns = apex.evaluate(act, params, functools.partial(apex.make_env, ID), 2, 0.5, seed=4)
    assert returns.shape == (2,)


def write_npz(path, actions):
    rng = np.random.default_rng(0)
    n = len(actions)
    terminals = np.zeros(n, bool)
    terminals[-1] = True
    np.savez(
        path,
        observations=rng.normal(size=(n, 4)).astype(np.float32),
        actions=np.asarray(actions, np.int64),
        rewards=np.ones(n, np.float32),
        terminals=terminals,
        timeouts=np.zeros(n, bool),
        **{"metadata/env_id": np.array(ID)},
    )


def test_bc_reads_actions_as_the_env_takes_them_and_acts_inside_the_space(tmp_path):
    write_npz(tmp_path / "ok.npz", [START, START + 1] * 50)
    data = bc.load_training_data(bc.Args(dataset=[str(tmp_path / "ok.npz")]))
    assert set(np.unique(data.dataset.actions)) == {0, 1} and data.out_dim == 2  # the policy's classes
    policy = bc.Policy(2, (16,), False)
    params = policy.init(jax.random.PRNGKey(0), np.zeros((1, 4), np.float32))
    stats = bc.obs_stats(data.dataset.observations, True)
    returns = bc.evaluate(bc.make_act(policy, "discrete"), params, stats, functools.partial(bc.make_env, ID), 2, 5)
    assert returns.shape == (2,)
    write_npz(tmp_path / "zero_based.npz", [0, 1] * 50)  # 1 is not an action of Discrete(2, start=-1)
    with pytest.raises(bc.ConfigError, match=r"actions outside the env's -1\.\.0"):
        bc.load_training_data(bc.Args(dataset=[str(tmp_path / "zero_based.npz")]))
