"""Pixel observations: FrameStore replay against an uncompressed reference, memory per
transition, life loss, the Atari preset, and the Nature-CNN path end to end on a real ALE game."""

import dataclasses
import json
import os
import subprocess
import sys
import types

import ale_py.vector_env
import gymnasium as gym
import numpy as np
import pytest
from helpers import ROOT, load_script

dqn = load_script("dqn_prioritized")


def short_ale_episodes(monkeypatch, frames):
    """make_env's own pipelines (ale_py's vector env, and gymnasium's for a filmed evaluation), with
    ALE's episode cap at `frames` instead of 108k (so that a short test sees truncations and short
    evaluations). Returns the keyword arguments each pipeline was built with."""
    made, make_vec, vector_env = [], gym.make_vec, ale_py.vector_env.AtariVectorEnv

    def capped(make):
        def make_capped(*args, **kwargs):
            assert kwargs.get("max_num_frames_per_episode") == 108_000, kwargs  # make_env's cap, replaced
            made.append(kwargs)
            return make(*args, **{**kwargs, "max_num_frames_per_episode": frames})

        return make_capped

    monkeypatch.setattr(gym, "make_vec", capped(make_vec))
    monkeypatch.setattr(ale_py.vector_env, "AtariVectorEnv", capped(vector_env))
    return made


def test_ale_vector_env_is_built_with_the_papers_settings(monkeypatch, tmp_path):
    """What a transition means: ALE v5's sticky actions (0.25), 4 frames a step max-pooled, up to 30
    no-ops, 84x84 grey stacks of 4, 108k frames, no reward clipping, no life loss ending an episode,
    no FIRE at reset, SAME_STEP autoreset, one thread per env up to the cores; a v4 id keeps its own
    sticky actions (none). The filmed path (gymnasium's) pads a first stack with zeros as ALE's does."""
    made = short_ale_episodes(monkeypatch, 108_000)
    for env_id, sticky in (("ALE/Pong-v5", 0.25), ("PongNoFrameskip-v4", 0.0)):
        envs = dqn.make_env(env_id, 3)
        envs.close()
        kwargs = made.pop()
        assert type(envs).__name__ == "AtariVectorEnv" and kwargs["repeat_action_probability"] == sticky
        want = dict(frameskip=4, maxpool=True, noop_max=30, stack_num=4, img_height=84, img_width=84)
        want.update(grayscale=True, reward_clipping=False, episodic_life=False, use_fire_reset=False)
        want.update(num_threads=min(3, os.cpu_count()), full_action_space=False)
        assert {k: kwargs[k] for k in want} == want
        assert kwargs["autoreset_mode"] == gym.vector.AutoresetMode.SAME_STEP
    for video in (None, (str(tmp_path), "x")):  # both paths: 3 zero frames, then the first
        envs = dqn.make_env("ALE/Breakout-v5", 2, video=video)
        obs, _ = envs.reset(seed=1)
        envs.close()
        assert (obs[:, :3] == 0).all() and (obs[:, 3] > 0).any(axis=(1, 2)).all()


def test_real_ale_transitions_read_back_exactly_across_episode_ends_and_lives(monkeypatch):
    """Three Breakout envs from make_env (ale_py's vector env, in different phases), random play,
    3-step returns, lives lost and episodes both terminated and truncated: every row of the
    compressed replay, decoded, equals the row that the same n-step assembler makes from the pixel
    stacks the envs returned. The frame store writes a zero frame and the first frame per episode
    start, so this also checks that the env's first stacks are 3 zero frames, then the first."""
    n, num_envs, gamma = 3, 3, 0.9
    short_ale_episodes(monkeypatch, 700)
    envs = dqn.make_env("ALE/Breakout-v5", num_envs)
    assert envs.single_observation_space.shape == (4, 84, 84)
    frames = dqn.FrameStore(50_000, num_envs, (84, 84))
    replay = dqn.PrioritizedReplay(5_000, (4, 84, 84), np.uint8, 0.6, 1e-6, frames)
    compressed = dqn.NStepAssembler(n, gamma, num_envs, (4,), np.int64, clip_reward=1.0)
    reference = dqn.NStepAssembler(n, gamma, num_envs, (4, 84, 84), np.uint8, clip_reward=1.0)
    expected = []
    envs.action_space.seed(3)
    obs, _ = envs.reset(seed=3)
    frames.start(obs, np.arange(num_envs))
    stored, lives = frames.stack.copy(), None
    seen = {"terminated": 0, "truncated": 0, "lost": 0}
    for _ in range(700):
        actions = envs.action_space.sample()
        next_obs, reward, terminated, truncated, info = envs.step(actions)
        done = terminated | truncated
        reached = dqn.real_next_obs(next_obs, done, info)
        stored_reached, stored_next = frames.advance(reached, next_obs, done)
        lost, lives = dqn.lost_life(info, lives, done)
        ends = terminated | lost
        replay.add(compressed.push(stored, actions, reward, stored_reached, ends, truncated))
        rows = reference.push(obs, actions, reward, reached, ends, truncated)
        if rows is not None:
            expected.append({k: np.array(v) for k, v in rows.items()})
        obs, stored = next_obs, stored_next
        seen["terminated"] += terminated.sum()
        seen["truncated"] += truncated.sum()
        seen["lost"] += lost.sum()
    envs.close()
    assert min(seen.values()) > 0, seen  # the run crossed every kind of boundary
    replay.flush()
    got = replay.buffer.get_all_transitions()
    want = {k: np.concatenate([e[k] for e in expected]) for k in expected[0]}
    assert len(got["action"]) == len(want["action"]) > 1000
    # Rows that start an episode name one zero frame 3 times: the case a start must get right.
    starts = (got["obs"][:, :3] == got["obs"][:, :1]).all(axis=1).sum()
    assert starts >= seen["terminated"] + seen["truncated"] > 0, starts  # every episode after a reset
    for key in ("obs", "next_obs"):
        pixels, intact = frames.read(got[key])
        assert intact.all()
        np.testing.assert_array_equal(pixels, want[key])
    np.testing.assert_array_equal(got["action"].ravel(), want["action"])
    np.testing.assert_allclose(got["reward"].ravel(), want["reward"], rtol=1e-6)
    np.testing.assert_allclose(got["discount"].ravel(), want["discount"], rtol=1e-6)
    assert (want["discount"] == 0).sum() >= seen["terminated"] + seen["lost"]  # no bootstrap there


class StackedStreams:
    """Synthetic env streams shaped like ALE's vector env's: each new frame is unique (a counter
    written into its pixels), a new episode's stack is 3 zero frames, then its first."""

    def __init__(self, num_envs, rng):
        self.rng, self.count = rng, 0
        self.obs = np.stack([self._first() for _ in range(num_envs)])

    def _frame(self):
        self.count += 1
        return np.full((6, 6), self.count % 251, np.uint8) + np.eye(6, dtype=np.uint8) * (self.count // 251 % 256)

    def _first(self):
        return np.concatenate([np.zeros((3, 6, 6), np.uint8), self._frame()[None]])

    def step(self, p_done):
        reached = np.stack([np.concatenate([o[1:], self._frame()[None]]) for o in self.obs])
        done = self.rng.random(len(self.obs)) < p_done
        self.obs = np.stack([self._first() if d else r for d, r in zip(done, reached)])
        return reached, self.obs.copy(), done


def test_sample_decodes_intact_rows_and_gives_stale_rows_weight_zero_and_no_write_back():
    """Episodes of ~1 step (an extra frame each) overwrite frames of rows still in the replay (the
    ring's 10% margin and constant are outrun): a sampled row whose frames were overwritten must
    get IS weight 0 and stamp -1 (so its priority is never written back) and be counted in
    replay.stale_rows, and every other row must equal the same slot of an uncompressed replay fed the
    same stream. Each frame's pixels are unique but the zero frames of a first stack, so a row is stale
    exactly when its decoded pixels differ from the uncompressed row (a row whose only overwritten frame
    is a zero frame would need the last frame written to be a zero frame, and a reset writes its first
    frame after its zero frame): the test does not need the store's own rule."""
    rng = np.random.default_rng(0)
    capacity, num_envs = 8_000, 2
    frames = dqn.FrameStore(capacity, num_envs, (6, 6))
    assert frames.capacity < 1.9 * capacity  # ~2.8 frames per row below: the ring is outrun
    compressed = dqn.PrioritizedReplay(capacity, (4, 6, 6), np.uint8, 0.6, 1e-6, frames)
    naive = dqn.PrioritizedReplay(capacity, (4, 6, 6), np.uint8, 0.6, 1e-6)
    streams = StackedStreams(num_envs, rng)
    frames.start(streams.obs, np.arange(num_envs))
    common = {
        "action": np.zeros(num_envs, np.int64),
        "reward": np.zeros(num_envs, np.float32),
        "discount": np.ones(num_envs, np.float32),
    }
    for _ in range(6_000):  # wraps the replay
        obs, ids = streams.obs.copy(), frames.stack.copy()
        reached, next_obs, done = streams.step(p_done=0.9)
        reached_ids, _ = frames.advance(reached, next_obs, done)
        compressed.add({"obs": ids, "next_obs": reached_ids, **common})
        naive.add({"obs": obs, "next_obs": reached, **common})
    assert streams.count < 251 * 256  # every frame written has pixels of its own
    compressed.flush()
    naive.flush()
    truth = naive.buffer.get_all_transitions()

    def check(batch, indexes, write_counts):
        """The stale rows of one sample, after checking every row against the truth."""
        batch = {k: v.reshape((len(indexes),) + v.shape[2:]) for k, v in batch.items()}  # [K, B, ...] -> [K * B, ...]
        same = (batch["obs"] == truth["obs"][indexes]).all(axis=(1, 2, 3))
        same &= (batch["next_obs"] == truth["next_obs"][indexes]).all(axis=(1, 2, 3))
        stale = write_counts == -1
        np.testing.assert_array_equal(stale, ~same)  # stamp -1 exactly where the frames are gone
        assert np.all(batch["weights"][stale] == 0) and np.all(batch["weights"][~stale] > 0)
        np.testing.assert_array_equal(write_counts[~stale], compressed.write_count[indexes[~stale]])
        return stale

    stale_seen = 0
    for _ in range(20):
        batch, indexes, write_counts = compressed.sample(256)
        stale = check(batch, indexes, write_counts)
        stale_seen += stale.sum()
        assert stale.any() and not stale.all()  # both kinds in each sample
    assert compressed.stale_rows == stale_seen  # every stale row counted, nothing else

    # K minibatches per call, as the learner gets them, with varied priorities: intact rows still
    # match their slots and have weight (p + eps)^(-alpha beta) divided by their minibatch's largest
    # (stale rows count in that largest: they are zeroed after normalising); stale rows keep
    # their priority when the learner writes |TD| back.
    prio = rng.uniform(0.1, 3.0, capacity)
    compressed.update_priorities(np.arange(capacity), compressed.write_count.copy(), prio)
    before = compressed.stale_rows
    for _ in range(20):
        batch, indexes, write_counts = compressed.sample(32, 8, beta=0.5)
        stale = check(batch, indexes, write_counts)
        raw = ((prio[indexes] + 1e-6) ** (-0.6 * 0.5)).reshape(8, 32)
        expected = (raw / raw.max(axis=1, keepdims=True)).reshape(-1)
        np.testing.assert_allclose(batch["weights"].reshape(-1)[~stale], expected[~stale], rtol=1e-4)
        kept = compressed.update_priorities(indexes, write_counts, np.full(len(indexes), 77.0))
        assert kept == (~stale).sum()
        np.testing.assert_array_equal(compressed.priority[indexes[stale]], prio[indexes[stale]])
        assert np.all(compressed.priority[indexes[~stale]] == 77.0)
        prio[indexes[~stale]] = 77.0
    assert compressed.stale_rows > before


def test_replay_memory_per_transition_is_about_one_frame():
    """Bound, for 84x84 frames (7,056 B): one frame per transition plus the ring's 10% margin
    (< 7,800 B), the row (two stacks of 4 int64 frame numbers, action, reward, discount: 80 B),
    cpprb's sum and min trees and our write counter and priority mirror (< 64 B): under 8,000 B.
    The ring's constant 4,096 frames more (FrameStore.capacity) are allocated but untouched until
    written: they count in the arrays' bytes, not in the RSS, and are taken out of the arrays'
    per-transition figure. The naive layout keeps 2 x 4 frames: 56,448 B, which the same
    measurement must see (so the measurement itself can fail)."""

    def measure(layout, capacity):
        out = subprocess.run(
            [
                sys.executable,
                os.path.join(ROOT, "tests", "replay_memory.py"),
                "--layout",
                layout,
                "--capacity",
                str(capacity),
            ],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout.strip().splitlines()[-1])

    compressed = measure("compressed", 20_000)
    naive = measure("naive", 3_000)
    assert compressed["rss_bytes_per_transition"] < 8_000, compressed
    constant = 4_096 * 84 * 84 / compressed["capacity"]  # the ring's fixed frames, over the transitions
    assert compressed["array_bytes_per_transition"] - constant < 8_000, compressed
    assert naive["rss_bytes_per_transition"] > 50_000, naive


def test_lost_life_ends_the_return_only_between_lives_of_one_game():
    done = np.array([False, False, True])
    lost, lives = dqn.lost_life({}, None, done)
    assert not lost.any() and lives is None  # envs without lives
    lost, lives = dqn.lost_life({"lives": np.array([3, 3, 3])}, None, done)
    assert not lost.any()  # first step: nothing to compare with
    lost, lives = dqn.lost_life({"lives": np.array([2, 3, 5])}, lives, done)
    np.testing.assert_array_equal(lost, [True, False, False])  # env 2 started a new game
    np.testing.assert_array_equal(lives, [2, 3, 5])


class ToyImageEnv(gym.Env):
    action_space = gym.spaces.Discrete(2)

    def __init__(self, shape=(40, 30, 3)):
        self.observation_space = gym.spaces.Box(0, 255, shape, np.uint8)

    def reset(self, seed=None, options=None):
        return self.observation_space.sample(), {}

    def step(self, action):
        return self.observation_space.sample(), 0.0, False, False, {}


gym.register("TestToyImage-v0", entry_point=ToyImageEnv)


gym.register("TestToyGrey-v0", entry_point=ToyImageEnv, kwargs={"shape": (50, 20)})


@pytest.mark.parametrize("env_id", ["TestToyImage-v0", "TestToyGrey-v0"])
def test_images_are_recognised_by_their_space_not_their_name(env_id):
    envs = dqn.make_env(env_id, 2)
    try:
        assert envs.single_observation_space.shape == (4, 84, 84)
        assert envs.single_observation_space.dtype == np.uint8
        obs, _ = envs.reset(seed=0)
        assert obs.shape == (2, 4, 84, 84)
    finally:
        envs.close()


def test_preset_fills_defaults_and_given_flags_still_win():
    args = dqn.parse_args(["--preset", "atari", "--learning-starts", "1000", "--env-id", "ALE/Pong-v5"])
    assert args.learning_starts == 1000  # equal to Args' default, still the user's choice
    assert args.learning_rate == dqn.ATARI_PRESET["learning_rate"] == 6.25e-5
    assert args.buffer_size == 1_000_000 and args.batch_size == 32 and args.train_frequency == 4
    assert dqn.parse_args([]).learning_rate == dqn.Args().learning_rate


def test_the_atari_presets_beta_rises_over_the_papers_run_whatever_the_budget():
    """PER anneals beta from 0.4 to 1 over its whole 50M-step run: a 2.5M-step run of the preset is the first
    2.5M steps of that schedule (beta 0.43 at its end), not a schedule squeezed into 2.5M. Without the
    preset, and in a run folder written before --per-beta-steps, beta reaches 1 at the budget's end; a typed
    --per-beta-steps wins over both."""
    learner = types.SimpleNamespace()
    for budget in ("2500000", "100000000"):
        learner.args = dqn.parse_args(["--preset", "atari", "--total-timesteps", budget])
        betas = [dqn.Learner.beta(learner, t) for t in (0, 2_500_000, 25_000_000, 50_000_000)]
        assert betas == pytest.approx([0.4, 0.43, 0.7, 1.0])
    learner.args = dqn.parse_args(["--total-timesteps", "1000"])
    assert [dqn.Learner.beta(learner, t) for t in (500, 1000)] == pytest.approx([0.7, 1.0])
    saved = {k: v for k, v in dataclasses.asdict(dqn.Args(**dqn.ATARI_PRESET)).items() if k != "per_beta_steps"}
    learner.args = dqn.args_from_json({**saved, "total_timesteps": 1000}, "args.json")
    assert [dqn.Learner.beta(learner, t) for t in (500, 1000)] == pytest.approx([0.7, 1.0])
    learner.args = dqn.parse_args(["--preset", "atari", "--per-beta-steps", "1000"])
    assert dqn.Learner.beta(learner, 500) == pytest.approx(0.7)


def test_cnn_end_to_end_on_a_real_ale_game_with_resume(tmp_path, monkeypatch):
    short_ale_episodes(monkeypatch, 1_000)  # a 1-episode evaluation in seconds
    run_dir = str(tmp_path / "pong")
    small = dict(
        env_id="ALE/Pong-v5",
        buffer_size=2_000,
        learning_starts=200,
        batch_size=16,
        updates_per_call=4,
        num_envs=16,  # two halves of 8 (the preset's 64: slower on 2 cores)
        eval_episodes=1,
        eval_every=10_000,
        log_every=100,
        checkpoint_every=0,
        run_dir=run_dir,
    )
    args = dqn.Args(**{**dqn.ATARI_PRESET, "preset": "atari", "total_timesteps": 400, **small})
    result = dqn.train(args)
    assert result["sgd_steps"] == (400 - 200) // 4 // 4 * 4
    assert np.isfinite(result["eval_mean"]) and -21 <= result["eval_mean"] <= 21
    arrays = dqn.load_npz(run_dir, "checkpoint")[1]
    assert int(arrays["replay/frames_written"]) >= 400
    assert len(arrays["replay/priority"]) == 400  # 1-step rows: one per env step
    assert dqn.cli(["--resume", run_dir, "--total-timesteps", "480"]) == 0
    assert dqn.load_npz(run_dir, "checkpoint")[0]["global_step"] == 480
    # A checkpoint whose rows name frames the store never wrote is refused (a hostile file
    # would otherwise index outside the frame ring when sampled).
    path = os.path.join(run_dir, "checkpoint.npz")
    with np.load(path, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    arrays["replay/obs"][0, 0] = 10**9
    with open(path, "wb") as f:
        np.savez(f, **arrays)
    assert dqn.cli(["--resume", run_dir, "--total-timesteps", "500"]) == 2


def test_a_first_stack_padded_with_copies_is_refused():
    """A custom image env whose first stack repeats its first frame (FrameStackObservation's default)
    would disagree with what the frame store keeps: refused in one line at the first reset."""
    frames = dqn.FrameStore(100, 2, (6, 6))
    with pytest.raises(dqn.ConfigError, match="zero frames, then the first"):
        frames.start(np.ones((2, 4, 6, 6), np.uint8), np.arange(2))
    frames.start(np.concatenate([np.zeros((2, 3, 6, 6), np.uint8), np.ones((2, 1, 6, 6), np.uint8)], 1), np.arange(2))
    assert frames.written == 4
