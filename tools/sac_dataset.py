"""Write an offline dataset (D4RL's flat HDF5 layout) with a policy trained by algos/sac.py, for
algos/bc_offline.py.

    python tools/sac_dataset.py runs/<run> data/pendulum.hdf5 --episodes 20 --noise 0.3

The policy acts deterministically (tanh of the mean), plus N(0, noise^2) in [-1, 1] action units
clipped to [-1, 1]; actions are stored in the env's units. metadata/ holds the reference returns of
the normalised score: ref_min of uniformly random actions, ref_max of the noise-free policy itself.
The file is written atomically.
"""

import dataclasses
import os
import sys
from typing import Optional

import h5py
import numpy as np
import tyro

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sac_evaluate import load_policy, sac  # noqa: E402


@dataclasses.dataclass
class Options:
    path: tyro.conf.Positional[str]
    """a run folder (its model.npz), a model.npz or a checkpoint.npz"""
    out: tyro.conf.Positional[str]
    """the .hdf5 file to write"""
    episodes: int = 20
    """episodes in the dataset"""
    noise: float = 0.0
    """std of the Gaussian noise on the deterministic action (0: expert data; larger: noisier)"""
    env_id: Optional[str] = None
    """the env (default: the run's)"""


def rollout(act, params, env_fn, episodes: int, seed: int, noise: float = 0.0, random: bool = False) -> tuple:
    """(returns, transitions in D4RL's names, episode after episode) of parallel envs, each contributing
    its first episode, with the real final observation of each."""
    envs = env_fn(episodes)
    rng = np.random.default_rng(seed)
    try:
        low, high = envs.single_action_space.low, envs.single_action_space.high
        envs.action_space.seed(seed)
        obs, _ = envs.reset(seed=seed)
        returns, running, steps = np.zeros(episodes), np.ones(episodes, bool), []
        while running.any():
            if random:
                env_action = envs.action_space.sample()
            else:
                action = np.asarray(act(params, obs, None, None, deterministic=True))
                action = np.clip(action + noise * rng.standard_normal(action.shape), -1.0, 1.0) if noise else action
                env_action = sac.to_env_action(action, low, high)
            next_obs, reward, terminated, truncated, info = envs.step(env_action)
            real = sac.real_next_obs(next_obs, terminated | truncated, info)
            steps.append((running.copy(), obs, env_action, reward, real, terminated, truncated))
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
    act, params, saved, env_fn, _ = load_policy(options.path, options.env_id)
    env_id = options.env_id or saved.env_id
    seed = saved.seed + 20_000
    returns, data = rollout(act, params, env_fn, options.episodes, seed, options.noise)
    metadata = {
        "env_id": env_id,
        "algorithm": "sac.py",
        "dataset_noise": options.noise,
        "episodes": options.episodes,
        "seed": seed,
        "ref_min_score": float(rollout(act, params, env_fn, options.episodes, seed, random=True)[0].mean()),
        "ref_max_score": float(sac.evaluate(act, params, env_fn, options.episodes, seed).mean()),
        "mean_return": float(returns.mean()),
    }

    def write(f):
        with h5py.File(f, "w") as h5:
            for name, values in data.items():
                h5.create_dataset(name, data=values, compression="gzip")
            for name, value in metadata.items():
                h5.require_group("metadata").attrs[name] = value

    sac.write_atomic(os.path.abspath(options.out), write)
    print(
        f"wrote {len(data['rewards'])} transitions ({options.episodes} episodes, mean return {returns.mean():.1f}; "
        f"ref_min {metadata['ref_min_score']:.1f}, ref_max {metadata['ref_max_score']:.1f}) to {options.out}"
    )
    return metadata


def main(argv=None) -> int:
    options = tyro.cli(Options, args=argv)
    try:
        ok = 0 < options.episodes <= 1024 and 0 <= options.noise <= 10
        sac.require(ok, "--episodes in 1..1024, --noise in [0, 10]")
        folder = os.path.dirname(os.path.abspath(options.out))
        sac.require(os.path.isdir(folder), f"{folder} is not a folder")
        sac.jax.config.update("jax_cpu_enable_async_dispatch", False)
        write_dataset(options)
    except (sac.ConfigError, sac.RunFailed, OSError, MemoryError) as e:
        print(f"sac_dataset.py: error: {str(e) or 'out of memory'}", file=sys.stderr)
        return 2 if isinstance(e, sac.ConfigError) else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
