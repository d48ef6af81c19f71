"""Run by tests/test_multidevice.py in a fresh interpreter whose XLA_FLAGS force 2 host devices
(the flag is read once, when jax starts, so the pytest process itself cannot have them).

    python multidevice_worker.py update SCRIPT    # one fused update on 1 device vs on 2
    python multidevice_worker.py run SCRIPT DIR   # train on 2, resume on 1, resume on 2

Prints one JSON line that the test checks.
"""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import jax  # noqa: E402
import numpy as np  # noqa: E402
from helpers import load_script  # noqa: E402

assert len(jax.local_devices()) == 2, "XLA_FLAGS must force 2 host devices"
B, K = 16, 3  # B splits over 2 devices; K = 3 fused steps, two calls: the target period (2) falls inside


def filled_replay(mod, name: str, n: int = 256):
    """A replay of n rows whose obs[:, 0] is their slot (so a row can be told from its place), with
    random contents and random priorities so that the sample is not uniform."""
    rng = np.random.default_rng(0)
    obs = rng.normal(size=(n, 3)).astype(np.float32)
    obs[:, 0] = np.arange(n)
    if name == "bc_offline":
        replay = mod.PrioritizedDataset(obs, rng.uniform(-1, 1, (n, 1)).astype(np.float32), 0.6, 1e-3)
        replay.update_priorities(np.arange(n), rng.uniform(0.1, 2.0, n))
        return replay
    rows = {
        "obs": obs,
        "next_obs": rng.normal(size=(n, 3)).astype(np.float32),
        "reward": rng.normal(size=n).astype(np.float32),
        "discount": rng.choice([0.0, 0.99], n).astype(np.float32),
    }
    if name == "sac":
        replay = mod.PrioritizedReplay(n, 3, 1, 0.6, 1e-6)
        rows["action"] = rng.uniform(-1, 1, (n, 1)).astype(np.float32)
    else:
        replay = mod.PrioritizedReplay(n, (3,), np.float32, 0.6, 1e-6)
        rows["action"] = rng.integers(0, 2, n)
    replay.add(rows)
    replay.flush()
    replay.update_priorities(np.arange(n), replay.write_count.copy(), rng.uniform(0.1, 2.0, n))
    return replay


def learner(mod, name: str, num_devices: int):
    """(update(state, batches) -> (state, metrics, priorities), initial state, shardings)."""
    if name == "dqn_prioritized":
        args = mod.Args(
            batch_size=B, updates_per_call=K, target_network_frequency=2, hidden_sizes=(32, 32), num_devices=num_devices
        )
        net = mod.QNetwork(2, args.hidden_sizes)
        optimizer = mod.make_optimizer(args, 100)
        state = mod.init_train_state(net, optimizer, (3,), jax.random.PRNGKey(0))
        shardings = mod.learner_shardings(args)
        return mod.make_update(net.apply, optimizer, args, shardings), state, shardings
    if name == "sac":
        args = mod.Args(
            batch_size=B, updates_per_call=K, policy_frequency=2, hidden_sizes=(32, 32), num_devices=num_devices
        )
        nets = mod.make_nets(args, 1)
        state = mod.init_train_state(nets, args, 3, 1, jax.random.PRNGKey(0))
        update = mod.make_update(nets, args, 1, mod.learner_shardings(args))
        key = jax.random.PRNGKey(5)
        return (lambda s, b: update(s, b, key)), state, mod.learner_shardings(args)
    args = mod.Args(batch_size=B, updates_per_call=K, hidden_sizes=(32, 32), loss="nll", num_devices=num_devices)
    policy = mod.Policy(1, args.hidden_sizes, True)
    optimizer = mod.make_optimizer(args)
    params = policy.init(jax.random.PRNGKey(0), np.zeros((1, 3), np.float32))
    state = mod.TrainState(params, optimizer.init(params), np.zeros((), np.int32))
    stats = mod.ObsStats(np.zeros(3, np.float32), np.ones(3, np.float32))
    shardings = mod.learner_shardings(args)
    return mod.make_update(policy, "nll", optimizer, stats, shardings), state, shardings


def sample_batches(mod, name: str, replay, sharding=None):
    """One call's batches as the prefetch thread makes them (B and K from the script's Args)."""
    args = mod.Args(batch_size=B, updates_per_call=K, num_devices=len(sharding.device_set) if sharding else 1)
    if name == "dqn_prioritized":  # its Learner's sample, on the devices of `sharding`
        return mod.Learner(args, mod.QNetwork(2, (4,)), replay, (3,)).sample(0.4)
    if name == "sac":
        return mod.Learner(args, mod.make_nets(args, 1), replay, 3, 1).sample(0.4)
    stats = mod.ObsStats(np.zeros(3, np.float32), np.ones(3, np.float32))
    return mod.Learner(args, mod.Policy(1, (4,), True), "nll", stats, replay).sample(0.4)


def command_line(flags: dict) -> list:
    """The flags as typed on a command line: --name value, a tuple as its values."""
    argv = []
    for name, value in flags.items():
        argv += [f"--{name.replace('_', '-')}", *map(str, value if isinstance(value, (tuple, list)) else (value,))]
    return argv


def leaves(tree) -> dict:
    flat, _ = jax.tree_util.tree_flatten_with_path(jax.device_get(tree))
    return {jax.tree_util.keystr(p): np.asarray(x, np.float64) for p, x in flat}


def update_mode(name: str) -> dict:
    mod = load_script(name)
    replay = filled_replay(mod, name)
    calls = [sample_batches(mod, name, replay) for _ in range(2)]  # numpy copies below: the same data for both
    host = [{k: np.asarray(v) for k, v in c[0].items()} for c in calls]
    out, report = {}, {}
    for n in (1, 2):
        update, state, shardings = learner(mod, name, n)
        state = jax.device_put(state, shardings.replicated)
        priorities = []
        for batches in host:
            on_devices = jax.device_put(batches, shardings.split)
            state, metrics, p = update(state, on_devices)
            priorities.append(np.asarray(p))
        out[n] = (leaves(state), leaves(metrics), np.stack(priorities))
        report[f"state_devices_{n}"] = len(jax.tree_util.tree_leaves(state)[0].sharding.device_set)
    # What the prefetch thread hands over: each device holds its own contiguous half of B, and
    # the rows read back in the order of the sampled indexes (so priorities go back to their slots).
    shardings = learner(mod, name, 2)[2]
    batches, indexes = sample_batches(mod, name, replay, shardings.split)[:2]
    obs = batches["obs"]
    halves = sorted((s.index[1].start or 0, s.data.shape, str(s.device)) for s in obs.addressable_shards)
    report["shards"] = [[start, list(shape)] for start, shape, _ in halves]
    report["shard_devices"] = len({d for _, _, d in halves})
    report["rows_in_sampled_order"] = bool(np.array_equal(np.asarray(obs)[..., 0].reshape(-1), indexes))
    state1, metrics1, prio1 = out[1]
    state2, metrics2, prio2 = out[2]
    report["state_diff"] = {k: float(np.abs(state1[k] - state2[k]).max()) for k in state1}
    report["state_scale"] = {k: float(np.abs(state1[k]).max()) for k in state1}
    report["metrics_diff"] = {k: float(np.abs(metrics1[k] - metrics2[k]).max()) for k in metrics1}
    report["priorities_diff"] = float(np.abs(prio1 - prio2).max())
    report["priorities_scale"] = float(np.abs(prio1).max())
    initial = leaves(learner(mod, name, 1)[1])  # once: a learner per leaf cost SAC 140 s of init compiles
    report["moved"] = float(max(np.abs(state1[k] - initial[k]).max() for k in state1))
    errors = {}
    for args in ({"num_devices": 3}, {"num_devices": 2, "batch_size": 15}):
        try:
            mod.learner_shardings(mod.Args(**args))
        except mod.ConfigError as e:
            errors[json.dumps(args)] = str(e)
    report["errors"] = errors
    report["device_names"] = ", ".join(str(d) for d in jax.local_devices())
    report["all_devices"] = len(mod.learner_shardings(mod.Args(num_devices=-1)).split.mesh.devices)
    return report


def run_mode(name: str, folder: str) -> dict:
    """Train on 2 devices with a checkpoint, resume that on 1 device, then the result on 2 again."""
    mod = load_script(name)
    run_dir = os.path.join(folder, name)
    base = dict(eval_episodes=2, hidden_sizes=(32, 32), run_dir=run_dir)
    if name == "bc_offline":
        data = os.path.join(
            os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data", "pendulum-sac-expert.hdf5"
        )
        base.update(dataset=[data], batch_size=64, updates_per_call=50, eval_every=10_000, checkpoint_every=100)
        budgets, counter = ("total_updates", (300, 400, 500)), "updates"
    else:
        env = "CartPole-v1" if name == "dqn_prioritized" else "Pendulum-v1"
        base.update(
            env_id=env, batch_size=32, updates_per_call=4, learning_starts=300, eval_every=100_000, checkpoint_every=200
        )
        budgets, counter = ("total_timesteps", (600, 800, 1000)), "global_step"
    results = []
    for devices, budget in zip((2, 1, 2), budgets[1]):
        flags = {**base, budgets[0]: budget, "num_devices": devices}
        if results:
            flags["resume"] = run_dir
        result = mod.train(mod.parse_args(command_line(flags)))  # all typed, as on a command line
        meta = json.loads(np.load(os.path.join(run_dir, "checkpoint.npz"))["meta.json"].tobytes())
        results.append(
            {
                "devices": devices,
                "done": result[counter],
                "kept": sorted(f for f in os.listdir(run_dir) if f.startswith("checkpoint")),
                "checkpoint_args_devices": meta["args"]["num_devices"],
                "finite": bool(np.isfinite(result["eval_mean"])),
            }
        )
    return {"runs": results}


if __name__ == "__main__":
    mode, script = sys.argv[1], sys.argv[2]
    report = update_mode(script) if mode == "update" else run_mode(script, sys.argv[3])
    print("REPORT " + json.dumps(report))
