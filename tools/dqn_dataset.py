"""Write an offline dataset (D4RL's flat HDF5 layout) with a policy trained by algos/dqn_prioritized.py,
for algos/bc_offline.py.

    python tools/dqn_dataset.py runs/<run> data/cartpole.hdf5 --episodes 20 --epsilon 0.0

metadata/ holds the reference returns of the normalised score: ref_min of the uniformly random policy
(epsilon 1), ref_max of the greedy policy itself. The file is written atomically.
"""

import dataclasses
import os
import sys

import h5py
import numpy as np
import tyro

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dqn_evaluate import dqn, load_policy  # noqa: E402


@dataclasses.dataclass
class Options:
    path: tyro.conf.Positional[str]
    """a run folder (its model.npz), a model.npz or a checkpoint.npz"""
    out: tyro.conf.Positional[str]
    """the .hdf5 file to write"""
    episodes: int = 20
    """episodes in the dataset"""
    epsilon: float = 0.0
    """epsilon of the collecting policy (0: expert data; larger: noisier)"""


def rollout(act, params, env_fn, episodes: int, epsilon: float, seed: int) -> tuple:
    """(returns, transitions in D4RL's names, episode after episode) of parallel envs, each contributing
    its first episode, with the real final observation of each."""
    envs = env_fn(episodes)
    try:
        envs.action_space.seed(seed)
        obs, _ = envs.reset(seed=seed)
        returns, running, steps, rng = np.zeros(episodes), np.ones(episodes, bool), [], np.random.default_rng(seed)
        while running.any():
            actions = np.asarray(act(params, obs, epsilon, rng)) + int(
                envs.single_action_space.start
            )  # as the env takes
            next_obs, reward, terminated, truncated, info = envs.step(actions)
            real = dqn.real_next_obs(next_obs, terminated | truncated, info)
            steps.append((running.copy(), obs, actions, reward, real, terminated, truncated))
            returns += reward * running
            running &= ~(terminated | truncated)
            obs = next_obs
    finally:
        envs.close()
    live, *columns = [np.stack(c) for c in zip(*steps)]  # each [T, episodes, ...]
    names = ("observations", "actions", "rewards", "next_observations", "terminals", "timeouts")
    data = {name: np.concatenate([c[live[:, i], i] for i in range(episodes)]) for name, c in zip(names, columns)}
    return returns, data


def write_dataset(options: Options) -> dict:
    act, params, saved, env_fn, _ = load_policy(options.path)
    seed = saved.seed + 20_000
    returns, data = rollout(act, params, env_fn, options.episodes, options.epsilon, seed)
    metadata = {
        "env_id": saved.env_id,
        "algorithm": "dqn_prioritized.py",
        "dataset_epsilon": options.epsilon,
        "episodes": options.episodes,
        "seed": seed,
        "ref_min_score": float(dqn.evaluate(act, params, env_fn, options.episodes, 1.0, seed).mean()),
        "ref_max_score": float(dqn.evaluate(act, params, env_fn, options.episodes, 0.0, seed).mean()),
        "mean_return": float(returns.mean()),
    }

    def write(f):
        with h5py.File(f, "w") as h5:
            for name, values in data.items():
                h5.create_dataset(name, data=values, compression="gzip")
            for name, value in metadata.items():
                h5.require_group("metadata").attrs[name] = value

    dqn.write_atomic(os.path.abspath(options.out), write)
    print(
        f"wrote {len(data['rewards'])} transitions ({options.episodes} episodes, "
        f"mean return {returns.mean():.1f}) to {options.out}"
    )
    return metadata


def main(argv=None) -> int:
    options = tyro.cli(Options, args=argv)
    try:
        dqn.require(
            0 < options.episodes <= 1024 and 0 <= options.epsilon <= 1, "--episodes in 1..1024, --epsilon in [0, 1]"
        )
        folder = os.path.dirname(os.path.abspath(options.out))
        dqn.require(os.path.isdir(folder), f"{folder} is not a folder")
        dqn.jax.config.update("jax_cpu_enable_async_dispatch", False)
        write_dataset(options)
    except (dqn.ConfigError, dqn.RunFailed) as e:
        print(f"dqn_dataset.py: error: {e}", file=sys.stderr)
        return 2 if isinstance(e, dqn.ConfigError) else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
