"""Convert a model.pkl written by an earlier version of algos/*.py into today's model.npz.

    python tools/convert_pkl.py runs/<run>/model.pkl        # writes runs/<run>/model.npz

Only for a file you trust: this is the one place in the project that unpickles, and unpickling
runs whatever code the file holds. The scripts themselves refuse .pkl files. The parameters are
checked against the network the script builds for the file's flags (count, shape, dtype of each
leaf) and written with the script's own writer, so the result loads as the script's own model.npz
(python tools/<script>_evaluate.py runs/<run>).

Old checkpoint.pkl files are not converted: their replay and optimiser state are tied to the
code that wrote them. Convert the run's model.pkl, or retrain.
"""

import dataclasses
import importlib.util
import json
import os
import pickle
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS = ("dqn_prioritized", "sac", "bc_offline")


def load_script(name: str):
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "algos", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def template_params(m, old: dict, args):
    """The parameters of the network the script builds for these flags (values unused)."""
    import jax
    import jax.numpy as jnp

    key = jax.random.PRNGKey(0)
    if m.SCRIPT == "dqn_prioritized":
        envs = m.make_env(args.env_id, 1)
        n, space = int(envs.single_action_space.n), envs.single_observation_space
        envs.close()
        network = m.make_network(args, space, n)
        return network.init(key, jnp.zeros((1,) + space.shape, jnp.float32)), {}
    if m.SCRIPT == "sac":
        envs = m.make_env(args.env_id, 1)
        obs_dim, action_dim = envs.single_observation_space.shape[0], envs.single_action_space.shape[0]
        envs.close()
        return m.Actor(action_dim, args.hidden_sizes).init(key, jnp.zeros((1, obs_dim))), {}
    mean, std = (np.asarray(old[k], np.float32) for k in ("obs_mean", "obs_std"))
    policy = m.Policy(int(old["out_dim"]), args.hidden_sizes, old["mode"] == "nll")
    return policy.init(key, jnp.zeros((1, len(mean)))), {"obs_mean": mean, "obs_std": std}


def convert(path: str) -> str:
    with open(path, "rb") as f:
        old = pickle.load(f)  # the explicit, trusted-file-only step
    script = str(old.get("format", "")).split("/")[0] if isinstance(old, dict) else ""
    if script not in SCRIPTS or "params" not in old or "args" not in old:
        raise SystemExit(f"{path}: not a model.pkl of {', '.join(SCRIPTS)}")
    if "train_state" in old:
        raise SystemExit(f"{path}: a checkpoint; convert the run's model.pkl instead (see this file's docstring)")
    m = load_script(script)
    import jax

    # The pickle holds Python values (tuples, numpy scalars); the checks take what JSON gives.
    try:
        flags = json.loads(json.dumps(old["args"], default=lambda x: x.item() if hasattr(x, "item") else str(x)))
        if isinstance(flags, dict):  # flags removed since that version: the model needs none of them
            flags = {k: v for k, v in flags.items() if k in {f.name for f in dataclasses.fields(m.Args)}}
        args = m.args_from_json(flags, path)
        template, extra = template_params(m, old, args)  # makes the env: a ConfigError if it cannot
    except m.ConfigError as e:
        raise SystemExit(f"convert_pkl.py: error: {e}") from None
    leaves, treedef = jax.tree_util.tree_flatten(template)
    saved = [np.asarray(x) for x in old["params"]]
    if len(saved) != len(leaves) or any(a.shape != b.shape or a.dtype != b.dtype for a, b in zip(saved, leaves)):
        raise SystemExit(f"{path}: its parameters do not fit the network {script}.py builds for its flags")
    params = jax.tree_util.tree_unflatten(treedef, saved)
    flags = json.loads(json.dumps(m.dataclasses.asdict(args)))  # as the script writes them (removed ones dropped)
    meta = {"format": m.FORMAT, "script": m.SCRIPT, "kind": "model", "args": flags}
    if script == "bc_offline":
        meta.update({k: old.get(k) for k in ("env_id", "mode", "out_dim", "ref_min", "ref_max")})
        meta["out_dim"] = int(meta["out_dim"])
        for k in ("ref_min", "ref_max"):
            meta[k] = None if meta[k] is None else float(meta[k])
    out = os.path.splitext(path)[0] + ".npz"
    m.save_npz(out, meta, {**m.tree_arrays("params/", params), **extra})
    return out


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(__doc__.strip().splitlines()[2].strip())
    print("wrote", convert(sys.argv[1]))
