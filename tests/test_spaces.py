"""Spaces as gymnasium declares them: a Discrete(n, start=s) action space gets actions s..s+n-1 from
every script and tool that acts (the networks and the replay hold the indexes 0..n-1), and BC reads
a dataset's actions as the env takes them; SAC and BC act in a Box of any shape and bounds; an
observation space the networks cannot take is refused in one line that names the wrapper to use."""

import functools

import gymnasium as gym
import jax
import numpy as np
import pytest
from gymnasium.envs.classic_control import CartPoleEnv
from helpers import load_script, load_tool

dqn = load_script("dqn_prioritized")
sac = load_script("sac")
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


def vector_envs(env_id, num_envs, video=None):
    """An env factory as train() takes one: sync vector envs in SAME_STEP autoreset mode."""
    autoreset = {"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP}
    return gym.make_vec(env_id, num_envs, vectorization_mode="sync", vector_kwargs=autoreset)


shifted_envs = functools.partial(vector_envs, ID)


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


class GridReach(gym.Env):
    """Actions are a Box of shape (2, 3) with bounds that differ per entry; reward -|a - target|.
    An action outside the space, or of another shape, is an error."""

    taken = []  # every action any instance was given
    observation_space = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
    action_space = gym.spaces.Box(
        np.array([[-2, 0, 10], [-1, -1, -5]], np.float32), np.array([[2, 1, 20], [0, 1, 5]], np.float32)
    )

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self.np_random.uniform(-1, 1, 4).astype(np.float32), {}

    def step(self, action):
        if not self.action_space.contains(np.asarray(action, np.float32)):
            raise ValueError(f"action {action!r} outside {self.action_space}")
        GridReach.taken.append(np.array(action))
        self.t += 1
        target = (self.action_space.low + self.action_space.high) / 2
        obs = self.np_random.uniform(-1, 1, 4).astype(np.float32)
        return obs, -float(np.abs(action - target).sum()), False, self.t >= 20, {}


class DictObs(GridReach):
    observation_space = gym.spaces.Dict({"x": gym.spaces.Box(-1.0, 1.0, (4,), np.float32)})


GRID, DICT = "GridReach-v0", "DictObsReach-v0"
for name, cls in ((GRID, GridReach), (DICT, DictObs)):
    if name not in gym.registry:
        gym.register(name, entry_point=cls)


def test_sac_acts_and_evaluates_inside_a_box_of_shape_2_by_3(tmp_path):
    args = sac.Args(
        env_id=GRID,
        total_timesteps=400,
        learning_starts=200,
        batch_size=32,
        hidden_sizes=(16, 16),
        eval_every=200,
        eval_episodes=2,
        checkpoint_every=0,
        run_dir=str(tmp_path / "run"),
    )
    result = sac.train(args)  # an action of another shape or outside the bounds raises inside the env
    assert result["global_step"] == 400 and np.isfinite(result["eval_mean"])
    low, high = GridReach.action_space.low, GridReach.action_space.high
    flat = np.tanh(np.random.default_rng(0).normal(size=(5, 6)))
    np.testing.assert_allclose(sac.from_env_action(sac.to_env_action(flat, low, high), low, high), flat, atol=1e-5)


def test_bc_trains_on_box_actions_of_shape_2_by_3_and_acts_inside_them(tmp_path):
    rng, n = np.random.default_rng(0), 200
    low, high = GridReach.action_space.low, GridReach.action_space.high
    terminals = np.zeros(n, bool)
    terminals[-1] = True
    np.savez(
        tmp_path / "grid.npz",
        observations=rng.uniform(-1, 1, (n, 4)).astype(np.float32),
        actions=rng.uniform(low, high, (n, 2, 3)).astype(np.float32),  # as the env takes them
        rewards=np.zeros(n, np.float32),
        terminals=terminals,
        timeouts=np.zeros(n, bool),
        **{"metadata/env_id": np.array(GRID)},
    )
    args = bc.Args(
        dataset=[str(tmp_path / "grid.npz")],
        total_updates=100,
        batch_size=32,
        eval_every=50,
        eval_episodes=2,
        run_dir=str(tmp_path / "run"),
    )
    data = bc.load_training_data(args)
    assert data.out_dim == 6 and data.dataset.actions.shape == (n, 6)
    result = bc.train(args)  # evaluation acts in the env: outside its space it raises
    assert np.isfinite(result["eval_mean"])


class DictCartPole(ShiftedCartPole):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.observation_space = gym.spaces.Dict({"x": self.inner.observation_space})


DICT_CARTPOLE = "DictCartPole-v1"
if DICT_CARTPOLE not in gym.registry:
    gym.register(DICT_CARTPOLE, entry_point=DictCartPole)


@pytest.mark.parametrize("script", [dqn, apex, sac, bc], ids=["dqn", "apex", "sac", "bc"])
def test_observations_the_networks_cannot_take_are_refused_in_one_line_naming_the_wrapper(script):
    env_id = DICT if script in (sac, bc) else DICT_CARTPOLE
    with pytest.raises(script.ConfigError, match="Dict.*FlattenObservation") as caught:
        script.make_env(env_id, 1)
    assert "\n" not in str(caught.value)


def test_a_custom_factorys_observations_the_networks_cannot_take_are_refused():
    factory = functools.partial(vector_envs, DICT_CARTPOLE)
    with pytest.raises(dqn.ConfigError, match="Dict.*FlattenObservation"):
        dqn.train(dqn.Args(env_id=DICT_CARTPOLE, total_timesteps=10, checkpoint_every=0), factory)
    with pytest.raises(sac.ConfigError, match="Dict.*FlattenObservation"):
        sac.train(sac.Args(env_id=DICT, total_timesteps=10, checkpoint_every=0), functools.partial(vector_envs, DICT))


def test_bc_maps_each_entry_of_a_box_action_to_its_own_bounds_and_back(tmp_path):
    """A dataset whose every action is one (2, 3) matrix: the policy's target is that matrix scaled
    entry by entry to [-1, 1], flat; acting with exactly that target gives the env the matrix back."""
    n, low, high = 40, GridReach.action_space.low, GridReach.action_space.high
    a0 = low + np.array([[0.1, 0.2, 0.3], [0.6, 0.7, 0.9]], np.float32) * (high - low)
    terminals = np.zeros(n, bool)
    terminals[-1] = True
    arrays = dict(observations=np.zeros((n, 4), np.float32), actions=np.repeat(a0[None], n, 0))
    arrays.update(rewards=np.zeros(n, np.float32), terminals=terminals, timeouts=np.zeros(n, bool))
    np.savez(tmp_path / "one.npz", **arrays, **{"metadata/env_id": np.array(GRID)})
    data = bc.load_training_data(bc.Args(dataset=[str(tmp_path / "one.npz")]))
    target = (2 * (a0 - low) / (high - low) - 1).reshape(-1)
    np.testing.assert_allclose(data.dataset.actions, np.repeat(target[None], n, 0), atol=1e-6)
    GridReach.taken.clear()
    stats = bc.obs_stats(data.dataset.observations, True)
    act = lambda params, obs, mean, std: np.repeat(target[None], len(obs), 0)  # noqa: E731
    bc.evaluate(act, None, stats, functools.partial(bc.make_env, GRID), 2, 5)
    assert len(GridReach.taken) == 40
    np.testing.assert_allclose(np.stack(GridReach.taken), np.repeat(a0[None], 40, 0), rtol=1e-5)
