"""DQN's overlap of acting, storing and learning (dad4432, 58a92fb): frames mirrored on the learner's device,
the envs in two halves stepped in turn where they step in the background (send/recv) and their number is
even, and the replay ratio kept by learning after each half's store.

- DeviceFrames: a FrameStore's frames (odd sizes and 84x84) pushed to a device and gathered there as frame
  stacks equal the pixels the envs showed and FrameStore.read's, before and after the ring wraps (also by
  more than its capacity between pushes); push() returns written - capacity.
- The learner's draw (Learner.sample: frame slots, each row's oldest frame) and update gathered from its
  device store equal make_update without frames fed the host-decoded pixels of the same replay rows (TD
  errors, loss, params), batches["fresh"] zeroing the weights of the rows it marks; rows drawn before
  their frames were overwritten get weight 0 (loss 0), count as stale and have no priority written back.
- Two halves of 2 envs each (a fake vector env with send/recv whose env i's stream depends only on its
  seed and its own step count), and one group of 4 (no send/recv), put into the replay exactly the n-step
  rows a brute-force reference builds from each env's own record, in the order they complete: vectors
  with terminations, truncations and final observations; uint8 frame stacks through the FrameStore with
  lives, a lost life ending the return (discount 0) without ending the episode.
- The replay ratio on CartPole (given send/recv, so that an even number splits) for (num_envs, K) in
  (1, 1), (3, 4), (4, 8), (6, 2): SGD steps are K * floor(due / K), every store starts with fewer than
  K SGD steps due and not done, and perf/sgd_deficit at each log tick is due % K (so in [0, K));
  --updates-per-call 129 is refused.
- With two halves of one env each, every policy call acts with the params the newest update call
  dispatched before it started from (at most one call behind; tests/test_actor.py's check), and each
  half's next policy call comes before its step is stored.
"""

import glob
import os

import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import load_script
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from test_actor import check_schedule, record_acting

dqn = load_script("dqn_prioritized")


def small_args(tmp_path, **flags):
    """A tiny run into tmp_path/run: no checkpoints, one evaluation episode after the loop."""
    quiet = dict(buffer_size=1000, eval_every=10**6, eval_episodes=1, checkpoint_every=0, log_every=50)
    return dqn.Args(**quiet, run_dir=str(tmp_path / "run"), **flags)


# ------------------------------------------------------------------------------ DEVICE FRAMES


class RandomStacks:
    """Stacks of 4 random frames per env, consistent as a frame stack (a step shifts in one new frame;
    a reset shows 3 zero frames, then the first)."""

    def __init__(self, num_envs, shape, rng):
        self.rng, self.shape = rng, tuple(shape)
        self.obs = np.stack([self.first() for _ in range(num_envs)])

    def frames(self, n):
        return self.rng.integers(0, 256, (n,) + self.shape, dtype=np.uint8)

    def first(self):
        return np.concatenate([np.zeros((3,) + self.shape, np.uint8), self.frames(1)])

    def step(self, p_done):
        reached = np.concatenate([self.obs[:, 1:], self.frames(len(self.obs))[:, None]], axis=1)
        done = self.rng.random(len(self.obs)) < p_done
        self.obs = reached.copy()
        for i in np.flatnonzero(done):
            self.obs[i] = self.first()
        return reached, self.obs.copy(), done


@pytest.mark.parametrize("shape", [(6, 7), (84, 84)])
def test_device_frames_round_trip(shape):
    rng = np.random.default_rng(0)
    frames = dqn.FrameStore(200, 2, shape)
    capacity = frames.capacity
    device = dqn.DeviceFrames(frames, jax.sharding.SingleDeviceSharding(jax.devices("cpu")[0]))
    words = dqn.frame_words(shape)
    assert words % 128 == 0 and np.prod(shape) <= 4 * words < np.prod(shape) + 512
    assert device.store.shape == (capacity, words) and device.store.dtype == jnp.uint32
    gather = jax.jit(lambda store, slots: dqn.unpack_frames(store[slots], shape))
    streams = RandomStacks(2, shape, rng)
    frames.start(streams.obs, np.arange(2))
    seen_numbers, seen_pixels = [], []  # every stack the envs reached: its frame numbers and its pixels

    def run(steps):
        for _ in range(steps):
            reached, next_obs, done = streams.step(p_done=0.05)
            numbers, _ = frames.advance(reached, next_obs, done)
            seen_numbers.append(numbers)
            seen_pixels.append(reached)

    def push_and_check():
        oldest = device.push()
        assert oldest == frames.written - capacity
        numbers, pixels = np.concatenate(seen_numbers), np.concatenate(seen_pixels)
        intact = np.flatnonzero(numbers.min(axis=1) >= oldest)
        pick = rng.choice(intact, min(400, len(intact)), replace=False)
        got = np.asarray(gather(device.store, (numbers[pick] % capacity).astype(np.int32)))
        np.testing.assert_array_equal(got, pixels[pick])  # the pixels the envs showed
        host, ok = frames.read(numbers[pick])
        assert ok.all()
        np.testing.assert_array_equal(got, host)
        # every frame the device holds, one by one: the host ring's
        held = np.arange(max(0, oldest), frames.written) % capacity
        every = np.asarray(gather(device.store, held.astype(np.int32)))
        np.testing.assert_array_equal(every, frames.ring[held])

    run(50)
    push_and_check()
    run(1500)  # not wrapped yet
    assert frames.written < capacity
    push_and_check()
    run(1000)  # wraps: one push crosses the ring's end
    assert frames.written > capacity and frames.written - device.pushed < capacity
    push_and_check()
    before = frames.written
    run(2500)  # more than the ring since the last push: only the newest capacity frames
    assert frames.written - before > capacity
    push_and_check()
    run(3)  # a push of a few frames (padded with repeats)
    push_and_check()


# ----------------------------------------------------------------------------------- FAKE ENVS

START = 1  # the envs' Discrete(3, start=1): they get index + 1
ID, COUNT, EPISODE, T = 0, 1, 2, 3  # vector observation fields; image frames keep them in row 0


class Stream:
    """One env: everything depends on its seed and its own step count. Episode e lasts 1 + (7 seed + 5 e) % 8
    steps and is truncated if (seed + e) % 3 == 0, else terminated; with lives, a life is lost at the
    episode's steps 2, 5, 8, ... (not at its first step). It records each step it takes."""

    def __init__(self, seed, image_shape=None):
        self.seed, self.shape, self.count, self.episode, self.t = seed, image_shape, 0, 0, 0
        self.log = []
        self.stack = None
        self.obs = self.first_obs()

    def frame(self):
        h, w = self.shape
        f = ((np.arange(h * w) * (self.count % 7 + 1) + self.seed + 3 * self.t) % 256).astype(np.uint8)
        f = f.reshape(h, w)
        f[0, :5] = self.seed % 256, self.count % 256, self.count // 256, self.episode % 256, self.t
        return f

    def first_obs(self):
        if self.shape is None:
            return self.vector()
        self.stack = np.concatenate([np.zeros((3,) + self.shape, np.uint8), self.frame()[None]])
        return self.stack.copy()

    def vector(self):
        return np.array([self.seed % 1000, self.count, self.episode, self.t, self.seed * self.count % 17], np.float32)

    def lives(self):
        return 9 - (self.t + 1) // 3

    def step(self, received):
        length = 1 + (7 * self.seed + 5 * self.episode) % 8
        reward = float((13 * self.seed + 7 * self.count) % 11 - 5)
        self.count, self.t = self.count + 1, self.t + 1
        if self.shape is None:
            reached = self.vector()
        else:
            self.stack = np.concatenate([self.stack[1:], self.frame()[None]])
            reached = self.stack.copy()
        done = self.t == length
        truncated = done and (self.seed + self.episode) % 3 == 0
        terminated = done and not truncated
        before, self.obs = self.obs, reached
        if done:
            self.episode, self.t = self.episode + 1, 0
            self.obs = self.first_obs()
        lives = self.lives()  # at an end: the new game's (SAME_STEP: the reset's info)
        self.log.append(
            dict(obs=before, action=int(received) - START, reward=reward, reached=reached, terminated=terminated)
        )
        self.log[-1].update(truncated=truncated, lives=lives)
        return self.obs.copy(), reward, terminated, truncated, lives


class StreamEnvs:
    """A gymnasium-like vector env in SAME_STEP mode: env j of reset(seed=s) is Stream(s + j). With
    background=True it steps at send() and recv() returns the step (ale_py's interface)."""

    metadata = {"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP}

    def __init__(self, num_envs, image_shape=None, lives=False, background=False):
        self.num_envs, self.image_shape, self.with_lives = num_envs, image_shape, lives
        if image_shape is None:
            self.single_observation_space = gym.spaces.Box(-np.inf, np.inf, (5,), np.float32)
        else:
            self.single_observation_space = gym.spaces.Box(0, 255, (4,) + tuple(image_shape), np.uint8)
        self.single_action_space = gym.spaces.Discrete(3, start=START)
        self.observation_space = gym.vector.utils.batch_space(self.single_observation_space, num_envs)
        self.action_space = gym.vector.utils.batch_space(self.single_action_space, num_envs)
        self.streams, self.pending = [], None
        if background:
            self.send, self.recv = self._send, self._recv

    def reset(self, seed=None, options=None):
        self.streams = [Stream(seed + j, self.image_shape) for j in range(self.num_envs)]
        info = {"lives": np.array([s.lives() for s in self.streams])} if self.with_lives else {}
        return np.stack([s.obs for s in self.streams]), info

    def step(self, actions):
        out = [s.step(a) for s, a in zip(self.streams, actions, strict=True)]
        obs, reward, terminated, truncated, lives = (np.array(x) for x in zip(*out))
        final = np.array([None] * self.num_envs, dtype=object)
        for j in np.flatnonzero(terminated | truncated):
            final[j] = self.streams[j].log[-1]["reached"]
        info = {"final_obs": final, "_final_obs": terminated | truncated}
        if self.with_lives:
            info["lives"] = lives
        return obs, reward.astype(np.float32), terminated, truncated, info

    def _send(self, actions):
        self.pending = self.step(actions)

    def _recv(self):
        out, self.pending = self.pending, None
        return out

    def close(self):
        pass


def reference_rows(log, n, gamma, life_loss):
    """The n-step rows of one env's recorded steps, brute force: (first step t, last step u, row). A row
    ends at n steps or at an end (termination, truncation, with life_loss a lost life); rows still short of
    n steps when the record stops are not emitted."""
    ended, lost = [], []
    for u, step in enumerate(log):
        done = step["terminated"] or step["truncated"]
        lost.append(life_loss and u > 0 and not done and step["lives"] < log[u - 1]["lives"])
        ended.append(done or lost[-1])
    rows = []
    for t in range(len(log)):
        u = next((v for v in range(t, min(t + n, len(log))) if ended[v] or v == t + n - 1), None)
        if u is None:
            continue
        k = u - t + 1
        ret = sum(gamma**j * log[t + j]["reward"] for j in range(k))
        discount = 0.0 if log[u]["terminated"] or lost[u] else gamma**k
        row = dict(obs=log[t]["obs"], action=log[t]["action"], reward=ret, next_obs=log[u]["reached"])
        rows.append((t, u, {**row, "discount": discount}))
    return rows


def check_rows_per_env(replay, streams, n, gamma, life_loss, steps_per_env):
    """The replay's rows, env by env, against reference_rows of each env's record (cut to the steps stored)."""
    state = replay.state_dict()
    obs, next_obs = state["replay/obs"], state["replay/next_obs"]
    if replay.frames is not None:
        obs, intact = replay.frames.read(obs)
        next_obs, next_intact = replay.frames.read(next_obs)
        assert intact.all() and next_intact.all()
        newest = obs[:, -1, 0].astype(np.int64)  # the newest frame's row 0: the env's seed % 256 and its step count
        ids, counts = newest[:, 0], newest[:, 1] + 256 * newest[:, 2]
        key = {s.seed % 256: s for s in streams}
    else:
        ids, counts = obs[:, ID].astype(np.int64), obs[:, COUNT].astype(np.int64)
        key = {s.seed % 1000: s for s in streams}
    assert len(key) == len(streams) and set(ids) <= set(key)
    total = 0
    for env_id, stream in key.items():
        assert len(stream.log) >= steps_per_env
        expected = reference_rows(stream.log[:steps_per_env], n, gamma, life_loss)
        mine = np.flatnonzero(ids == env_id)  # in the replay's order (slots, as inserted)
        assert len(mine) == len(expected), f"env seed {stream.seed}: {len(mine)} rows, expected {len(expected)}"
        by_start = {t: (u, row) for t, u, row in expected}
        completed = []
        for i in mine:
            u, row = by_start.pop(int(counts[i]))  # a row starting at step t shows the env's count t
            completed.append(u)
            np.testing.assert_array_equal(obs[i], row["obs"])
            np.testing.assert_array_equal(next_obs[i], row["next_obs"])
            assert int(state["replay/action"][i, 0]) == row["action"]
            np.testing.assert_allclose(state["replay/reward"][i, 0], row["reward"], rtol=1e-6, atol=1e-5)
            np.testing.assert_allclose(state["replay/discount"][i, 0], row["discount"], rtol=1e-6, atol=1e-7)
        assert not by_start
        assert completed == sorted(completed), "an env's rows entered the replay out of the order they completed"
        total += len(mine)
    assert total == len(obs)
    return state


def run_streams(monkeypatch, tmp_path, image_shape, lives, background, **flags):
    made, replays = [], []
    real_make_replay = dqn.make_replay

    def make_replay(*a, **k):
        replay, nstep = real_make_replay(*a, **k)
        replays.append(replay)
        return replay, nstep

    def env_fn(num_envs, video=None):
        made.append(StreamEnvs(num_envs, image_shape, lives, background))
        return made[-1]

    monkeypatch.setattr(dqn, "make_replay", make_replay)
    seed = 3
    shape = dict(env_id="Streams", seed=seed, num_envs=4, n_step=3, gamma=0.9, hidden_sizes=(8,), batch_size=16)
    args = small_args(tmp_path, total_timesteps=200, **shape, **flags)
    summary = dqn.train(args, env_fn)
    base = dqn.env_seed(seed, 0, 1)  # env i: seed base + i, whichever half holds it
    training = [envs for envs in made if any(base <= s.seed < base + 4 for s in envs.streams)]
    streams = {s.seed: s for envs in training for s in envs.streams}
    assert sorted(streams) == list(range(base, base + 4))
    assert [envs.num_envs for envs in training] == ([2, 2] if background else [4])  # two halves only with send/recv
    assert summary["global_step"] % 4 == 0
    steps_per_env = summary["global_step"] // 4
    return replays[0], list(streams.values()), args, steps_per_env, summary


@pytest.mark.parametrize("background", [True, False])
def test_two_halves_store_the_rows_of_each_env_as_one_group_would(background, monkeypatch, tmp_path):
    """Vectors, learning from step 64 on (K=4) between the stores: envs stepping at send() (two halves), and
    envs without send/recv (one group, the reference's own case)."""
    replay, streams, args, steps, summary = run_streams(
        monkeypatch, tmp_path, None, False, background, learning_starts=64, updates_per_call=4
    )
    assert summary["sgd_steps"] > 0
    state = check_rows_per_env(replay, streams, args.n_step, args.gamma, False, steps)
    discounts = state["replay/discount"][:, 0]
    assert (discounts == 0).any() and np.isclose(discounts, 0.9**3).any() and (discounts > 0.9**3 + 1e-6).any()


@pytest.mark.parametrize("background", [True, False])
def test_two_halves_of_image_envs_store_frames_and_lost_lives(background, monkeypatch, tmp_path):
    """uint8 stacks [4, 36, 36] through the FrameStore (each half its slice of the env stacks), info["lives"]
    falling within an episode: a lost life ends the return (discount 0), the obs goes on. No learning (the
    CNN is slow on a CPU)."""
    flags = dict(learning_starts=10**6, start_e=1.0, end_e=1.0, eval_epsilon=1.0)
    replay, streams, args, steps, _ = run_streams(monkeypatch, tmp_path, (36, 36), True, background, **flags)
    assert replay.frames is not None
    check_rows_per_env(replay, streams, args.n_step, args.gamma, True, steps)
    lost = sum(r["discount"] == 0 for s in streams for _, _, r in reference_rows(s.log[:steps], 3, 0.9, True))
    terminated = sum(r["discount"] == 0 for s in streams for _, _, r in reference_rows(s.log[:steps], 3, 0.9, False))
    assert lost > terminated > 0  # lives did cut returns


# ------------------------------------------------------------------------------ LEARNER GATHER


def test_learner_update_on_device_frames_equals_the_host_decoded_update():
    shape = (37, 41)  # 1,517 bytes a frame: not a whole number of words
    space = gym.spaces.Box(0, 255, (4,) + shape, np.uint8)
    k, b = 2, 8
    small = dict(buffer_size=400, batch_size=b, learning_starts=b, updates_per_call=k, target_network_frequency=1)
    args = dqn.Args(**small, num_envs=4, n_step=2, hidden_sizes=(8,))
    replay, nstep = dqn.make_replay(args, space)
    network = dqn.make_network(args, space, 3)
    learner = dqn.Learner(args, network, replay, space.shape)
    try:
        envs = StreamEnvs(4, shape, lives=True)
        obs, _ = envs.reset(seed=5)
        adder, rng = dqn.Adder(replay, nstep, True), np.random.default_rng(0)
        adder.start(obs)
        for _ in range(60):
            actions = rng.integers(3, size=4)
            obs, reward, terminated, truncated, info = envs.step(actions + START)
            adder.add(actions, reward, obs, terminated, truncated, info)
        replay.flush()
        capacity = replay.frames.capacity

        # The same rows: the learner's draw (frame slots, for its device) and the replay's rows there, decoded here.
        split = learner.shardings.split
        slots, indexes, _, oldest = learner.sample(0.5)
        fresh = np.ones((k, b), np.float32)
        fresh[0, :3] = fresh[1, 5:] = 0.0  # rows the learner found overwritten: weight 0
        pixels = {key: np.asarray(value) for key, value in slots.items()}
        pixels["weights"] = pixels["weights"] * fresh
        slots = dict(slots, fresh=jax.device_put(fresh, split))
        stored, numbers = replay.buffer.get_all_transitions(), {}
        for key in ("obs", "next_obs"):
            numbers[key] = stored[key][indexes].reshape(k, b, 4)
            pixels[key], intact = replay.frames.read(numbers[key])
            assert intact.all()
        for key in ("action", "reward", "discount"):
            np.testing.assert_array_equal(pixels[key], stored[key][indexes, 0].reshape(k, b))
        np.testing.assert_array_equal(oldest, np.minimum(numbers["obs"].min(-1), numbers["next_obs"].min(-1)))
        assert learner.frames.push() == replay.frames.written - capacity
        gather = jax.jit(lambda store, i: dqn.unpack_frames(store[i], shape))
        for key in ("obs", "next_obs"):
            np.testing.assert_array_equal(np.asarray(gather(learner.frames.store, slots[key])), pixels[key])

        unroll = 32 if jax.default_backend() == "cpu" else 1  # the learner's for images
        optimizer = dqn.make_optimizer(args, dqn.sgd_budget(args))
        plain = dqn.make_update(network.apply, optimizer, args, learner.shardings, unroll, None)

        def state():
            return jax.tree_util.tree_map(jnp.copy, learner.state)

        on_device = learner.update(state(), slots, learner.frames.store)
        on_host = plain(state(), jax.device_put(pixels, split))
        np.testing.assert_allclose(np.asarray(on_device[2]), np.asarray(on_host[2]), rtol=1e-5, atol=1e-6)
        for name in ("losses/td_loss", "losses/q_values"):
            np.testing.assert_allclose(float(on_device[1][name]), float(on_host[1][name]), rtol=1e-5, atol=1e-7)
        for x, y in zip(jax.tree_util.tree_leaves(on_device[0]), jax.tree_util.tree_leaves(on_host[0]), strict=True):
            np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-5, atol=1e-6)

        # Learner.step: rows sampled before their frames were overwritten learn nothing, write nothing back.
        assert learner.step(100) and learner.stale_rows == 0
        for future in learner.batches:
            future.result()
        while learner.writes:
            learner.writes.popleft().result()
        _, indexes, write_counts, _ = learner.batches[0].result()  # the next call's rows, drawn already
        assert (write_counts == replay.write_count[indexes]).all()  # the replay still holds those rows
        priorities = replay.priority[indexes].copy()
        replay.frames._write(np.zeros((capacity,) + shape, np.uint8))  # the whole ring overwritten
        assert learner.step(100)
        while learner.writes:
            learner.writes.popleft().result()
        assert learner.stale_rows == k * b
        assert float(learner.metrics["losses/td_loss"]) == 0.0
        np.testing.assert_array_equal(replay.priority[indexes], priorities)
    finally:
        learner.close()


# -------------------------------------------------------------------------------- REPLAY RATIO


class InBackground:
    """A vector env given ale_py's send/recv (it steps at send), so that train() splits an even number of
    envs into two halves."""

    def __init__(self, envs):
        self.envs, self.pending = envs, None

    def __getattr__(self, name):
        return getattr(self.envs, name)

    def send(self, actions):
        self.pending = self.envs.step(actions)

    def recv(self):
        out, self.pending = self.pending, None
        return out


def cartpole_in_background(num_envs, video=None):
    return InBackground(dqn.make_env("CartPole-v1", num_envs, video))


def events(run_dir, tag):
    (path,) = glob.glob(os.path.join(run_dir, "events.out.tfevents.*"))
    acc = EventAccumulator(path, size_guidance={"scalars": 0})
    acc.Reload()
    return [(e.step, e.value) for e in acc.Scalars(tag)]


@pytest.mark.parametrize("num_envs, k", [(1, 1), (3, 4), (4, 8), (6, 2)])
def test_sgd_steps_keep_to_the_replay_ratio_after_each_halfs_store(num_envs, k, monkeypatch, tmp_path):
    learners, stores = [], []

    class Learner(dqn.Learner):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            learners.append(self)

    real_add = dqn.Adder.add

    def add(self, action, *rest):
        stores.append((len(action), learners[-1].sgd_steps))
        return real_add(self, action, *rest)

    monkeypatch.setattr(dqn, "Learner", Learner)
    monkeypatch.setattr(dqn.Adder, "add", add)
    ls, tf = 64, 2
    shape = dict(num_envs=num_envs, updates_per_call=k, hidden_sizes=(16,), batch_size=16)
    args = small_args(tmp_path, learning_starts=ls, train_frequency=tf, total_timesteps=600, **shape)
    summary = dqn.train(args, cartpole_in_background)
    final = summary["global_step"]
    assert summary["sgd_steps"] == k * ((max(0, final - ls) // tf) // k) > 0
    step = 0
    for count, sgd_steps in stores:  # each store: the SGD steps due by the steps before it were done
        deficit = max(0, step - ls) // tf - sgd_steps
        assert 0 <= deficit < k, f"{deficit} SGD steps due and not done at step {step} (K={k})"
        step += count
    assert step == final and {count for count, _ in stores} == {num_envs // 2 if num_envs % 2 == 0 else num_envs}
    logged = events(summary["run_dir"], "perf/sgd_deficit")
    assert len(logged) >= final // args.log_every - 1
    for at, value in logged:
        assert 0 <= value < k and value == (max(0, at - ls) // tf) % k, (at, value)


def test_more_than_128_updates_per_call_is_refused():
    assert dqn.check_args(dqn.parse_args(["--updates-per-call", "128"])).updates_per_call == 128
    with pytest.raises((SystemExit, dqn.ConfigError), match="updates-per-call"):
        dqn.check_args(dqn.parse_args(["--updates-per-call", "129"]))
    assert dqn.cli(["--updates-per-call", "129"]) == 2


# ---------------------------------------------------------------------------------- PARAMS LAG


def test_two_halves_act_with_the_params_of_the_update_in_flight(monkeypatch, tmp_path):
    """num_envs=2 stepping in the background: two halves of 1 env, so every training policy call has one
    observation (the evaluation's 2)."""
    log = record_acting(monkeypatch, dqn, lambda s: s.params)
    order, logged_act, real_add = [], dqn.make_act, dqn.Adder.add

    def make_act(*a, **k):
        act = logged_act(*a, **k)

        def ordered(params, obs, *rest, **kw):
            order.append("act" if len(obs) == 1 else "eval")
            return act(params, obs, *rest, **kw)

        return ordered

    def add(self, *a, **k):
        order.append("store")
        return real_add(self, *a, **k)

    monkeypatch.setattr(dqn, "make_act", make_act)
    monkeypatch.setattr(dqn.Adder, "add", add)
    small = dict(total_timesteps=400, learning_starts=64, batch_size=16, updates_per_call=32, buffer_size=1000)
    quiet = dict(eval_every=10**6, eval_episodes=2, checkpoint_every=0)
    summary = dqn.train(dqn.Args(**small, **quiet, num_envs=2, run_dir=str(tmp_path / "run")), cartpole_in_background)
    check_schedule(log)
    training = [e for e in order if e != "eval"]
    assert training[:2] == ["act", "act"]  # each half's first actions, from the reset
    assert training[2:] == ["act", "store"] * summary["global_step"]  # each half: its policy call, then its store
