"""What one Ape-X actor and one learner update cost on this machine, and the scaling they predict.

Measured in one process, one thing at a time (no Ray: the costs of the work itself):
  actor:   env steps/s of apex_dqn.Actor.collect (acting, n-step assembly, the chunk's initial
           priorities) on CartPole-v1 (the MLP) and on ALE/Pong-v5 (--preset atari's dueling
           Nature CNN; 4 frames a step);
  learner: SGD updates/s of apex_dqn.make_update on batches already on the device, CartPole at the
           defaults (K = 32, B = 128) and Atari at --preset atari (B = 512; K = 4, unrolled on CPU).
Then a projection, stated as one: with the learner at U updates/s of B rows, and each actor at A
env steps/s, the learner keeps a replay ratio of R samples per env step up to N = U * B / (R * A)
actors; beyond that the ratio falls. R: CartPole, the default cap (B / --train-frequency = 64);
Atari, Nature DQN's one update of 32 per 4 steps (R = 8).

    python benchmark/apex_costs.py [--out results/apex_costs.json]
"""

import argparse
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))
from benchmark_summary import machine  # noqa: E402
from helpers import load_script  # noqa: E402

apex = load_script("apex_dqn")
import jax  # noqa: E402
import numpy as np  # noqa: E402

CASES = {
    "CartPole-v1": {"args": {}, "K": 32, "ratio": 64},
    "ALE/Pong-v5": {"args": {**apex.ATARI_PRESET, "num_actors": 2}, "K": 4, "ratio": 8},
}


def actor_rate(args, seconds: float) -> float:
    actor = apex.Actor(args, index=0, num_actors=1, seed=0)
    space, n = actor.envs.single_observation_space, int(actor.envs.single_action_space.n)
    network = apex.QNetwork(n, args.hidden_sizes, planes=apex.is_planes(space), dueling=args.dueling)
    params = network.init(jax.random.PRNGKey(0), np.zeros((1,) + space.shape, np.float32))
    latest = [(0, (params, params))]
    actor.collect(latest)  # compile
    start, steps0 = time.perf_counter(), actor.steps
    while time.perf_counter() - start < seconds:
        actor.collect(latest)
    return (actor.steps - steps0) * args.num_envs / (time.perf_counter() - start)


def learner_rate(args, env_id: str, K: int, calls: int) -> float:
    envs = apex.make_env(env_id, 1)
    space, n = envs.single_observation_space, int(envs.single_action_space.n)
    envs.close()
    network = apex.QNetwork(n, args.hidden_sizes, planes=apex.is_planes(space), dueling=args.dueling)
    optimizer = apex.make_optimizer(args)
    state = apex.init_train_state(network, optimizer, space.shape, jax.random.PRNGKey(0))
    update = apex.make_update(network.apply, optimizer, args, unroll=len(space.shape) == 3)
    rng = np.random.default_rng(0)
    B = args.batch_size
    obs = rng.integers(0, 255, (K, B) + space.shape).astype(space.dtype)
    batches = jax.device_put(
        {
            "obs": obs,
            "next_obs": obs,
            "action": rng.integers(0, n, (K, B)),
            "reward": rng.normal(size=(K, B)).astype(np.float32),
            "discount": np.full((K, B), 0.99, np.float32),
            "weights": np.ones((K, B), np.float32),
        }
    )
    lr = np.float32(args.learning_rate)
    state, _, td = update(state, batches, lr)  # compile
    jax.block_until_ready(td)
    start = time.perf_counter()
    for _ in range(calls):
        state, _, td = update(state, batches, lr)
    jax.block_until_ready(td)
    return calls * K / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="acting time per env")
    parser.add_argument("--envs", nargs="+", default=list(CASES), choices=list(CASES))
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    jax.config.update("jax_cpu_enable_async_dispatch", False)
    results = []
    for env_id in args.envs:
        case = CASES[env_id]
        run_args = apex.Args(**{**case["args"], "env_id": env_id})
        a = actor_rate(run_args, args.seconds)
        u = learner_rate(run_args, env_id, case["K"], calls=20 if env_id == "CartPole-v1" else 2)
        n = u * run_args.batch_size / (case["ratio"] * a)
        results.append(
            {
                "env_id": env_id,
                "actor_env_steps_per_s": a,
                "learner_updates_per_s": u,
                "batch_size": run_args.batch_size,
                "replay_ratio": case["ratio"],
                "actors_the_learner_keeps_up_with": n,
            }
        )
        print(
            f"{env_id}: one actor {a:.0f} env steps/s; learner {u:.1f} updates/s of {run_args.batch_size}; "
            f"at {case['ratio']} samples per env step the learner keeps up with {n:.2f} actors"
        )
    report = {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "machine": machine(),
        "backend": jax.default_backend(),
        "device": str(jax.devices()[0]),
        "results": results,
    }
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=2)


if __name__ == "__main__":
    main()
