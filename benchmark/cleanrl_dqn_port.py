"""CleanRL's dqn_jax.py (cleanrl 1.2.0) at its CartPole settings, ported to this project's venv, with
one switch per way this project's DQN differs from it: finds which difference costs learning.

The port keeps dqn_jax.py's algorithm and random streams (python's random for exploration, numpy's
for replay draws, the same jax keys, the action space seeded with --seed), so a seed's episodes
follow dqn_jax.py's own run in its venv, in full or until a late difference (seeds 1-6,
docs/dqn.md). What changes: gymnasium 1.x (SAME_STEP autoreset: the final observation comes from
info["final_obs"]) and a numpy replay in place of stable-baselines3's (the same np.random.randint
draws). Settings: 200k steps, uniform 1-step replay of 10k, batch 128, one
SGD step per 10 env steps from 10k on, Adam at 2.5e-4, target copy every 500 env steps, epsilon
1 -> 0.05 over 100k, 120-84 MLP, the squared error. Switches:
  --double       double-Q targets (this project's) in place of max_a Q_target(s', a)
  --strat        each minibatch one row from each of 128 equal slices of the replay (cpprb's draw)
  --clip C       clip the global gradient norm to C (this project's 10 on its 0.5 x^2 loss is 20 here)

    python benchmark/cleanrl_dqn_port.py --seed 1 [--double] [--strat] [--clip 20] --out DIR

Writes DIR/result.json: every training episode's return and the batch's mean Q every 1,000 steps.
"""

import argparse
import json
import os
import random

import flax.linen as nn
import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np
import optax

STEPS, LR, BUFFER, TARGET_EVERY, BATCH, GAMMA = 200_000, 2.5e-4, 10_000, 500, 128, 0.99
LEARNING_STARTS, TRAIN_EVERY, EXPLORE_STEPS, END_E = 10_000, 10, 100_000, 0.05


class QNetwork(nn.Module):
    action_dim: int

    @nn.compact
    def __call__(self, x):
        x = nn.relu(nn.Dense(120)(x))
        x = nn.relu(nn.Dense(84)(x))
        return nn.Dense(self.action_dim)(x)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--double", action="store_true")
    parser.add_argument("--strat", action="store_true")
    parser.add_argument("--clip", type=float, default=None)
    parser.add_argument("--out", required=True)
    a = parser.parse_args()
    random.seed(a.seed)
    np.random.seed(a.seed)
    _, q_key = jax.random.split(jax.random.PRNGKey(a.seed))
    autoreset = gym.vector.AutoresetMode.SAME_STEP
    envs = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")], autoreset_mode=autoreset)
    envs.single_action_space.seed(a.seed)
    obs, _ = envs.reset(seed=a.seed)
    network = QNetwork(action_dim=int(envs.single_action_space.n))
    apply = jax.jit(network.apply)
    params = network.init(q_key, obs)
    target = network.init(q_key, obs)
    tx = optax.adam(LR) if a.clip is None else optax.chain(optax.clip_by_global_norm(a.clip), optax.adam(LR))
    opt_state = tx.init(params)

    @jax.jit
    def update(params, target, opt_state, obs, action, next_obs, reward, done):
        q_next = network.apply(target, next_obs)
        if a.double:
            a_star = jnp.argmax(network.apply(params, next_obs), axis=-1)
            q_next = jnp.take_along_axis(q_next, a_star[:, None], axis=1)[:, 0]
        else:
            q_next = jnp.max(q_next, axis=-1)
        y = reward + (1 - done) * GAMMA * q_next

        def loss(p):
            q = network.apply(p, obs)[jnp.arange(obs.shape[0]), action]
            return ((q - y) ** 2).mean(), q

        (_, q), grads = jax.value_and_grad(loss, has_aux=True)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, q.mean()

    rows = {k: np.zeros((BUFFER, 4), np.float32) for k in ("obs", "next_obs")}
    rows.update(
        action=np.zeros(BUFFER, np.int64), reward=np.zeros(BUFFER, np.float32), done=np.zeros(BUFFER, np.float32)
    )
    pos, full, episode_return, returns, q_means = 0, False, 0.0, [], []
    for step in range(STEPS):
        epsilon = max((END_E - 1.0) / EXPLORE_STEPS * step + 1.0, END_E)
        if random.random() < epsilon:
            actions = np.array([envs.single_action_space.sample()])
        else:
            actions = np.asarray(apply(params, obs).argmax(axis=-1))
        next_obs, reward, terminated, truncated, info = envs.step(actions)
        episode_return += float(reward[0])
        real_next_obs = next_obs.copy()
        if terminated[0] or truncated[0]:
            real_next_obs[0] = info["final_obs"][0]
            returns.append(episode_return)
            episode_return = 0.0
        row = (obs[0], real_next_obs[0], actions[0], reward[0], float(terminated[0]))
        for key, value in zip(("obs", "next_obs", "action", "reward", "done"), row):
            rows[key][pos] = value
        pos, full, obs = (pos + 1) % BUFFER, full or pos + 1 == BUFFER, next_obs
        if step > LEARNING_STARTS:
            if step % TRAIN_EVERY == 0:
                n = BUFFER if full else pos
                if a.strat:
                    idx = np.arange(BATCH) * n // BATCH + np.random.randint(0, n // BATCH, BATCH)
                else:
                    idx = np.random.randint(0, n, BATCH)
                batch = [rows[k][idx] for k in ("obs", "action", "next_obs", "reward", "done")]
                params, opt_state, q_mean = update(params, target, opt_state, *batch)
                if step % 1000 == 0:
                    q_means.append((step, float(q_mean)))
            if step % TARGET_EVERY == 0:
                target = params
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "result.json"), "w") as f:
        json.dump({"returns": returns, "q": q_means}, f)
    print(f"last 10 episodes {np.mean(returns[-10:]):.1f}, mean Q {q_means[-1][1]:.1f}")


if __name__ == "__main__":
    main()
