"""Evaluate a model.npz or checkpoint.npz written by algos/dqn_prioritized.py, as its runs evaluate.

    python tools/dqn_evaluate.py runs/<run>                      # its model.npz, the run's own protocol
    python tools/dqn_evaluate.py runs/<run>/checkpoint.npz --episodes 20 --epsilon 0.05 --capture-video

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
import dqn_prioritized as dqn  # noqa: E402


@dataclasses.dataclass
class Options:
    path: tyro.conf.Positional[str]
    """a run folder (its model.npz), a model.npz or a checkpoint.npz"""
    episodes: int = 10
    """episodes, run as parallel envs"""
    epsilon: Optional[float] = None
    """epsilon of the policy (default: the run's --eval-epsilon)"""
    seed: Optional[int] = None
    """seed of the envs (default: the run's evaluation seed)"""
    env_id: Optional[str] = None
    """the env (default: the run's)"""
    capture_video: bool = False
    """film the first episode into videos/ beside the file"""


def known_flags(flags):
    """A saved model's flags less those this version no longer has: evaluating the model needs none of them."""
    known = {field.name for field in dataclasses.fields(dqn.Args)}
    return {k: v for k, v in flags.items() if k in known} if isinstance(flags, dict) else flags


def load_policy(path: str, env_id: Optional[str] = None):
    """(act, params, the run's Args, env_fn, file path) of a saved model or checkpoint."""
    path = os.path.join(path, "model.npz") if os.path.isdir(path) else path
    kind = "checkpoint" if os.path.basename(path).startswith("checkpoint") else "model"
    meta, arrays = dqn.load_npz(path, kind)
    saved = dqn.args_from_json(known_flags(meta.get("args")), path)
    dqn.require(":" not in saved.env_id or env_id == saved.env_id, f"{path}: env id {saved.env_id!r} imports a module")
    env_fn = functools.partial(dqn.make_env, env_id or saved.env_id)
    envs = env_fn(1)
    num_actions, space = int(envs.single_action_space.n), envs.single_observation_space
    envs.close()
    network = dqn.make_network(saved, space, num_actions)  # the script's own, as its run built it
    template = network.init(dqn.jax.random.PRNGKey(0), dqn.jnp.zeros((1,) + space.shape, dqn.jnp.float32))
    params = dqn.restore_tree(template, arrays, "train_state/params/" if kind == "checkpoint" else "params/", path)
    params = dqn.jax.device_put(params, dqn.actor_device("cpu", dqn.jax.devices()))  # acts on the host CPU
    return dqn.make_act(network.apply, num_actions), params, saved, env_fn, path


def main(argv=None) -> int:
    options = tyro.cli(Options, args=argv)
    try:
        dqn.require(0 < options.episodes <= 1024, "--episodes must be in 1..1024")
        dqn.require(options.epsilon is None or 0 <= options.epsilon <= 1, "--epsilon must be in [0, 1]")
        dqn.require(options.seed is None or 0 <= options.seed < 2**31, "--seed must be in [0, 2^31)")
        dqn.jax.config.update("jax_cpu_enable_async_dispatch", False)
        act, params, saved, env_fn, path = load_policy(options.path, options.env_id)
        epsilon = saved.eval_epsilon if options.epsilon is None else options.epsilon
        seed = saved.seed + 10_000 if options.seed is None else options.seed
        video = None
        if options.capture_video:
            video = (os.path.join(os.path.dirname(os.path.abspath(path)), "videos"), "eval")
            links = os.path.isdir(video[0]) and any(os.path.islink(f"{video[0]}/{n}") for n in os.listdir(video[0]))
            dqn.require(not os.path.islink(video[0]) and not links, f"{video[0]} is or holds a symlink: not written")
            dqn.check_args(dqn.Args(capture_video=True))  # moviepy is there
        returns = dqn.evaluate(act, params, env_fn, options.episodes, epsilon, seed, video)
    except dqn.ConfigError as e:
        print(f"dqn_evaluate.py: error: {e}", file=sys.stderr)
        return 2
    except (OSError, MemoryError) as e:  # a file it may not read, a folder it may not write, ...
        print(f"dqn_evaluate.py: error: {str(e) or 'out of memory'}", file=sys.stderr)
        return 1
    print(
        f"eval {saved.env_id}: {returns.mean():.2f} +- {returns.std():.2f} "
        f"over {len(returns)} episodes (epsilon {epsilon})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
