"""One sbx (Stable Baselines Jax, `sbx-rl`) run of DQN or SAC at CleanRL's settings (dqn_jax.py's
CartPole-v1 and sac_continuous_action.py's), those of this project's speed runs too, in sbx's own
venv (sbx pins its own jax), for benchmark/speed_vs_peers.py and benchmark/accelerator.py:

    python benchmark/sbx_peer.py dqn --env-id CartPole-v1 --total-timesteps 200000

Prints one JSON line: the learning phase's env steps/s and the mean return of the last 10 training
episodes. --tensorboard DIR: sbx's own log.
"""

import argparse
import json
import time

import numpy as np
import sbx
from stable_baselines3.common.callbacks import BaseCallback

SETTINGS = {
    # dqn_jax.py's (target period in env steps, as sbx counts it too)
    "dqn": dict(
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
    # sac_continuous_action.py's (one learning rate for both: speed, not learning)
    "sac": dict(
        learning_rate=3e-4,
        qf_learning_rate=3e-4,
        buffer_size=1_000_000,
        learning_starts=5_000,
        batch_size=256,
        tau=0.005,
        gamma=0.99,
        train_freq=1,
        gradient_steps=1,
        # CleanRL's policy_frequency 2 takes 2 actor+alpha steps every 2nd critic step; sbx's
        # policy_delay 2 would take one, half the actor's work: policy_delay 1 does the same work.
        policy_delay=1,
        policy_kwargs=dict(net_arch=[256, 256]),
    ),
}


class Clock(BaseCallback):
    """(env step, epoch time) when learning starts: the first step after learning_starts."""

    def __init__(self, learning_starts):
        super().__init__()
        self.learning_starts, self.learning_from = learning_starts, None

    def _on_step(self) -> bool:
        if self.learning_from is None and self.num_timesteps > self.learning_starts:
            self.learning_from = (self.num_timesteps, time.time())
        return True


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("algo", choices=("dqn", "sac"))
    parser.add_argument("--env-id", required=True)
    parser.add_argument("--total-timesteps", type=int, required=True)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--tensorboard", default=None, help="a folder for sbx's own tensorboard log")
    a = parser.parse_args()
    kwargs = SETTINGS[a.algo]
    cls = sbx.DQN if a.algo == "dqn" else sbx.SAC
    model = cls("MlpPolicy", a.env_id, seed=a.seed, tensorboard_log=a.tensorboard, **kwargs)
    clock = Clock(model.learning_starts)
    start = time.time()
    model.learn(total_timesteps=a.total_timesteps, callback=clock)
    end = time.time()
    rate = None
    if clock.learning_from is not None and end > clock.learning_from[1]:
        step, at = clock.learning_from
        rate = (model.num_timesteps - step) / (end - at)
    returns = float(np.mean([e["r"] for e in list(model.ep_info_buffer)[-10:]]))
    # kwargs, what sbx was given, is the record of "same settings"
    result = dict(vars(a), impl=f"sbx {sbx.__version__}", kwargs=kwargs, steps=int(model.num_timesteps))
    result.update(learn_start=start, learn_end=end, learning_env_steps_per_s=rate, last_returns=returns)
    print("PEER " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
