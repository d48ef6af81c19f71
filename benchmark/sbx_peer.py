"""The peer side of `./benchmark/benchmark.sh speed`: one sbx (Stable Baselines Jax, the `sbx-rl` package)
run of DQN or SAC, in sbx's own virtual environment (benchmark.sh builds it; sbx pins its own jax).

    python benchmark/sbx_peer.py dqn --env-id CartPole-v1 --total-timesteps 200000 --settings cleanrl
    python benchmark/sbx_peer.py sac --env-id Pendulum-v1 --total-timesteps 15000 --settings cleanrl
    python benchmark/sbx_peer.py dqn --env-id CartPole-v1 --settings zoo --solve 475 --eval-every 10000

--settings cleanrl: the settings the project's own speed runs use (CleanRL's dqn_jax.py and
sac_continuous_action.py), so that the two implementations do the same work. --settings zoo: the
RL-Zoo's tuned hyper-parameters for the task (rl-baselines3-zoo, hyperparams/dqn.yml CartPole-v1
and sac.yml Pendulum-v1), for time-to-solve at each one's best. With --solve R, an evaluation of
10 deterministic episodes every --eval-every env steps; the run stops at the first that averages
>= R. With --tensorboard DIR, sbx's own logger writes there (train/qf_mean_value is its mean Q(s, a)).
Prints one JSON line: times are epoch seconds (the driver subtracts its own start), and the mean
return of the last 10 training episodes, so that a fast peer that does not learn shows.
"""

import argparse
import json
import time

import gymnasium as gym
import numpy as np
import sbx
from stable_baselines3.common.callbacks import BaseCallback

SETTINGS = {
    # CleanRL dqn_jax.py's CartPole settings (target period in env steps, as sbx counts it too)
    ("dqn", "cleanrl"): dict(
        learning_rate=2.5e-4,
        buffer_size=10_000,
        learning_starts=10_000,
        batch_size=128,
        tau=1.0,
        gamma=0.99,
        target_update_interval=500,
        exploration_fraction=0.5,
        exploration_final_eps=0.05,
        train_freq=10,
        gradient_steps=1,
        policy_kwargs=dict(net_arch=[120, 84]),
    ),
    # CleanRL sac_continuous_action.py's settings (one learning rate for both: speed, not learning)
    ("sac", "cleanrl"): dict(
        learning_rate=3e-4,
        qf_learning_rate=3e-4,
        buffer_size=1_000_000,
        learning_starts=5_000,
        batch_size=256,
        tau=0.005,
        gamma=0.99,
        train_freq=1,
        gradient_steps=1,
        # CleanRL's policy_frequency 2 (given to this project too) takes 2 actor+alpha steps after every
        # 2nd critic step: one per critic step on average. sbx's policy_delay 2 would take one after
        # every 2nd, half the actor's work (its FLOPs are 44% of the step's: benchmark/sac_flops.py).
        # policy_delay 1 gives sbx the same work per env step.
        policy_delay=1,
        policy_kwargs=dict(net_arch=[256, 256]),
    ),
    # rl-baselines3-zoo hyperparams/dqn.yml, CartPole-v1
    ("dqn", "zoo"): dict(
        learning_rate=2.3e-3,
        batch_size=64,
        buffer_size=100_000,
        learning_starts=1_000,
        gamma=0.99,
        target_update_interval=10,
        train_freq=256,
        gradient_steps=128,
        exploration_fraction=0.16,
        exploration_final_eps=0.04,
        policy_kwargs=dict(net_arch=[256, 256]),
    ),
    # rl-baselines3-zoo hyperparams/sac.yml, Pendulum-v1
    ("sac", "zoo"): dict(learning_rate=1e-3),
}


class Clock(BaseCallback):
    """Epoch time when learning starts (the first step after learning_starts) and, with a
    threshold, evaluations every `every` env steps that stop the run once solved."""

    def __init__(self, learning_starts, threshold=None, every=None, env_id=None, seed=0):
        super().__init__()
        self.learning_starts, self.threshold, self.every = learning_starts, threshold, every
        self.env_id, self.seed = env_id, seed
        self.learning_from, self.solved = None, None

    def _on_step(self) -> bool:
        if self.learning_from is None and self.num_timesteps > self.learning_starts:
            self.learning_from = (self.num_timesteps, time.time())
        if self.threshold is not None and self.num_timesteps % self.every == 0:
            mean = evaluate(self.model, self.env_id, self.seed)
            if mean >= self.threshold:
                self.solved = {"step": self.num_timesteps, "time": time.time(), "eval": mean}
                return False
        return True


def evaluate(model, env_id: str, seed: int, episodes: int = 10) -> float:
    env = gym.make(env_id)
    returns = []
    for i in range(episodes):
        obs, _ = env.reset(seed=seed + 10_000 + i)
        done, total = False, 0.0
        while not done:
            action, _ = model.predict(obs, deterministic=True)
            obs, reward, terminated, truncated, _ = env.step(action)
            total += float(reward)
            done = terminated or truncated
        returns.append(total)
    env.close()
    return float(np.mean(returns))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("algo", choices=("dqn", "sac"))
    parser.add_argument("--env-id", required=True)
    parser.add_argument("--total-timesteps", type=int, required=True)
    parser.add_argument("--settings", choices=("cleanrl", "zoo"), default="cleanrl")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--solve", type=float, default=None, help="stop at the first evaluation >= this")
    parser.add_argument("--eval-every", type=int, default=10_000)
    parser.add_argument("--tensorboard", default=None, help="a folder for sbx's own tensorboard log")
    a = parser.parse_args()
    kwargs = SETTINGS[(a.algo, a.settings)]
    cls = sbx.DQN if a.algo == "dqn" else sbx.SAC
    model = cls("MlpPolicy", a.env_id, seed=a.seed, tensorboard_log=a.tensorboard, **kwargs)
    clock = Clock(model.learning_starts, a.solve, a.eval_every, a.env_id, a.seed)
    start = time.time()
    model.learn(total_timesteps=a.total_timesteps, callback=clock)
    end = time.time()
    result = {
        "impl": f"sbx {sbx.__version__}",
        "algo": a.algo,
        "env_id": a.env_id,
        "settings": a.settings,
        "kwargs": kwargs,  # what sbx was given: the record of "same settings"
        "seed": a.seed,
        "steps": int(model.num_timesteps),
        "learn_start": start,
        "learn_end": end,
        "learning_env_steps_per_s": None,
        "solved": clock.solved,
        "last_returns": float(np.mean([e["r"] for e in list(model.ep_info_buffer)[-10:]])),
    }
    if clock.learning_from is not None and end > clock.learning_from[1]:
        step, at = clock.learning_from
        result["learning_env_steps_per_s"] = (model.num_timesteps - step) / (end - at)
    print("PEER " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
