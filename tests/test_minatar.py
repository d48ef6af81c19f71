"""MinAtar in dqn_prioritized.py (issue 14): feature planes told apart by their space, the MinAtar
paper's network, its centred RMSProp checked against torch's update rule, and --preset minatar."""

import dataclasses
import sys

import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import load_script

dqn = load_script("dqn_prioritized")


class Planes(gym.Env):
    """Bool feature planes under a name that says nothing: recognised by the space alone."""

    observation_space = gym.spaces.Box(0.0, 1.0, (10, 10, 5), np.bool_)  # as MinAtar declares its own
    action_space = gym.spaces.Discrete(2)

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros((10, 10, 5), bool), {}

    def step(self, action):
        return self.np_random.random((10, 10, 5)) < 0.1, 0.0, False, False, {}


gym.register("TestPlanes-v0", entry_point=Planes, max_episode_steps=20)


@pytest.mark.parametrize(
    "env_id, channels", [("MinAtar/Breakout-v1", 4), ("MinAtar/Seaquest-v1", 10), ("TestPlanes-v0", 5)]
)
def test_planes_are_kept_as_they_are(env_id, channels):
    envs = dqn.make_env(env_id, 2)
    space = envs.single_observation_space
    envs.action_space.seed(0)
    obs, _ = envs.reset(seed=0)
    envs.close()
    assert dqn.is_planes(space) and not dqn.is_image(space)
    assert space.shape == (10, 10, channels) and obs.dtype == np.bool_ and obs.shape == (2, 10, 10, channels)
    replay, nstep = dqn.make_replay(dqn.Args(buffer_size=1000, batch_size=8), space)
    assert replay.frames is None  # no frame store, no stack: the planes themselves, 1 byte a cell
    assert replay.staging["obs"].dtype == np.bool_ and replay.staging["obs"].shape[1:] == (10, 10, channels)
    assert nstep.obs.dtype == np.bool_


def test_network_is_the_minatar_papers():
    """One 3x3 convolution with 16 filters, stride 1, no padding (10x10 -> 8x8), 128 units, |A| outputs."""
    network = dqn.QNetwork(3, dqn.MINATAR_PRESET["hidden_sizes"], planes=True)
    params = network.init(jax.random.PRNGKey(0), jnp.zeros((1, 10, 10, 4)))["params"]
    shapes = {name: {k: v.shape for k, v in layer.items()} for name, layer in params.items()}
    assert shapes == {
        "Conv_0": {"kernel": (3, 3, 4, 16), "bias": (16,)},
        "Dense_0": {"kernel": (8 * 8 * 16, 128), "bias": (128,)},
        "Dense_1": {"kernel": (128, 3), "bias": (3,)},
    }
    q = network.apply({"params": params}, np.ones((5, 10, 10, 4), bool))
    assert q.shape == (5, 3) and np.isfinite(np.asarray(q)).all()


def test_rmsprop_is_torchs_centred_rmsprop():
    """torch.optim.RMSprop(lr, alpha=0.95, eps=0.01, centered=True), which the MinAtar paper's DQN
    used (the script's fixed settings for --optimizer rmsprop), in numpy: v = a v + (1-a) g^2;
    m = a m + (1-a) g; theta -= lr g / (sqrt(v - m^2) + eps)."""
    args = dqn.Args(**dqn.MINATAR_PRESET, max_grad_norm=1e9)
    optimizer = dqn.make_optimizer(args, 100)
    rng = np.random.default_rng(0)
    theta = rng.normal(size=(4, 3)).astype(np.float32)
    state = optimizer.init(jnp.asarray(theta))
    v, m, ref = np.zeros_like(theta, np.float64), np.zeros_like(theta, np.float64), theta.astype(np.float64)
    params = jnp.asarray(theta)
    for _ in range(5):
        g = rng.normal(size=theta.shape).astype(np.float32) * rng.uniform(0.01, 2.0)
        updates, state = optimizer.update(jnp.asarray(g), state, params)
        params = params + updates
        a, eps = 0.95, 0.01
        v = a * v + (1 - a) * g.astype(np.float64) ** 2
        m = a * m + (1 - a) * g
        ref = ref - args.learning_rate * g / (np.sqrt(v - m**2) + eps)
    np.testing.assert_allclose(np.asarray(params), ref, rtol=1e-5, atol=1e-7)
    # Not Adam, and eps outside the root (inside it, the step would differ by far more than that).
    assert not np.allclose(np.asarray(params), theta, atol=1e-6)


def test_preset_minatar_from_the_command_line():
    args = dqn.parse_args(["--env-id", "MinAtar/Freeway-v1", "--preset", "minatar"])
    assert args.preset == "minatar" and args.optimizer == "rmsprop" and args.learning_rate == 2.5e-4
    assert (args.buffer_size, args.batch_size, args.train_frequency, args.target_network_frequency) == (
        100_000,
        32,
        1,
        1_000,
    )
    assert args.end_e == 0.1 and dqn.exploration_horizon(args) == 100_000
    assert args.n_step == 1 and args.prioritized  # the paper's 1-step targets, PER on top (Asterix: docs)
    typed = dqn.parse_args(["--preset=minatar", "--batch-size", "64", "--no-prioritized"])
    assert typed.batch_size == 64 and not typed.prioritized and typed.buffer_size == 100_000


def test_minatar_without_the_package_is_one_line(monkeypatch, capsys):
    for module in ("minatar", "minatar.gym"):  # `import minatar.gym` raises ImportError, as when not installed
        monkeypatch.setitem(sys.modules, module, None)
    monkeypatch.delitem(gym.registry, "MinAtar/Asterix-v1", raising=False)
    assert dqn.cli(["--env-id", "MinAtar/Asterix-v1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "pip install minatar" in err, err


@pytest.mark.parametrize("preset, horizon, end", [("minatar", 100_000, 0.1), ("atari", 1_000_000, 0.01)])
def test_a_presets_exploration_is_in_steps_whatever_the_budget(preset, horizon, end):
    """MinAtar: 1 -> 0.1 over 100k frames; Atari: 1 -> 0.01 over 1M agent steps; at 1M and 5M steps
    alike (a fraction of the budget would put the midpoint elsewhere). Without the preset, and in a
    run folder written before --exploration-steps, the fraction of the budget still holds."""
    for budget in ("1000000", "5000000"):
        args = dqn.parse_args(["--preset", preset, "--total-timesteps", budget])
        horizon_of_run = dqn.exploration_horizon(args)
        epsilon = [dqn.linear_schedule(args.start_e, args.end_e, horizon_of_run, t) for t in (0, horizon // 2, horizon)]
        assert epsilon == pytest.approx([1.0, (1 + end) / 2, end])
    typed = dqn.parse_args(["--preset", preset, "--exploration-fraction", "0.5", "--total-timesteps", "1000000"])
    assert dqn.exploration_horizon(typed) == 500_000  # a typed fraction wins over the preset's steps
    saved = {k: v for k, v in dataclasses.asdict(dqn.Args(total_timesteps=50_000)).items() if k != "exploration_steps"}
    assert dqn.exploration_horizon(dqn.args_from_json(saved)) == 0.2 * 50_000
