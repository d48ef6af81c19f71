"""What binds --preset atari on an accelerator, measured piece by piece: prints one JSON line per figure.

    python benchmark/atari_probe.py [--env-id ALE/Pong-v5] [--num-envs 32] [--fill 1000000] [PIECE ...]
    python benchmark/atari_probe.py agent RUN_DIR [SCRIPT FLAGS ...]   # the env limit, then the agent, their ratio

Pieces (default: all): envs (random actions, the preset's settings: one vector env of N, and two of N/2
stepped alternately by send/recv), chip (the update alone on batches already on the device; with the frames
on the device and only slots crossing), learner (the script's Learner from a filled replay, no acting),
policy (a policy call's round trip, alone and behind an update call). `agent` steps the envs of
--env-id/--num-envs as the flags make them (random actions, 40k steps, as one vector env and as two halves),
then runs algos/dqn_prioritized.py with the flags into RUN_DIR, and reports its median charts/SPS over the
second half of its steps, its whole process's agent steps per second, and their ratios to the env limit.
"""

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "algos"))
import dqn_prioritized as dqn  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402


def emit(**row):
    print(json.dumps(row), flush=True)


def env_limit(env_id, n, steps, groups):
    """Random actions through the script's EnvGroup: one vector env of n, or two of n/2 stepped in turn."""
    envs = [dqn.EnvGroup(dqn.make_env(env_id, n // groups), g * n // groups) for g in range(groups)]
    rng = np.random.default_rng(0)
    actions = envs[0].envs.single_action_space.n
    for g, e in enumerate(envs):
        e.envs.reset(seed=g)
        e.send(rng.integers(actions, size=n // groups))
    done, start = 0, time.perf_counter()
    while done < steps:
        for e in envs:
            e.recv()
            e.send(rng.integers(actions, size=n // groups))
            done += n // groups
    seconds = time.perf_counter() - start
    for e in envs:
        e.drain()
        e.envs.close()
    emit(piece="envs", env_id=env_id, num_envs=n, groups=groups, steps=done, sps=round(done / seconds))
    return round(done / seconds)


def preset_args(env_id, n, k):
    return dqn.check_args(dqn.Args(**{**dqn.ATARI_PRESET, "env_id": env_id, "num_envs": n, "updates_per_call": k}))


def filled_replay(args, fill, space):
    replay, _ = dqn.make_replay(args, space)
    frames, rng = replay.frames, np.random.default_rng(0)
    frames.written = min(fill + fill // 10, frames.capacity)
    chunk = 100_000
    for start in range(0, fill, chunk):
        m = min(chunk, fill - start)
        first = rng.integers(0, frames.written - 5, size=m)
        obs = first[:, None] + np.arange(4)
        rows = dict(obs=obs, action=rng.integers(6, size=m), reward=rng.standard_normal(m).astype(np.float32))
        rows.update(next_obs=obs + 1, discount=np.full(m, 0.99, np.float32))
        replay.add(rows)
    replay.flush()
    return replay


def chip(args, space, num_actions, calls):
    network = dqn.make_network(args, space, num_actions)
    learner_args = args
    optimizer = dqn.make_optimizer(learner_args, dqn.sgd_budget(learner_args))
    shardings = dqn.learner_shardings(learner_args)
    state = jax.device_put(
        dqn.init_train_state(network, optimizer, space.shape, jax.random.PRNGKey(0)), shardings.replicated
    )
    k, b = args.updates_per_call, args.batch_size
    rng = np.random.default_rng(0)
    batch = dict(
        obs=rng.integers(0, 255, (k, b, 4, 84, 84), dtype=np.uint8),
        action=rng.integers(num_actions, size=(k, b)),
        reward=rng.standard_normal((k, b)).astype(np.float32),
        next_obs=rng.integers(0, 255, (k, b, 4, 84, 84), dtype=np.uint8),
        discount=np.full((k, b), 0.99, np.float32),
        weights=np.ones((k, b), np.float32),
    )
    update = dqn.make_update(network.apply, optimizer, args, shardings)
    on_device = jax.device_put(batch, shardings.split)
    for _ in range(3):
        state, _, td = update(state, on_device)
    td.block_until_ready()
    start = time.perf_counter()
    for _ in range(calls):
        state, _, td = update(state, on_device)
    td.block_until_ready()
    seconds = time.perf_counter() - start
    emit(piece="chip", what="update on batches on the device", k=k, sgd_per_s=round(calls * k / seconds))

    # The frames on the device, only slots crossing: the gather inside the jitted call.
    capacity = args.buffer_size + args.buffer_size // 10
    store = jnp.zeros((capacity, 84 * 84 // 4), jnp.uint32)  # frames as rows of 4-byte words: TPU tiles pad less

    def unpack(words):
        return jax.lax.bitcast_convert_type(words, jnp.uint8).reshape(words.shape[:-1] + (84, 84))

    def gathered(state, frames, slots):
        full = dict(slots, obs=unpack(frames[slots["obs"]]), next_obs=unpack(frames[slots["next_obs"]]))
        return update(state, full)

    g = jax.jit(gathered, donate_argnums=0)
    push = jax.jit(lambda frames, at, new: frames.at[at].set(new), donate_argnums=0)
    slots = dict(batch, obs=rng.integers(0, capacity, (k, b, 4)).astype(np.int32))
    slots["next_obs"] = (slots["obs"] + 1) % capacity
    slots = jax.device_put(slots)
    emit(piece="chip", what="gather memory", stats=str(g.lower(state, store, slots).compile().memory_analysis()))
    for _ in range(3):
        state, _, td = g(state, store, slots)
    td.block_until_ready()
    start = time.perf_counter()
    for _ in range(calls):
        state, _, td = g(state, store, slots)
    td.block_until_ready()
    seconds = time.perf_counter() - start
    emit(piece="chip", what="update gathering from frames on the device", k=k, sgd_per_s=round(calls * k / seconds))

    # Slots crossing each call (a fresh host array each time), the gather inside.
    host = {key: np.asarray(v) for key, v in slots.items()}
    new = rng.integers(0, 2**32, (k * 4, 84 * 84 // 4), dtype=np.uint32)
    at = np.arange(k * 4, dtype=np.int32)
    store = push(store, at, new)
    start = time.perf_counter()
    for i in range(calls):
        store = push(store, (at + i * k * 4) % capacity, new)
        state, _, td = g(state, store, jax.device_put(host))
    td.block_until_ready()
    seconds = time.perf_counter() - start
    emit(
        piece="chip",
        what="... with the slots and 4K new frames put each call",
        k=k,
        sgd_per_s=round(calls * k / seconds),
    )

    # Policy round trips: alone and behind an update call.
    greedy = jax.jit(lambda params, obs: jnp.argmax(network.apply(params, obs), axis=-1))
    params = jax.tree_util.tree_map(jnp.copy, state.params)
    for n in (16, 32):
        obs = rng.integers(0, 255, (n, 4, 84, 84), dtype=np.uint8)
        np.asarray(greedy(params, obs))
        times = []
        for _ in range(200):
            t = time.perf_counter()
            np.asarray(greedy(params, obs))
            times.append(time.perf_counter() - t)
        behind = []
        for _ in range(50):
            state, _, td = g(state, store, slots)
            t = time.perf_counter()
            np.asarray(greedy(params, obs))
            behind.append(time.perf_counter() - t)
        td.block_until_ready()
        emit(
            piece="policy",
            n=n,
            alone_ms=round(1e3 * np.median(times), 3),
            behind_update_ms=round(1e3 * np.median(behind), 3),
        )


def learner(args, space, num_actions, fill, calls):
    replay = filled_replay(args, fill, space)
    network = dqn.make_network(args, space, num_actions)
    lrn = dqn.Learner(args, network, replay, space.shape)
    step = args.learning_starts + 10 * args.updates_per_call * args.train_frequency
    for _ in range(5):
        lrn.step(step)
    jax.block_until_ready(lrn.state)
    lrn.wait_seconds = lrn.learn_seconds = 0.0
    start = time.perf_counter()
    for _ in range(calls):
        lrn.step(step)
    jax.block_until_ready(lrn.state)
    seconds = time.perf_counter() - start
    emit(
        piece="learner",
        k=args.updates_per_call,
        fill=fill,
        sgd_per_s=round(calls * args.updates_per_call / seconds),
        wait_fraction=round(lrn.wait_seconds / seconds, 3),
    )
    lrn.close()


def agent(run_dir, flags):
    """The env limit at the agent's --env-id and --num-envs (its preset's, unless typed), then the agent."""
    args = dqn.parse_args(flags)
    limits = [env_limit(args.env_id, args.num_envs, 40_000, groups) for groups in (1, 2)]
    script = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "algos", "dqn_prioritized.py")
    start = time.time()
    done = subprocess.run([sys.executable, script, *flags, "--run-dir", run_dir])
    wall = time.time() - start
    from benchmark_summary import median, scalars

    sps = scalars(run_dir, "charts/SPS")
    last = max(step for step, _, _ in sps)
    rate = median(v for step, _, v in sps if step > last / 2)
    deficit = max(v for _, _, v in scalars(run_dir, "perf/sgd_deficit"))
    best = max(limits)
    emit(
        piece="agent",
        rc=done.returncode,
        flags=" ".join(flags),
        median_sps=round(rate),
        whole_process_sps=round(last / wall),
        wall_s=round(wall, 1),
        env_limit_sps=best,
        ratio=round(rate / best, 3),
        max_sgd_deficit=deficit,
        updates_per_call=args.updates_per_call,
    )


def main():
    if sys.argv[1:2] == ["agent"]:
        return agent(sys.argv[2], sys.argv[3:])
    p = argparse.ArgumentParser()
    p.add_argument("--env-id", default="ALE/Pong-v5")
    p.add_argument("--num-envs", type=int, default=32)
    p.add_argument("--fill", type=int, default=1_000_000)
    p.add_argument("--env-steps", type=int, default=40_000)
    p.add_argument("--calls", type=int, default=100)
    p.add_argument("--k", type=int, nargs="+", default=[32])
    p.add_argument("pieces", nargs="*", default=["envs", "chip", "learner"])
    a = p.parse_args()
    emit(device=str(jax.devices()[0]), cores=os.cpu_count())  # noqa
    probe = dqn.make_env(a.env_id, 1)
    space, num_actions = probe.single_observation_space, int(probe.single_action_space.n)
    probe.close()
    if "envs" in a.pieces:
        for n in sorted({16, a.num_envs, 64}):
            env_limit(a.env_id, n, a.env_steps, 1)
            env_limit(a.env_id, n, a.env_steps, 2)
    for k in a.k:
        args = preset_args(a.env_id, a.num_envs, k)
        if a.fill < args.buffer_size:
            args = dqn.dataclasses.replace(args, buffer_size=a.fill)
        if "chip" in a.pieces:
            chip(args, space, num_actions, a.calls)
        if "learner" in a.pieces:
            learner(args, space, num_actions, a.fill, a.calls)


if __name__ == "__main__":
    main()
