"""Where an env step's time goes in dqn_prioritized.py at CleanRL's DQN settings (issue 15).

The settings are the speed comparison's (benchmark/speed_vs_peers.py: CartPole-v1, 1 env, 120-84 MLP,
batch 128, one SGD step per 10 env steps, K = 32 SGD steps per jitted call, uniform one-step
replay). Two measurements, one after the other in one sitting:

  parts: each piece of the training loop timed alone in this process, the median over --repeats
         timings of --calls calls each (update: of max(3, calls // 500) calls; store: one pass),
         and put per env step:
           env step          the script's vector env (1 env, autoreset, wrappers), random actions;
           env step, bare    CartPole's own step function (the floor for any implementation);
           act               the jitted epsilon-greedy call with its result read back (make_act);
           store             n-step assembly and the replay's staged insert (NStepAssembler.push,
                             PrioritizedReplay.add) of the env's transitions, one timed pass;
           update            one fused update call (make_update: K SGD steps on batches that
                             sample_batches put on the device, the state placed as train()
                             places it), its result waited for, divided by the K *
                             train_frequency env steps it serves;
         and, not in the sum (train() runs them on its two worker threads), the per-call cost of
         the prefetch thread's sample_batches and of the writer thread's write_priorities, also
         put per env step as the update is (other_threads_per_env_step_us);
  loop:  the script itself run as a subprocess for --loop-steps env steps with those flags: the
         median env steps/s over its log windows that learned (benchmark_summary.read_throughput),
         as microseconds per env step. The part of it the pieces above do not explain is the
         rest of the loop: episode bookkeeping, the prefetch and priority threads' share of the
         cores, and the pieces' own extra cost inside the loop (docs/benchmarks.md: most of it).

    python benchmark/dqn_step_costs.py [--repeats 5] [--loop-steps 200000] [--out FILE]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))
sys.path.insert(0, os.path.join(ROOT, "benchmark"))
from benchmark_summary import machine, read_throughput  # noqa: E402
from helpers import load_script  # noqa: E402
from speed_vs_peers import QUIET, SAME  # noqa: E402

dqn = load_script("dqn_prioritized")
import gymnasium as gym  # noqa: E402
import jax  # noqa: E402
import numpy as np  # noqa: E402

FLAGS = SAME["dqn"]["ours"][1:]  # the speed comparison's flags, without the script's path


def per_call_us(fn, calls: int, repeats: int) -> float:
    """Median over `repeats` timings of `calls` calls of fn(i), in microseconds per call."""
    fn(0)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for i in range(calls):
            fn(i)
        times.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(times)


def amortized_update_us(call_us: float, updates_per_call: int, train_frequency: int) -> float:
    """An update call serves updates_per_call * train_frequency env steps."""
    return call_us / (updates_per_call * train_frequency)


def parts(args, repeats: int, calls: int) -> dict:
    envs = dqn.make_env(args.env_id, 1)
    obs, _ = envs.reset(seed=args.seed)
    envs.action_space.seed(args.seed)
    num_actions = int(envs.single_action_space.n)
    actions = [envs.action_space.sample() for _ in range(calls)]
    # The transitions "store" replays: one pass of its own, so that step i is what actions[i] did.
    recorded = [envs.step(a) for a in actions]
    costs = {"env step": per_call_us(lambda i: envs.step(actions[i]), calls, repeats)}

    bare = gym.make(args.env_id).unwrapped
    bare.reset(seed=args.seed)

    def bare_step(i):
        if bare.step(int(actions[i][0]))[2]:
            bare.reset()

    costs["env step, bare"] = per_call_us(bare_step, calls, repeats)

    network = dqn.QNetwork(num_actions, args.hidden_sizes)
    optimizer = dqn.make_optimizer(args, 1_000_000)
    state = dqn.init_train_state(network, optimizer, obs.shape[1:], jax.random.PRNGKey(args.seed))
    act = dqn.make_act(network.apply, num_actions)
    rng = np.random.default_rng(args.seed + 1)
    params = dqn.actor_copy(state.params, jax.devices("cpu")[0])  # as the loop acts
    costs["act"] = per_call_us(lambda i: act(params, obs, 0.05, rng), calls, repeats)

    replay, nstep = dqn.make_replay(args, envs.single_observation_space)
    previous = [obs] + [r[0] for r in recorded[:-1]]

    def store():
        for i, (next_obs, reward, terminated, truncated, info) in enumerate(recorded):
            reached = dqn.real_next_obs(next_obs, terminated | truncated, info)
            replay.add(nstep.push(previous[i], actions[i], reward, reached, terminated, truncated))

    start = time.perf_counter()
    store()  # one pass over the stream, as the loop makes it: a repeat would push it twice
    costs["store"] = (time.perf_counter() - start) / len(recorded) * 1e6

    # The learner as train() runs it: the state replicated on the learner's devices, batches[K, B]
    # drawn from the replay that "store" filled and put on the devices by sample_batches (the
    # prefetch thread's call), priorities checked and written back by write_priorities (the writer
    # thread's call). The state must be placed as train() places it: an unplaced state compiles
    # the update a second time on its second call, inside the timing.
    K = args.updates_per_call
    shardings = dqn.learner_shardings(args)
    update = dqn.make_update(network.apply, optimizer, args)
    state = jax.device_put(state, shardings.replicated)
    replay.flush()
    replay.beta = args.per_beta0
    batches, indexes, stamps = dqn.sample_batches(replay, args, shardings.batch)

    def update_call(i):
        nonlocal state  # the update donates its input state
        state, _, td = update(state, batches)
        jax.block_until_ready(td)

    call_us = per_call_us(update_call, max(3, calls // 500), repeats)
    costs["update"] = amortized_update_us(call_us, K, args.train_frequency)

    # Off the main thread in train(), so not part of its time per env step (they take a share of
    # the cores): per call, and per env step as the update is.
    def sample_call(i):
        jax.block_until_ready(dqn.sample_batches(replay, args, shardings.batch)[0])

    state, _, priorities = update(state, batches)
    jax.block_until_ready(priorities)
    threads = {
        "sample_batches": per_call_us(sample_call, max(3, calls // 100), repeats),
        "write_priorities": per_call_us(
            lambda i: dqn.write_priorities(replay, args.prioritized, indexes, stamps, priorities, 0),
            max(3, calls // 100),
            repeats,
        ),
    }
    envs.close()
    return {
        "per_env_step_us": costs,
        "update_call_us": call_us,
        "other_threads_per_call_us": threads,
        "other_threads_per_env_step_us": {
            name: amortized_update_us(us, K, args.train_frequency) for name, us in threads.items()
        },
        "episodes_in_store": int(sum(bool(np.any(r[2] | r[3])) for r in recorded)),
    }


def loop(steps: int) -> dict:
    with tempfile.TemporaryDirectory() as run_dir:
        flags = list(FLAGS)
        flags[flags.index("--total-timesteps") + 1] = str(steps)
        cmd = [sys.executable, os.path.join(ROOT, "algos", "dqn_prioritized.py"), *flags, *QUIET]
        start = time.perf_counter()
        out = subprocess.run(cmd + ["--run-dir", run_dir], capture_output=True, text=True, cwd=ROOT)
        wall = time.perf_counter() - start
        if out.returncode != 0:
            raise SystemExit(f"dqn_step_costs.py: error: the loop run failed: {out.stderr.strip()[-500:]}")
        _, learning_sps, _, _ = read_throughput(run_dir)
    return {"steps": steps, "wall_s": wall, "learning_sps": learning_sps, "per_env_step_us": 1e6 / learning_sps}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--calls", type=int, default=5000, help="calls per timing of the per-step parts")
    parser.add_argument("--loop-steps", type=int, default=200_000)
    parser.add_argument("--out")
    cli = parser.parse_args()
    args = dqn.parse_args(FLAGS)
    jax.config.update("jax_cpu_enable_async_dispatch", False)  # as dqn.train does
    result = {
        "when": time.strftime("%Y-%m-%d %H:%M:%S"),
        "machine": machine(),
        "jax": jax.__version__,
        "flags": FLAGS,
        **parts(args, cli.repeats, cli.calls),
        "loop": loop(cli.loop_steps),
    }
    explained = sum(result["per_env_step_us"].values()) - result["per_env_step_us"]["env step, bare"]
    result["rest_of_loop_us"] = result["loop"]["per_env_step_us"] - explained
    lines = ["| part | us per env step |", "|---|---:|"]
    for name, us in result["per_env_step_us"].items():
        lines.append(f"| {name}{' (included in env step)' if name == 'env step, bare' else ''} | {us:.1f} |")
    lines.append(f"| rest of the loop | {result['rest_of_loop_us']:.1f} |")
    lines.append(
        f"| the loop, learning phase ({result['loop']['learning_sps']:.0f} env steps/s) | "
        f"{result['loop']['per_env_step_us']:.1f} |"
    )
    result["table"] = "\n".join(lines)
    print(result["table"])
    if cli.out:
        with open(cli.out, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
