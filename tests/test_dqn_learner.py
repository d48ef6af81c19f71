"""The DQN loss and fused update against numpy references."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import rlax
from helpers import load_script

dqn = load_script("dqn_prioritized")


def huber(x, delta):
    a = np.abs(x)
    return np.where(a <= delta, 0.5 * x**2, delta * (a - 0.5 * delta))


def random_batch(rng, batch, obs_dim, num_actions):
    return {
        "obs": rng.normal(size=(batch, obs_dim)).astype(np.float32),
        "next_obs": rng.normal(size=(batch, obs_dim)).astype(np.float32),
        "action": rng.integers(0, num_actions, batch),
        "reward": rng.normal(size=batch).astype(np.float32) * 2,
        "discount": (rng.random(batch) < 0.7).astype(np.float32) * 0.97**3,
        "weights": rng.random(batch).astype(np.float32),
    }


def numpy_double_q_loss(q, q_next_online, q_next_target, b, delta):
    """y = r + d * Q_target(s', argmax_a Q_online(s', a)); loss = mean(w * huber(y - Q(s, a)))."""
    idx = np.arange(len(b["action"]))
    a_star = q_next_online.argmax(axis=1)
    y = b["reward"] + b["discount"] * q_next_target[idx, a_star]
    td = y - q[idx, b["action"]]
    return np.mean(b["weights"] * huber(td, delta)), td


@pytest.mark.parametrize("delta", [1.0, 0.3])
def test_loss_matches_numpy_reference(delta):
    rng = np.random.default_rng(0)
    net = dqn.QNetwork(3, (16,))
    params = net.init(jax.random.PRNGKey(0), jnp.zeros((1, 5)))
    target = net.init(jax.random.PRNGKey(1), jnp.zeros((1, 5)))
    b = random_batch(rng, 64, 5, 3)
    loss, (td, _) = dqn.double_q_loss(net.apply, params, target, b, delta)
    q = np.asarray(net.apply(params, b["obs"]))
    ref_loss, ref_td = numpy_double_q_loss(
        q, np.asarray(net.apply(params, b["next_obs"])), np.asarray(net.apply(target, b["next_obs"])), b, delta
    )
    np.testing.assert_allclose(np.asarray(td), ref_td, rtol=1e-5, atol=1e-5)
    assert float(loss) == pytest.approx(ref_loss, rel=1e-5)
    q_next, q_next_target = net.apply(params, b["next_obs"]), net.apply(target, b["next_obs"])  # and rlax's
    by_rlax = jax.vmap(rlax.double_q_learning)(q, b["action"], b["reward"], b["discount"], q_next_target, q_next)
    np.testing.assert_allclose(np.asarray(td), np.asarray(by_rlax), rtol=1e-5, atol=1e-5)
    # The online net selects, the target net evaluates: swapping them must change the result.
    swapped, _ = dqn.double_q_loss(net.apply, target, params, b, delta)
    assert abs(float(swapped) - ref_loss) > 1e-4


@pytest.mark.parametrize("script", ["dqn_prioritized", "apex_dqn"])
@pytest.mark.parametrize("delta", [1.0, 0.3, 1e6, 1e30])
def test_loss_gradient_matches_the_huber_derivative(script, delta):
    """dL/dQ(s_i, a_i) = -w_i psi(td_i) / B, psi(x) = x inside delta and delta sign(x) outside, for a
    large delta (the squared error) too: rlax's huber_loss gave 0 there below half a float32 step of delta."""
    module = dqn if script == "dqn_prioritized" else load_script(script)
    rng = np.random.default_rng(2)
    net = module.QNetwork(3, (16,))
    params = net.init(jax.random.PRNGKey(0), jnp.zeros((1, 5)))
    target = net.init(jax.random.PRNGKey(1), jnp.zeros((1, 5)))
    b = random_batch(rng, 64, 5, 3)
    b["reward"] = b["reward"] * np.geomspace(1e-3, 10.0, 64).astype(np.float32)  # TD errors from ~0.01 up
    grads = jax.grad(lambda p: module.double_q_loss(net.apply, p, target, b, delta)[0])(params)
    _, td = numpy_double_q_loss(
        np.asarray(net.apply(params, b["obs"])),
        np.asarray(net.apply(params, b["next_obs"])),
        np.asarray(net.apply(target, b["next_obs"])),
        b,
        delta,
    )
    psi = np.where(np.abs(td) <= delta, td, delta * np.sign(td))
    cotangent = np.zeros((64, 3), np.float32)
    cotangent[np.arange(64), b["action"]] = -b["weights"] * psi / 64
    _, vjp = jax.vjp(lambda p: net.apply(p, b["obs"]), params)  # Q(s, .) only: y is a constant
    (ref,) = vjp(jnp.asarray(cotangent))
    for g, r in zip(jax.tree_util.tree_leaves(grads), jax.tree_util.tree_leaves(ref)):
        np.testing.assert_allclose(np.asarray(g), np.asarray(r), rtol=1e-4, atol=1e-7)


def test_loss_gradient_only_through_online_q_of_taken_action():
    rng = np.random.default_rng(1)
    net = dqn.QNetwork(2, (8,))
    params = net.init(jax.random.PRNGKey(0), jnp.zeros((1, 3)))
    b = random_batch(rng, 16, 3, 2)
    b["weights"] = np.zeros(16, np.float32)  # zero IS weights: no gradient at all
    grads = jax.grad(lambda p: dqn.double_q_loss(net.apply, p, params, b, 1.0)[0])(params)
    assert all(float(jnp.abs(g).max()) == 0.0 for g in jax.tree_util.tree_leaves(grads))


def test_fused_update_equals_sequential_steps_and_counts_target_period():
    rng = np.random.default_rng(2)
    args = dqn.Args(target_network_frequency=3, tau=1.0, anneal_lr=False, learning_rate=1e-2)
    net = dqn.QNetwork(2, (8,))
    opt = dqn.make_optimizer(args, 100)
    K = 7
    batches = [random_batch(rng, 8, 3, 2) for _ in range(K)]
    stacked = {k: np.stack([b[k] for b in batches]) for k in batches[0]}

    state = dqn.init_train_state(net, opt, (3,), jax.random.PRNGKey(3))
    fused_state, metrics, td = dqn.make_update(net.apply, opt, args, dqn.learner_shardings(args))(state, stacked)

    # The same K steps one at a time (K=1 calls) must give the same parameters.
    step1 = dqn.make_update(net.apply, opt, args, dqn.learner_shardings(args))
    seq = dqn.init_train_state(net, opt, (3,), jax.random.PRNGKey(3))
    tds = []
    for b in batches:
        seq, _, td1 = step1(seq, {k: v[None] for k, v in b.items()})
        tds.append(np.asarray(td1[0]))
    for a, b in zip(jax.tree_util.tree_leaves(fused_state), jax.tree_util.tree_leaves(seq)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(td), np.stack(tds), rtol=1e-5, atol=1e-6)
    assert int(fused_state.sgd_steps) == K
    # Target copied at SGD step 6 (the last multiple of 3 <= 7), not after step 7.
    assert td.shape == (K, 8) and np.isfinite(float(metrics["losses/td_loss"]))
    diff = [
        float(jnp.abs(a - b).max())
        for a, b in zip(
            jax.tree_util.tree_leaves(fused_state.params), jax.tree_util.tree_leaves(fused_state.target_params)
        )
    ]
    assert max(diff) > 0  # step 7 moved the online net away from the copy


def test_polyak_target_update():
    args = dqn.Args(target_network_frequency=1, tau=0.25, anneal_lr=False)
    net = dqn.QNetwork(2, (4,))
    opt = dqn.make_optimizer(args, 10)
    state = dqn.init_train_state(net, opt, (3,), jax.random.PRNGKey(0))
    old_target = jax.device_get(state.target_params)
    b = random_batch(np.random.default_rng(0), 8, 3, 2)
    new, _, _ = dqn.make_update(net.apply, opt, args, dqn.learner_shardings(args))(
        state, {k: v[None] for k, v in b.items()}
    )
    for p, t_old, t_new in zip(
        jax.tree_util.tree_leaves(new.params),
        jax.tree_util.tree_leaves(old_target),
        jax.tree_util.tree_leaves(new.target_params),
    ):
        np.testing.assert_allclose(
            np.asarray(t_new), 0.25 * np.asarray(p) + 0.75 * np.asarray(t_old), rtol=1e-5, atol=1e-6
        )


def test_epsilon_greedy_act():
    net = dqn.QNetwork(4, (8,))
    params = net.init(jax.random.PRNGKey(0), jnp.zeros((1, 3)))
    act = dqn.make_act(net.apply, 4)
    obs = np.random.default_rng(0).normal(size=(256, 3)).astype(np.float32)
    greedy = np.asarray(net.apply(params, obs)).argmax(1)
    rng = np.random.default_rng(5)
    np.testing.assert_array_equal(act(params, obs, 0.0, rng), greedy)
    random = np.concatenate([act(params, obs, 1.0, rng) for _ in range(20)])
    counts = np.bincount(random, minlength=4) / len(random)
    assert np.all(np.abs(counts - 0.25) < 0.03)  # uniform over all actions
    half = act(params, obs, 0.5, rng)
    assert 0.25 < np.mean(half != greedy) < 0.5  # explores half the time, 3/4 of those differ
    one = act(params, obs[:1], 0.5, rng)  # one env: explores or not, the network only when not
    assert one.shape == (1,) and 0 <= one[0] < 4
    # The same seed gives the same draws, another seed others.
    a1 = act(params, obs, 1.0, np.random.default_rng(1))
    np.testing.assert_array_equal(a1, act(params, obs, 1.0, np.random.default_rng(1)))
    assert np.any(a1 != act(params, obs, 1.0, np.random.default_rng(2)))


def test_a_step_that_leaves_non_finite_parameters_reports_nan_priorities_at_that_step():
    """The TD of step k uses the parameters from before it, so a blow-up in the last step of a
    call would otherwise surface one call later, possibly after a checkpoint of the bad state."""
    rng = np.random.default_rng(3)
    args = dqn.Args(hidden_sizes=(16,), updates_per_call=3, learning_rate=1e38, anneal_lr=False, max_grad_norm=1e30)
    net = dqn.QNetwork(2, args.hidden_sizes)
    optimizer = dqn.make_optimizer(args, 100)
    state = dqn.init_train_state(net, optimizer, (4,), jax.random.PRNGKey(0))
    batches = [random_batch(rng, 8, 4, 2) for _ in range(3)]
    stacked = {k: np.stack([b[k] for b in batches]) for k in batches[0]}
    _, _, priorities = dqn.make_update(net.apply, optimizer, args, dqn.learner_shardings(args))(state, stacked)
    priorities = np.asarray(priorities)
    # Adam moves every weight by ~lr = 1e38 in step 1: the parameters' norm is no longer finite,
    # while step 1's TD itself was computed with the finite initial parameters.
    assert np.isnan(priorities[0]).all() and np.isnan(priorities).all()
    ok_args = dqn.Args(hidden_sizes=(16,), updates_per_call=3)
    ok_opt = dqn.make_optimizer(ok_args, 100)
    ok_state = dqn.init_train_state(net, ok_opt, (4,), jax.random.PRNGKey(0))
    _, _, ok = dqn.make_update(net.apply, ok_opt, ok_args, dqn.learner_shardings(ok_args))(ok_state, stacked)
    assert np.isfinite(np.asarray(ok)).all()


@pytest.mark.parametrize("flags", [{}, {"max_grad_norm": 10.0}])
def test_optimizer_is_adam_on_the_gradient_clipped_only_when_asked(flags):
    """Against Adam in numpy: by default the gradient goes in as it is (a clip at 10 held back the
    squared error's learning at CleanRL's settings, docs/dqn.md); --max-grad-norm c scales it to norm <= c.
    A large eps, so that it shows where it goes (outside the root)."""
    args = dqn.Args(anneal_lr=False, adam_eps=0.1, **flags)
    max_grad_norm = args.max_grad_norm
    opt = dqn.make_optimizer(args, 100)
    rng = np.random.default_rng(0)
    params = {"w": rng.normal(size=(3, 2)).astype(np.float32), "b": rng.normal(size=2).astype(np.float32)}
    state, m, v = opt.init(params), 0.0, 0.0
    for t, norm in enumerate([1000.0, 0.5, 40.0], start=1):
        g = rng.normal(size=8)
        g *= norm / np.linalg.norm(g)
        grads = {"w": g[:6].reshape(3, 2).astype(np.float32), "b": g[6:].astype(np.float32)}
        updates, state = opt.update(grads, state, params)
        if max_grad_norm is not None:
            g = g * min(1.0, max_grad_norm / np.linalg.norm(g))
        m, v = 0.9 * m + 0.1 * g, 0.999 * v + 0.001 * g**2
        want = -args.learning_rate * (m / (1 - 0.9**t)) / (np.sqrt(v / (1 - 0.999**t)) + args.adam_eps)
        got = np.concatenate([np.asarray(updates["w"]).ravel(), np.asarray(updates["b"])])
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-9)
    assert flags or max_grad_norm is None  # the default
