"""Evaluate a model.npz or checkpoint.npz written by algos/bc_offline.py, as its runs evaluate.

    python tools/bc_evaluate.py runs/<run>                      # its model.npz, the run's own protocol
    python tools/bc_evaluate.py runs/<run>/checkpoint.npz --episodes 20 --capture-video

The file's meta.json names the env, the loss and the network, checked as the script checks a resumed
run's; an env id that names a module (module:Env) is refused. Videos go to videos/ beside the file.
"""

import dataclasses
import functools
import os
import sys
from typing import Optional

import tyro

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "algos"))
import bc_offline as bc  # noqa: E402


@dataclasses.dataclass
class Options:
    path: tyro.conf.Positional[str]
    """a run folder (its model.npz), a model.npz or a checkpoint.npz"""
    episodes: int = 10
    """episodes, run as parallel envs"""
    seed: Optional[int] = None
    """seed of the envs (default: the run's evaluation seed)"""
    capture_video: bool = False
    """film the first episode into videos/ beside the file"""


def main(argv=None) -> int:
    options = tyro.cli(Options, args=argv)
    try:
        bc.require(0 < options.episodes <= 1024, "--episodes must be in 1..1024")
        bc.require(options.seed is None or 0 <= options.seed < 2**31, "--seed must be in [0, 2^31)")
        bc.jax.config.update("jax_cpu_enable_async_dispatch", False)
        path = os.path.join(options.path, "model.npz") if os.path.isdir(options.path) else options.path
        meta, policy, params, stats = bc.load_model(path)
        env_fn = functools.partial(bc.make_env, meta["env_id"])
        envs = env_fn(1)
        obs_shape, space = envs.single_observation_space.shape, envs.single_action_space
        envs.close()
        discrete = isinstance(space, bc.gym.spaces.Discrete)
        fits = bc.np.prod(obs_shape) == len(stats.mean) and (meta["mode"] == "discrete") == discrete
        fits = fits and meta["out_dim"] == (int(space.n) if discrete else int(bc.np.prod(space.shape)))
        model = f"the model maps {len(stats.mean)} features to {meta['out_dim']} actions"
        bc.require(fits, f"{path}: {model}; {meta['env_id']} has observations {obs_shape} and actions {space}")
        seed = bc.args_from_json(meta["args"], path).seed + 10_000 if options.seed is None else options.seed
        video = None
        if options.capture_video:
            video = (os.path.join(os.path.dirname(os.path.abspath(path)), "videos"), "eval")
            links = os.path.isdir(video[0]) and any(os.path.islink(f"{video[0]}/{n}") for n in os.listdir(video[0]))
            bc.require(not os.path.islink(video[0]) and not links, f"{video[0]} is or holds a symlink: not written")
            bc.check_args(bc.Args(capture_video=True))  # moviepy is there
        act = bc.make_act(policy, meta["mode"])
        returns = bc.evaluate(act, params, stats, env_fn, options.episodes, seed, video)
    except bc.ConfigError as e:
        print(f"bc_evaluate.py: error: {e}", file=sys.stderr)
        return 2
    except (OSError, MemoryError) as e:  # a file it may not read, a folder it may not write, ...
        print(f"bc_evaluate.py: error: {str(e) or 'out of memory'}", file=sys.stderr)
        return 1
    score = bc.normalized_score(returns, meta.get("ref_min"), meta.get("ref_max"))
    print(
        f"eval {meta['env_id']}: {returns.mean():.2f} +- {returns.std():.2f} over {len(returns)} episodes, "
        f"normalised score {score:.1f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
