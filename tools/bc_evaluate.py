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


def known_flags(flags):
    """A saved model's flags less those this version no longer has: evaluating the model needs none of them."""
    known = {field.name for field in dataclasses.fields(bc.Args)}
    return {k: v for k, v in flags.items() if k in known} if isinstance(flags, dict) else flags


def load_model(path: str):
    """(meta, policy, params, obs stats) of a model.npz or checkpoint.npz, every part checked."""
    kind = "checkpoint" if os.path.basename(path).startswith("checkpoint") else "model"
    meta, arrays = bc.load_npz(path, kind)
    meta["args"] = known_flags(meta.get("args"))
    saved = bc.args_from_json(meta["args"], path)
    env_id, mode, out_dim = meta.get("env_id"), meta.get("mode"), meta.get("out_dim")
    scores = all(meta.get(k) is None or type(meta.get(k)) in (int, float) for k in ("ref_min", "ref_max"))
    bc.require(":" not in str(env_id), f"{path}: env id {env_id!r} names a module to import; not taken from a file")
    ok = isinstance(env_id, str) and mode in ("discrete", "mse", "nll") and scores
    ok = ok and type(out_dim) is int and 0 < out_dim <= 65_536
    bc.require(ok, f"{path}: meta.json's env_id, mode, out_dim or scores")
    mean = arrays.get("obs_mean")
    dim = mean.shape[0] if isinstance(mean, bc.np.ndarray) and mean.ndim == 1 else 0
    stats = bc.ObsStats(*(bc.checked_array(arrays, k, (dim,), bc.np.float32, path) for k in ("obs_mean", "obs_std")))
    policy = bc.Policy(out_dim, saved.hidden_sizes, mode == "nll")
    template = policy.init(bc.jax.random.PRNGKey(0), bc.jnp.zeros((1, dim)))
    params = bc.restore_tree(template, arrays, "train_state/params/" if kind == "checkpoint" else "params/", path)
    return meta, policy, params, stats


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
        meta, policy, params, stats = load_model(path)
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
