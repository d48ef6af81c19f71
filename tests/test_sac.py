"""SAC: the tanh-Gaussian log-prob, the losses against numpy references, the temperature,
action rescaling, checkpoints, bad input and import hygiene."""

import functools
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import ROOT, import_in_fresh_process, load_script, load_tool

sac = load_script("sac")
SCRIPT = os.path.join(ROOT, "algos", "sac.py")
FAST = [
    "--hidden-sizes",
    "32",
    "32",
    "--learning-starts",
    "256",
    "--batch-size",
    "64",
    "--buffer-size",
    "5000",
    "--updates-per-call",
    "4",
    "--eval-episodes",
    "2",
    "--eval-every",
    "500",
    "--log-every",
    "250",
]


def test_tanh_gaussian_log_prob_matches_numerical_density():
    """Histogram the squashed samples and compare with exp(log pi) in 1-D."""
    mean, log_std = jnp.array([[0.3]]), jnp.array([[-0.2]])
    keys = jax.random.split(jax.random.PRNGKey(0), 200_000)
    a, logp = jax.vmap(lambda k: sac.sample_tanh_gaussian(mean, log_std, k))(keys)
    a, logp = np.asarray(a).ravel(), np.asarray(logp).ravel()
    hist, edges = np.histogram(a, bins=40, range=(-0.95, 0.95))
    empirical = hist / (len(a) * (edges[1] - edges[0]))
    centres = (edges[:-1] + edges[1:]) / 2
    # Exact density of a = tanh(u): N(atanh(a); mu, sigma) / (1 - a^2).
    sigma = np.exp(-0.2)
    u = np.arctanh(centres)
    exact = np.exp(-0.5 * ((u - 0.3) / sigma) ** 2) / (sigma * np.sqrt(2 * np.pi)) / (1 - centres**2)
    np.testing.assert_allclose(empirical, exact, rtol=0.08, atol=0.01)
    # And the returned log-probs equal the log of that exact density at the sample.
    u_s = np.arctanh(np.clip(a[:1000], -0.999999, 0.999999))
    ref = -0.5 * ((u_s - 0.3) / sigma) ** 2 - np.log(sigma * np.sqrt(2 * np.pi)) - np.log(1 - a[:1000] ** 2)
    np.testing.assert_allclose(logp[:1000], ref, rtol=1e-3, atol=1e-3)


def test_log_prob_is_finite_for_saturated_actions():
    a, logp = sac.sample_tanh_gaussian(jnp.array([[30.0, -30.0]]), jnp.array([[-5.0, -5.0]]), jax.random.PRNGKey(1))
    assert np.all(np.isfinite(np.asarray(logp)))


def setup_nets(action_dim=2, obs_dim=3, **kw):
    args = sac.Args(hidden_sizes=(16,), **kw)
    nets = sac.make_nets(args, action_dim)
    state = sac.init_train_state(nets, args, obs_dim, action_dim, jax.random.PRNGKey(0))
    # Distinct target critics, so the test can tell which network is used where.
    state = state._replace(
        target_critic_params=nets.critic.init(
            jax.random.PRNGKey(7), jnp.zeros((1, obs_dim)), jnp.zeros((1, action_dim))
        )
    )
    return args, nets, state


def random_batch(rng, b=32, obs_dim=3, action_dim=2):
    return {
        "obs": rng.normal(size=(b, obs_dim)).astype(np.float32),
        "next_obs": rng.normal(size=(b, obs_dim)).astype(np.float32),
        "action": rng.uniform(-1, 1, (b, action_dim)).astype(np.float32),
        "reward": rng.normal(size=b).astype(np.float32),
        "discount": (rng.random(b) < 0.8).astype(np.float32) * 0.99,
        "weights": rng.random(b).astype(np.float32),
    }


def test_critic_loss_matches_numpy_reference():
    args, nets, state = setup_nets()
    state = state._replace(log_alpha=jnp.log(jnp.float32(0.3)))
    b = random_batch(np.random.default_rng(0))
    key = jax.random.PRNGKey(3)
    loss, (td, _) = sac.critic_loss(nets, state.critic_params, state, b, key)
    # Reference: the same sampled next actions (same key), then numpy arithmetic.
    mean, log_std = nets.actor.apply(state.actor_params, b["next_obs"])
    a2, logp2 = sac.sample_tanh_gaussian(mean, log_std, key)
    q_next = np.asarray(nets.critic.apply(state.target_critic_params, b["next_obs"], a2))
    q = np.asarray(nets.critic.apply(state.critic_params, b["obs"], b["action"]))
    y = b["reward"] + b["discount"] * (q_next.min(0) - 0.3 * np.asarray(logp2))
    ref_td = q - y
    ref = np.mean(b["weights"] * (0.5 * ref_td**2).sum(0))
    np.testing.assert_allclose(np.asarray(td), ref_td, rtol=1e-4, atol=1e-4)
    assert float(loss) == pytest.approx(ref, rel=1e-4)
    # The entropy term is there: a different alpha changes the loss.
    other, _ = sac.critic_loss(nets, state.critic_params, state._replace(log_alpha=jnp.float32(0.0)), b, key)
    assert abs(float(other) - ref) > 1e-3


def test_critic_loss_gradient_is_the_weighted_td_error():
    """dL/dQ_m(s_i, a_i) = w_i td_mi / B, exact for small TD errors too (a Huber form 0.5 q^2 + delta
    (|x| - q) at delta 1e6 gave 0 for |td| < 0.03 and rounded the rest to multiples of 1/16)."""
    args, nets, state = setup_nets()
    b = random_batch(np.random.default_rng(4))
    b["reward"] = b["reward"] * np.geomspace(1e-3, 10.0, len(b["reward"])).astype(np.float32)
    key = jax.random.PRNGKey(5)
    grads = jax.grad(lambda p: sac.critic_loss(nets, p, state, b, key)[0])(state.critic_params)
    _, (td, _) = sac.critic_loss(nets, state.critic_params, state, b, key)
    psi = np.asarray(td)
    _, vjp = jax.vjp(lambda p: nets.critic.apply(p, b["obs"], b["action"]), state.critic_params)
    (ref,) = vjp(jnp.asarray(b["weights"] * psi / len(b["reward"]), jnp.float32))  # the target is a constant
    for g, r in zip(jax.tree_util.tree_leaves(grads), jax.tree_util.tree_leaves(ref)):
        np.testing.assert_allclose(np.asarray(g), np.asarray(r), rtol=1e-4, atol=1e-7)


def test_actor_loss_and_alpha_loss_match_reference():
    args, nets, state = setup_nets()
    obs = np.random.default_rng(1).normal(size=(16, 3)).astype(np.float32)
    key = jax.random.PRNGKey(4)
    log_alpha = jnp.log(jnp.float32(0.5))
    total, (actor_l, alpha_l, entropy) = sac.actor_alpha_loss(
        nets, state.actor_params, log_alpha, state.critic_params, obs, key, -2.0
    )
    mean, log_std = nets.actor.apply(state.actor_params, obs)
    a, logp = sac.sample_tanh_gaussian(mean, log_std, key)
    q = np.asarray(nets.critic.apply(state.critic_params, obs, a)).min(0)
    logp = np.asarray(logp)
    assert float(actor_l) == pytest.approx(np.mean(0.5 * logp - q), rel=1e-4)
    assert float(alpha_l) == pytest.approx(np.mean(-0.5 * (logp - 2.0)), rel=1e-4)
    assert float(entropy) == pytest.approx(-np.mean(logp), rel=1e-4)


@pytest.mark.parametrize("entropy_high", [True, False])
def test_temperature_moves_the_right_way(entropy_high):
    """Entropy above the target -> alpha falls; below -> alpha rises."""
    args, nets, state = setup_nets(
        target_entropy_scale=(5.0 if entropy_high else -5.0), updates_per_call=1, policy_frequency=1
    )
    update = sac.make_update(nets, args, 2, sac.learner_shardings(args))
    b = random_batch(np.random.default_rng(2))
    alpha0 = float(jnp.exp(state.log_alpha))
    for _ in range(5):
        state, metrics, _ = update(state, {k: v[None] for k, v in b.items()}, jax.random.PRNGKey(0))
    alpha1 = float(jnp.exp(state.log_alpha))
    assert (alpha1 < alpha0) if entropy_high else (alpha1 > alpha0)


def test_no_autotune_keeps_alpha_and_delayed_actor_updates():
    args, nets, state = setup_nets(autotune=False, alpha=0.2, policy_frequency=3, updates_per_call=2)
    update = sac.make_update(nets, args, 2, sac.learner_shardings(args))
    rng = np.random.default_rng(3)
    batches = {k: np.stack([random_batch(rng)[k] for _ in range(2)]) for k in random_batch(rng)}
    actor0 = jax.device_get(state.actor_params)
    state, metrics, prio = update(state, batches, jax.random.PRNGKey(0))
    assert prio.shape == (2, 32) and np.all(np.asarray(prio) >= 0)
    assert float(jnp.exp(state.log_alpha)) == pytest.approx(0.2)
    # Steps 1 and 2: 2 % 3 != 0, so the actor has not moved yet.
    for a, b in zip(jax.tree_util.tree_leaves(actor0), jax.tree_util.tree_leaves(state.actor_params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    state, metrics, _ = update(state, batches, jax.random.PRNGKey(1))  # steps 3, 4: moves at 3
    assert any(
        np.abs(np.asarray(a) - np.asarray(b)).max() > 0
        for a, b in zip(jax.tree_util.tree_leaves(actor0), jax.tree_util.tree_leaves(state.actor_params))
    )


def test_target_critic_polyak_average():
    args, nets, state = setup_nets(tau=0.1, target_network_frequency=1, updates_per_call=1)
    update = sac.make_update(nets, args, 2, sac.learner_shardings(args))
    old_target = jax.device_get(state.target_critic_params)
    b = random_batch(np.random.default_rng(4))
    new, _, _ = update(state, {k: v[None] for k, v in b.items()}, jax.random.PRNGKey(0))
    for p, t_old, t_new in zip(
        jax.tree_util.tree_leaves(new.critic_params),
        jax.tree_util.tree_leaves(old_target),
        jax.tree_util.tree_leaves(new.target_critic_params),
    ):
        np.testing.assert_allclose(
            np.asarray(t_new), 0.1 * np.asarray(p) + 0.9 * np.asarray(t_old), rtol=1e-5, atol=1e-6
        )


def test_action_rescaling_stays_in_asymmetric_bounds():
    low, high = np.array([-3.0, 0.0, 10.0]), np.array([1.0, 0.5, 20.0])
    a = np.array([[-1.0, -1.0, -1.0], [1.0, 1.0, 1.0], [0.0, 0.0, 0.0], [0.999, -0.5, 0.2]])
    env_a = sac.to_env_action(a, low, high)
    assert np.all(env_a >= low) and np.all(env_a <= high)
    np.testing.assert_allclose(env_a[0], low)
    np.testing.assert_allclose(env_a[1], high)
    np.testing.assert_allclose(env_a[2], (low + high) / 2)
    np.testing.assert_allclose(sac.from_env_action(env_a, low, high), a, atol=1e-9)
    # Policy samples (always inside (-1, 1)) map inside the bounds.
    samples = np.tanh(np.random.default_rng(0).normal(scale=5, size=(1000, 3)))
    mapped = sac.to_env_action(samples, low, high)
    assert np.all(mapped >= low) and np.all(mapped <= high)


def test_replay_rows_lead_to_the_real_last_observation_and_bootstrap_through_truncation(tmp_path):
    """Each row is (s, a, r, s', gamma (1 - terminated)) with s' the observation the step led to, also at an
    episode's end (info["final_obs"], not the next episode's first), and a truncation keeps gamma."""
    import gymnasium as gym

    class Counter(gym.Env):
        """obs (t, episode parity, which env); reward t; odd episodes are cut off at t = 5, even ones end
        at t = 3; env k starts with episode k, so that the envs' episodes end at different steps."""

        observation_space = gym.spaces.Box(-10.0, 10.0, (3,), np.float32)
        action_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
        made = 0

        def __init__(self):
            self.which = Counter.made
            self.episode = self.which - 1
            Counter.made += 1

        def reset(self, seed=None, options=None):
            self.t, self.episode = 0, self.episode + 1
            return np.array([0.0, self.episode % 2, self.which], np.float32), {}

        def step(self, action):
            self.t += 1
            obs = np.array([self.t, self.episode % 2, self.which], np.float32)
            return obs, float(self.t - 1), self.episode % 2 == 0 and self.t == 3, self.t == 5, {}

    def factory(num_envs, video=None):
        return gym.vector.SyncVectorEnv([Counter] * num_envs, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)

    flags = dict(hidden_sizes=(8,), learning_starts=200, batch_size=16, num_envs=2, eval_episodes=1)
    sac.train(sac.Args(**flags, total_timesteps=40, gamma=0.9, run_dir=str(tmp_path / "run")), factory)
    _, arrays = sac.load_npz(str(tmp_path / "run"), "checkpoint")
    obs, next_obs = arrays["replay/obs"], arrays["replay/next_obs"]
    reward, discount = arrays["replay/reward"][:, 0], arrays["replay/discount"][:, 0]
    assert len(obs) == 40
    np.testing.assert_array_equal(next_obs[:, 0], obs[:, 0] + 1)  # the real last observation, t + 1
    np.testing.assert_array_equal(next_obs[:, 1:], obs[:, 1:])  # the same episode of the same env
    assert set(obs[:, 2]) == {0.0, 1.0}
    np.testing.assert_array_equal(reward, obs[:, 0])
    terminated = (obs[:, 1] == 0) & (next_obs[:, 0] == 3)
    truncated = (obs[:, 1] == 1) & (next_obs[:, 0] == 5)
    assert terminated.any() and truncated.any()
    np.testing.assert_allclose(discount, np.where(terminated, 0.0, 0.9), rtol=1e-6)
    assert np.all(np.abs(arrays["replay/action"]) <= 1.0)


def test_run_checkpoint_resume_and_eval_only(tmp_path, capsys):
    run_dir = str(tmp_path / "run")
    assert sac.cli(FAST + ["--total-timesteps", "600", "--prioritized", "--run-dir", run_dir]) == 0
    meta, arrays = sac.load_npz(run_dir, "checkpoint")
    assert meta["global_step"] == 600
    assert int(arrays["train_state/sgd_steps"]) == (600 - 256) // 4 * 4
    assert len(arrays["replay/priority"]) == 600
    capsys.readouterr()
    assert sac.cli(["--resume", run_dir, "--total-timesteps", "800"]) == 0
    meta2, arrays2 = sac.load_npz(run_dir, "checkpoint")
    assert meta2["global_step"] == 800 and int(arrays2["train_state/sgd_steps"]) == (800 - 256) // 4 * 4
    assert "; any schedule over the budget ends at 800 steps, not 600" in capsys.readouterr().out
    # A saved model is evaluated by tools/sac_evaluate.py.
    evaluate = load_tool("sac_evaluate")
    assert evaluate.main([os.path.join(run_dir, "model.npz"), "--episodes", "2"]) == 0
    assert "over 2 episodes" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--env-id", "CartPole-v1"], "SAC needs a Box action space"),
        (["--env-id", "NoSuchEnv-v3"], "cannot make env"),
        (["--batch-size", "0"], "--batch-size should be greater than or equal to 1"),
        (["--tau", "2"], "--tau should be less than or equal to 1"),
        (["--resume", "/nonexistent"], "no args.json"),
    ],
)
def test_bad_input_is_one_clear_line(argv, message, capsys):
    assert sac.cli(argv) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def test_unbounded_actions_are_rejected(capsys):
    import gymnasium as gym

    class Unbounded(gym.Env):
        observation_space = gym.spaces.Box(-1, 1, (2,), np.float32)
        action_space = gym.spaces.Box(-np.inf, np.inf, (1,), np.float32)

        def reset(self, seed=None, options=None):
            return np.zeros(2, np.float32), {}

        def step(self, action):
            return np.zeros(2, np.float32), 0.0, False, False, {}

    gym.register("TestUnbounded-v0", entry_point=Unbounded)
    assert sac.cli(["--env-id", "TestUnbounded-v0"]) == 2
    assert "unbounded actions" in capsys.readouterr().err


def test_import_has_no_side_effects_and_cli_errors_have_no_traceback():
    out = import_in_fresh_process("sac")
    assert out.returncode == 0 and "clean" in out.stdout, out.stderr
    out = subprocess.run(
        [sys.executable, SCRIPT, "--env-id", "Acrobot-v1"], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 2 and "Traceback" not in out.stderr and "Box action space" in out.stderr


def test_the_temperature_steps_at_the_critics_rate():
    """Adam's first step moves a parameter by about its learning rate, whatever the gradient's size."""

    def first_steps(**kw):
        nets = sac.make_nets(sac.Args(**kw), 1)
        log_alpha = jnp.zeros(())
        alpha_step, _ = nets.alpha_tx.update(jnp.asarray(5.0), nets.alpha_tx.init(log_alpha), log_alpha)
        actor_params = {"w": jnp.zeros(3)}
        actor_step, _ = nets.actor_tx.update({"w": jnp.ones(3)}, nets.actor_tx.init(actor_params), actor_params)
        return abs(float(alpha_step)), abs(float(actor_step["w"][0]))

    np.testing.assert_allclose(first_steps(policy_lr=3e-4, q_lr=1e-3), (1e-3, 3e-4), rtol=1e-3)  # as CleanRL


def test_the_temperature_starts_at_alpha_init_or_stays_at_alpha():
    def start(**kw):
        args = sac.Args(hidden_sizes=(8,), **kw)
        state = sac.init_train_state(sac.make_nets(args, 1), args, 3, 1, jax.random.PRNGKey(0))
        return float(jnp.exp(state.log_alpha))

    assert start() == pytest.approx(1.0)
    assert start(alpha_init=0.3) == pytest.approx(0.3)
    assert start(autotune=False, alpha=0.05) == pytest.approx(0.05)


def test_a_custom_env_factory_trains_and_its_mistakes_are_one_line(tmp_path):
    """train(args, env_fn): one factory builds the training and the evaluation envs (the issue: an
    unregistered env took six places); a factory that ignores num_envs or the autoreset mode is
    refused before anything runs."""
    import gymnasium as gym

    def factory(num_envs, video=None, envs_made=None, mode=gym.vector.AutoresetMode.SAME_STEP):
        make = [lambda: gym.wrappers.TimeLimit(gym.make("Pendulum-v1").unwrapped, 50)] * (envs_made or num_envs)
        return gym.vector.SyncVectorEnv(make, autoreset_mode=mode)

    flags = dict(hidden_sizes=(16,), learning_starts=100, batch_size=16, buffer_size=1000, updates_per_call=4)
    flags.update(eval_episodes=2, eval_every=10_000, total_timesteps=300, env_id="MyPendulum")
    result = sac.train(sac.Args(**flags, run_dir=str(tmp_path / "run")), factory)
    assert result["global_step"] == 300 and np.isfinite(result["eval_mean"])
    assert result["eval_mean"] > -50 * 16.3  # 50-step episodes of the factory, not Pendulum's 200
    with pytest.raises(sac.ConfigError, match="made 1 envs, not 2"):
        sac.train(sac.Args(**flags, num_envs=2, run_dir=str(tmp_path / "a")), functools.partial(factory, envs_made=1))
    with pytest.raises(sac.ConfigError, match="SAME_STEP"):
        next_step = functools.partial(factory, mode=gym.vector.AutoresetMode.NEXT_STEP)
        sac.train(sac.Args(**flags, run_dir=str(tmp_path / "b")), next_step)
