"""How far is SAC's update from this CPU's matmul ceiling? (issue 15: profile and push)

Measured in one process, one thing at a time, with XLA's default flags (sac.py sets none;
--eigen-single-thread adds --xla_cpu_multi_thread_eigen=false, which dqn_prioritized.py set until
2026-12-01, to see what it changes: on jax 0.10.2, nothing):
  ceiling:  float32 matmuls n x n x n (n = 256 ... 2048) under jit, the best GFLOP/s of any size;
  flops:    XLA's own count (compiled cost analysis) of one critic gradient and one actor+alpha
            gradient at sac.py's settings (batch --batch-size, --hidden-sizes), summed as one SGD
            step does them on average (one critic step, policy_frequency actor steps every
            policy_frequency SGD steps = one per step);
  achieved: sac.make_update's fused call (K = --updates-per-call SGD steps, batch on the device),
            the median time per SGD step over repeated calls, and flops / time.

    python benchmark/sac_flops.py [--env-id Pendulum-v1] [--eigen-single-thread] [--out FILE]
"""

import argparse
import functools
import json
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))
if "--eigen-single-thread" in sys.argv:  # before jax starts
    os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_cpu_multi_thread_eigen=false"
from benchmark_summary import machine  # noqa: E402
from helpers import load_script  # noqa: E402

sac = load_script("sac")
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

CPU_PER_WALL = {}  # what each timed function kept busy: process CPU seconds per wall second


def timed(fn, *args, repeats: int, name: str) -> float:
    """Median seconds per call, the result waited for; CPU_PER_WALL[name] tells how many cores
    the calls kept busy (1.0: one thread)."""
    jax.block_until_ready(fn(*args))
    times, cpu0, wall0 = [], time.process_time(), time.perf_counter()
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    CPU_PER_WALL[name] = (time.process_time() - cpu0) / (time.perf_counter() - wall0)
    return statistics.median(times)


def matmul_ceiling(repeats: int) -> dict:
    matmul = jax.jit(lambda a, b: a @ b)
    rates = {}
    for n in (256, 512, 1024, 2048):
        a = jnp.asarray(np.random.default_rng(n).normal(size=(n, n)), jnp.float32)
        rates[n] = 2 * n**3 / timed(matmul, a, a, repeats=repeats, name=f"matmul {n}") / 1e9
    return {"gflops_by_size": rates, "gflops": max(rates.values())}


def flops_of(fn, *args) -> float:
    analysis = jax.jit(fn).lower(*args).compile().cost_analysis()
    analysis = analysis[0] if isinstance(analysis, (list, tuple)) else analysis
    return float(analysis["flops"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env-id", default="Pendulum-v1")
    parser.add_argument(
        "--eigen-single-thread", action="store_true", help="add --xla_cpu_multi_thread_eigen=false to XLA_FLAGS"
    )
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--out", default=None)
    cli = parser.parse_args()
    jax.config.update("jax_cpu_enable_async_dispatch", False)  # as sac.train does
    args = sac.Args(env_id=cli.env_id)
    envs = sac.make_env(args.env_id, 1)
    obs_dim, action_dim = envs.single_observation_space.shape[0], envs.single_action_space.shape[0]
    envs.close()
    nets = sac.make_nets(args, action_dim)
    state = sac.init_train_state(nets, args, obs_dim, action_dim, jax.random.PRNGKey(0))
    K, B = args.updates_per_call, args.batch_size
    rng = np.random.default_rng(0)
    batch = {
        "obs": rng.normal(size=(B, obs_dim)).astype(np.float32),
        "action": rng.uniform(-1, 1, (B, action_dim)).astype(np.float32),
        "reward": rng.normal(size=B).astype(np.float32),
        "next_obs": rng.normal(size=(B, obs_dim)).astype(np.float32),
        "discount": np.full(B, 0.99, np.float32),
        "weights": np.ones(B, np.float32),
    }
    key = jax.random.PRNGKey(1)
    critic = jax.grad(sac.critic_loss, argnums=1, has_aux=True)
    actor = jax.grad(sac.actor_alpha_loss, argnums=(1, 2), has_aux=True)
    critic_flops = flops_of(
        lambda cp, st, b, k: critic(nets, cp, st, b, k, args.huber_delta), state.critic_params, state, batch, key
    )
    actor_flops = flops_of(
        lambda ap, la, cp, o, k: actor(nets, ap, la, cp, o, k, -float(action_dim)),
        state.actor_params,
        state.log_alpha,
        state.critic_params,
        batch["obs"],
        key,
    )
    step_flops = critic_flops + actor_flops

    shardings = sac.learner_shardings(args)
    update = sac.make_update(nets, args, action_dim)
    batches = jax.device_put({k: np.stack([v] * K) for k, v in batch.items()}, shardings.batch)
    state = jax.device_put(state, shardings.replicated)

    def call(state, batches, key):
        return update(state, batches, key)

    # The update donates its state: carry it from call to call.
    holder = {"state": state}

    def one_call(batches, key):
        holder["state"], metrics, priorities = call(holder["state"], batches, key)
        return priorities

    per_step = timed(functools.partial(one_call, batches), key, repeats=cli.repeats, name="sac update") / K
    ceiling = matmul_ceiling(cli.repeats)
    achieved = step_flops / per_step / 1e9
    report = {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "machine": machine(),
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        "env_id": args.env_id,
        "batch_size": B,
        "hidden_sizes": list(args.hidden_sizes),
        "updates_per_call": K,
        "critic_grad_mflops": critic_flops / 1e6,
        "actor_grad_mflops": actor_flops / 1e6,
        "sgd_step_us": per_step * 1e6,
        "achieved_gflops": achieved,
        "matmul_ceiling": ceiling,
        "fraction_of_ceiling": achieved / ceiling["gflops"],
        "cpu_seconds_per_wall_second": CPU_PER_WALL,
    }
    print(
        f"SAC {args.env_id}, B={B}, hidden {args.hidden_sizes}: {step_flops / 1e6:.1f} MFLOP per SGD step "
        f"(critic {critic_flops / 1e6:.1f}, actor {actor_flops / 1e6:.1f}), {per_step * 1e6:.0f} us per step: "
        f"{achieved:.1f} GFLOP/s; matmul ceiling {ceiling['gflops']:.1f} GFLOP/s "
        f"({', '.join(f'{n}: {r:.1f}' for n, r in ceiling['gflops_by_size'].items())}); "
        f"{100 * achieved / ceiling['gflops']:.0f}% of it; cores kept busy: "
        + ", ".join(f"{name} {busy:.2f}" for name, busy in CPU_PER_WALL.items())
    )
    if cli.out:
        with open(cli.out, "w") as f:
            json.dump(report, f, indent=2)


if __name__ == "__main__":
    main()
