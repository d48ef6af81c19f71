"""One-off: the Atari update (K = 32, B = 32) on batches already on the chip, by variant: SGD steps/s."""
import json, sys, time, os
sys.path.insert(0, "algos")
import numpy as np, jax, jax.numpy as jnp
import dqn_prioritized as dqn

args = dqn.check_args(dqn.Args(**{**dqn.ATARI_PRESET, "env_id": "ALE/Pong-v5", "num_envs": 32, "updates_per_call": 32}))
space = dqn.gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
network = dqn.make_network(args, space, 6)
optimizer = dqn.make_optimizer(args, 100000)
sh = dqn.learner_shardings(args)
k, b = 32, 32
rng = np.random.default_rng(0)
batch = dict(obs=rng.integers(0, 255, (k, b, 4, 84, 84), dtype=np.uint8), action=rng.integers(6, size=(k, b)),
             reward=rng.standard_normal((k, b)).astype(np.float32), next_obs=rng.integers(0, 255, (k, b, 4, 84, 84), dtype=np.uint8),
             discount=np.full((k, b), 0.99, np.float32), weights=np.ones((k, b), np.float32))
on = jax.device_put(batch, sh.split)
orig = dqn.double_q_loss

def stacked_loss(q_apply, params, target_params, batch, huber_delta):
    q_sa = jnp.take_along_axis(q_apply(params, batch["obs"]), batch["action"][:, None], axis=1)[:, 0]
    both = jax.tree_util.tree_map(lambda a, t: jnp.stack([jax.lax.stop_gradient(a), t]), params, target_params)
    q2 = jax.vmap(q_apply, in_axes=(0, None))(both, batch["next_obs"])
    a_star = jnp.argmax(q2[0], axis=1)
    q_next = jnp.take_along_axis(q2[1], a_star[:, None], axis=1)[:, 0]
    td = jax.lax.stop_gradient(batch["reward"] + batch["discount"] * q_next) - q_sa
    return jnp.mean(batch["weights"] * dqn.huber(td, huber_delta)), (td, q_sa.mean())

def concat_loss(q_apply, params, target_params, batch, huber_delta):
    n = batch["obs"].shape[0]
    q = q_apply(params, jnp.concatenate([batch["obs"], batch["next_obs"]]))
    q_sa = jnp.take_along_axis(q[:n], batch["action"][:, None], axis=1)[:, 0]
    a_star = jnp.argmax(jax.lax.stop_gradient(q[n:]), axis=1)
    q_next = jnp.take_along_axis(q_apply(target_params, batch["next_obs"]), a_star[:, None], axis=1)[:, 0]
    td = jax.lax.stop_gradient(batch["reward"] + batch["discount"] * q_next) - q_sa
    return jnp.mean(batch["weights"] * dqn.huber(td, huber_delta)), (td, q_sa.mean())

for name, loss, unroll in [("current", orig, 1), ("unroll2", orig, 2), ("unroll4", orig, 4), ("unroll32", orig, 32),
                           ("vmap-next", stacked_loss, 1), ("concat-online", concat_loss, 1)]:
    dqn.double_q_loss = loss
    state = jax.device_put(dqn.init_train_state(network, optimizer, space.shape, jax.random.PRNGKey(0)), sh.replicated)
    up = dqn.make_update(network.apply, optimizer, args, sh, unroll)
    t0 = time.perf_counter()
    for _ in range(3):
        state, _, td = up(state, on)
    td.block_until_ready()
    compile_s = time.perf_counter() - t0
    t = time.perf_counter()
    for _ in range(100):
        state, _, td = up(state, on)
    td.block_until_ready()
    s = time.perf_counter() - t
    print(json.dumps(dict(variant=name, sgd_per_s=round(3200 / s), ms_per_step=round(1e3 * s / 3200, 4), compile_s=round(compile_s, 1))), flush=True)
