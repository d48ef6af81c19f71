"""Evaluate a model.npz or checkpoint.npz written by algos/sac.py, as its runs evaluate (tanh of the mean).

    python tools/sac_evaluate.py runs/<run>                      # its model.npz, the run's own protocol
    python tools/sac_evaluate.py runs/<run>/checkpoint.npz --episodes 20 --capture-video

The file's flags choose the network and the env, checked as the script checks a resumed run's; an env
id that names a module (module:Env) is used only when --env-id repeats it. Videos go to videos/ beside
the file.
"""

import dataclasses
import functools
import os
import sys
from typing import Optional

import tyro

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "algos"))
import sac  # noqa: E402


@dataclasses.dataclass
class Options:
    path: tyro.conf.Positional[str]
    """a run folder (its model.npz), a model.npz or a checkpoint.npz"""
    episodes: int = 10
    """episodes, run as parallel envs"""
    seed: Optional[int] = None
    """seed of the envs (default: the run's evaluation seed)"""
    env_id: Optional[str] = None
    """the env (default: the run's)"""
    capture_video: bool = False
    """film the first episode into videos/ beside the file"""


def known_flags(flags):
    """A saved model's flags less those this version no longer has: evaluating the model needs none of them."""
    known = {field.name for field in dataclasses.fields(sac.Args)}
    return {k: v for k, v in flags.items() if k in known} if isinstance(flags, dict) else flags


def load_policy(path: str, env_id: Optional[str] = None):
    """(act, params, the run's Args, env_fn, file path) of a saved model or checkpoint."""
    path = os.path.join(path, "model.npz") if os.path.isdir(path) else path
    kind = "checkpoint" if os.path.basename(path).startswith("checkpoint") else "model"
    meta, arrays = sac.load_npz(path, kind)
    saved = sac.args_from_json(known_flags(meta.get("args")), path)
    sac.require(":" not in saved.env_id or env_id == saved.env_id, f"{path}: env id {saved.env_id!r} imports a module")
    env_fn = functools.partial(sac.make_env, env_id or saved.env_id)
    envs = env_fn(1)
    obs_dim, action_dim = envs.single_observation_space.shape[0], int(sac.np.prod(envs.single_action_space.shape))
    envs.close()
    actor = sac.Actor(action_dim, saved.hidden_sizes)
    template = actor.init(sac.jax.random.PRNGKey(0), sac.jnp.zeros((1, obs_dim)))
    prefix = "train_state/actor_params/" if kind == "checkpoint" else "params/"
    params = sac.jax.device_put(
        sac.restore_tree(template, arrays, prefix, path), sac.actor_device("cpu", sac.jax.devices())
    )
    return sac.make_act(actor), params, saved, env_fn, path  # acts on the host CPU


def main(argv=None) -> int:
    options = tyro.cli(Options, args=argv)
    try:
        sac.require(0 < options.episodes <= 1024, "--episodes must be in 1..1024")
        sac.require(options.seed is None or 0 <= options.seed < 2**31, "--seed must be in [0, 2^31)")
        sac.jax.config.update("jax_cpu_enable_async_dispatch", False)
        act, params, saved, env_fn, path = load_policy(options.path, options.env_id)
        seed = saved.seed + 10_000 if options.seed is None else options.seed
        video = None
        if options.capture_video:
            video = (os.path.join(os.path.dirname(os.path.abspath(path)), "videos"), "eval")
            links = os.path.isdir(video[0]) and any(os.path.islink(f"{video[0]}/{n}") for n in os.listdir(video[0]))
            sac.require(not os.path.islink(video[0]) and not links, f"{video[0]} is or holds a symlink: not written")
            sac.check_args(sac.Args(capture_video=True))  # moviepy is there
        returns = sac.evaluate(act, params, env_fn, options.episodes, seed, video)
    except sac.ConfigError as e:
        print(f"sac_evaluate.py: error: {e}", file=sys.stderr)
        return 2
    except (OSError, MemoryError) as e:  # a file it may not read, a folder it may not write, ...
        print(f"sac_evaluate.py: error: {str(e) or 'out of memory'}", file=sys.stderr)
        return 1
    env_id = options.env_id or saved.env_id
    print(f"eval {env_id}: {returns.mean():.2f} +- {returns.std():.2f} over {len(returns)} episodes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
