"""Double DQN with prioritized experience replay and n-step returns, in one file.

Double DQN (van Hasselt, Guez & Silver 2016, arXiv:1509.06461) on DQN (Mnih et al. 2015, Nature 518),
proportional prioritized replay (Schaul, Quan, Antonoglou & Silver 2016, arXiv:1511.05952) on cpprb, and
n-step returns (Sutton 1988; with PER as in Rainbow, Hessel et al. 2018, arXiv:1710.02298), on Acme's
learner (Hoffman et al. 2020, arXiv:2006.00979): a thread puts sampled batches on the device, K SGD steps
run in one jitted call, another thread writes the priorities back. Vectors get an MLP, Atari frames the
Nature CNN (--preset atari: the PER paper's setup), MinAtar's planes its paper's network (Young & Tian
2019, arXiv:1903.03176; --preset minatar).

Update, on a minibatch of B transitions i, each spanning k_i <= n env steps:
  G_i     = sum_{j<k_i} gamma^j r_{t+j}            d_i = gamma^k_i (1 - terminated_i)  (truncation bootstraps)
  y_i     = G_i + d_i Q(s'_i, argmax_a Q(s'_i, a; theta); theta_target)             (double Q)
  delta_i = y_i - Q(s_i, a_i; theta)               L = (1/B) sum_i w_i huber(delta_i)
  P(i)    = p_i^alpha / sum_j p_j^alpha            p_i = |delta_i| + eps, new transitions: max_j p_j
  w_i     = (N P(i))^-beta / max_{j in minibatch} (N P(j))^-beta     beta: --per-beta0 -> 1 over --per-beta-steps
  Each minibatch: one row from each 1/B of the priority mass (B.2.1). theta_target <- theta every
  --target-network-frequency SGD steps (a Polyak average if --tau < 1). --no-prioritized is alpha = 0.
  Acting: epsilon-greedy on the host CPU (Acme's split) with a copy of theta taken as each update call is
  dispatched: one call, K <= 128 SGD steps, behind. Envs that step in the background (ale_py's) go in two
  halves, one stepping while the other's policy call and store run; an Atari replay's frames live on the device.
  Actions are indexes 0..n-1 in the network and the replay; an env with Discrete(n, start=s) gets s + index.

Run
  python algos/dqn_prioritized.py                                   # CartPole-v1, 100k steps
  python algos/dqn_prioritized.py --env-id MinAtar/Breakout-v1 --preset minatar
  python algos/dqn_prioritized.py --env-id ALE/Breakout-v5 --preset atari --num-devices -1
  python algos/dqn_prioritized.py --resume runs/<run>                # continue from its checkpoint
  python tools/dqn_evaluate.py runs/<run>        # tools/: evaluate a model, write a dataset, plot a run
From code, on an env of your own (a factory of vector envs in SAME_STEP autoreset mode; `video` films evaluations):
  import gymnasium as gym, dqn_prioritized as dqn
  def env_fn(num_envs, video=None):
      return gym.make_vec("Acrobot-v1", num_envs, vector_kwargs={"autoreset_mode": "SameStep"})
  dqn.train(dqn.Args(env_id="Acrobot-v1", total_timesteps=20_000, run_dir="runs/mine"), env_fn)
  dqn.train(dqn.parse_args(["--resume", "runs/mine", "--total-timesteps", "40000"]), env_fn)  # continues it
Ctrl-C in train() checkpoints, then raises KeyboardInterrupt. The tools take such an env as a gymnasium id
"module:Env" with its module on PYTHONPATH.
Outputs: runs/<env_id>__dqn_prioritized__<seed>__<time>/ holds args.json, eval.csv, tensorboard events
(CleanRL's tags), checkpoint.npz and model.npz (arrays and JSON, read without pickle), videos/. See docs/dqn.md.
"""

import os

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # read when jax starts: no 75% GPU grab

import collections
import concurrent.futures
import contextlib
import copy
import dataclasses
import functools
import json
import signal
import sys
import threading
import time
import warnings
from dataclasses import dataclass
from typing import Annotated, Literal, Optional, Tuple

import cpprb
import flax.linen as nn
import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pydantic
import tqdm
import tyro
from pydantic import Field

SCRIPT = "dqn_prioritized"
FORMAT = f"{SCRIPT}/2"  # of checkpoint.npz and model.npz
FRAME_STACK = 4
ROW = ("obs", "action", "reward", "next_obs", "discount")  # a replay row, as the n-step assembler emits it
FLATTEN = "wrap it in gymnasium.wrappers.FlattenObservation (vector envs: wrappers.vector's) or an ObservationWrapper"


# The ranges of the flags, held by pydantic to the command line and to a run folder's args.json alike.
Count = Annotated[int, Field(ge=1, lt=2**31)]
Envs = Annotated[int, Field(ge=1, le=1024)]
Positive = Annotated[float, Field(gt=0)]
Fraction = Annotated[float, Field(ge=0, le=1)]
Rate = Annotated[float, Field(gt=0, le=1)]
Widths = Annotated[Tuple[Annotated[int, Field(ge=1, le=65_536)], ...], Field(min_length=1, max_length=16)]


@dataclass
class Args:
    # Algorithm
    env_id: str = "CartPole-v1"
    """gymnasium id with Discrete actions: vectors get the MLP, images the Nature CNN, MinAtar its network"""
    preset: Optional[Literal["atari", "minatar"]] = None
    """start from the PER paper's Atari or the MinAtar paper's hyper-parameters; other flags still win"""
    seed: Annotated[int, Field(ge=0, lt=2**31)] = 1
    """seed of the envs, the network and the exploration"""
    total_timesteps: Count = 100_000
    """environment steps, summed over the envs"""
    num_envs: Envs = 1
    """parallel training environments"""
    hidden_sizes: Widths = (120, 84)
    """hidden layer widths (after the convolutions for images)"""
    optimizer: Literal["adam", "rmsprop"] = "adam"
    """Adam, or torch's centred RMSProp as the MinAtar paper used it (decay 0.95, eps 0.01)"""
    learning_rate: Positive = 5e-4
    """the optimiser's step size (1e-3 learns sooner, but more runs fall back by the end: docs/dqn.md)"""
    adam_eps: Positive = 1e-8
    """Adam's epsilon"""
    anneal_lr: bool = True
    """decay the learning rate linearly to 0 over training, which steadies the final policy"""
    max_grad_norm: Optional[Positive] = None
    """clip the global gradient norm to this (none by default, as CleanRL's DQN: docs/dqn.md)"""
    batch_size: Count = 128
    """transitions per SGD step"""
    gamma: Rate = 0.99
    """discount factor"""
    n_step: Annotated[int, Field(ge=1, le=1000)] = 5
    """rewards per return (1: one-step Q-learning; 5, not Rainbow's 3: docs/dqn.md)"""
    huber_delta: Annotated[float, Field(gt=0, le=1e30)] = 1.0
    """Huber loss threshold (a large value gives the squared error)"""
    clip_reward: Optional[Positive] = None
    """clip each reward to [-c, c] for learning; logged and evaluated returns stay the env's own"""
    terminal_on_life_loss: bool = True
    """envs with info["lives"] (ALE): a lost life ends the return for learning; the game plays on"""
    tau: Rate = 1.0
    """target update rate: 1 copies the online net, < 1 is a Polyak average"""
    target_network_frequency: Count = 500
    """SGD steps between target updates"""
    learning_starts: Count = 1_000
    """environment steps of collection before learning"""
    train_frequency: Count = 2
    """environment steps per SGD step"""
    start_e: Fraction = 1.0
    """initial exploration epsilon"""
    end_e: Fraction = 0.05
    """final exploration epsilon"""
    exploration_fraction: Rate = 0.2
    """fraction of --total-timesteps over which epsilon decays linearly"""
    exploration_steps: Optional[Count] = None
    """env steps over which epsilon decays linearly, whatever the budget (the presets'; a typed fraction wins)"""
    # Replay
    buffer_size: Count = 50_000
    """replay capacity in transitions"""
    prioritized: bool = True
    """prioritized replay; --no-prioritized samples uniformly through the same code (alpha = 0)"""
    per_alpha: Fraction = 0.6
    """priority exponent alpha"""
    per_beta0: Fraction = 0.4
    """initial importance-sampling exponent, annealed linearly to 1"""
    per_beta_steps: Optional[Count] = None
    """env steps over which beta rises to 1, whatever the budget (the Atari preset's); default the budget"""
    per_eps: Positive = 1e-6
    """added to |TD| so that no transition has zero probability"""
    # Learner
    updates_per_call: Annotated[int, Field(ge=1, le=128)] = 32
    """SGD steps fused in one jitted call (the policy acts one call behind: at most 128 SGD steps)"""
    prefetch_size: Annotated[int, Field(ge=1, le=64)] = 2
    """calls' worth of batches the prefetch thread keeps ready on the device"""
    num_devices: Annotated[int, Field(ge=-1, le=65_536)] = 1
    """local devices the learner splits each batch over (-1: all)"""
    actor_device: Literal["cpu", "learner"] = "cpu"
    """where the policy acts for the N envs: the host CPU, or the learner's first device (--preset atari)"""
    # Run and output
    eval_every: Count = 10_000
    """environment steps between evaluations"""
    eval_episodes: Envs = 10
    """episodes per evaluation, run as parallel envs"""
    eval_epsilon: Fraction = 0.0
    """epsilon of the evaluation policy"""
    checkpoint_every: Annotated[int, Field(ge=0, lt=2**31)] = 50_000
    """environment steps between checkpoints (0: none by steps)"""
    log_every: Count = 1_000
    """environment steps between tensorboard scalars"""
    run_dir: Optional[Annotated[str, Field(min_length=1)]] = None
    """output folder (default runs/<env_id>__dqn_prioritized__<seed>__<unix time>); must be new or empty"""
    resume: Optional[Annotated[str, Field(min_length=1)]] = None
    """run folder to continue: its flags, overridden by those typed here; writes there"""
    capture_video: bool = False
    """film the first episode of each evaluation into RUN_DIR/videos (needs moviepy)"""
    track: bool = False
    """stream the scalars and the evaluations' films to Weights & Biases while the run runs (needs wandb)"""
    wandb_project_name: str = "cleanRL"
    """the W&B project of --track"""
    wandb_entity: Optional[str] = None
    """the W&B team or user of --track (default: the logged-in user)"""

    __pydantic_config__ = pydantic.ConfigDict(strict=True, allow_inf_nan=False, extra="forbid")  # no flag ignored


# The PER paper's proportional variant (Schaul et al. 2016, App. B) on tuned Double DQN (van Hasselt
# et al. 2016) on Nature DQN (Mnih et al. 2015). One agent step is 4 frames.
ATARI_PRESET = dict(
    total_timesteps=50_000_000,  # 200M frames
    num_envs=64,  # two halves of 32: half the policy calls of 32 envs, 1.17x on a TPU v5e (docs/atari_minatar.md)
    actor_device="learner",  # the Nature CNN for a half: a 1.5 ms round trip there, beside 13 cores of emulators
    buffer_size=1_000_000,  # Nature DQN
    learning_rate=6.25e-5,  # PER: tuned Double DQN's 2.5e-4 / 4
    anneal_lr=False,
    adam_eps=1.5e-4,  # Adam at this lr and eps is Rainbow's (the papers used RMSProp)
    batch_size=32,
    train_frequency=4,
    learning_starts=50_000,
    target_network_frequency=7_500,  # tuned Double DQN: every 30k agent steps
    n_step=1,
    clip_reward=1.0,
    hidden_sizes=(512,),
    end_e=0.01,  # tuned Double DQN
    exploration_steps=1_000_000,  # agent steps (4M frames), whatever the budget
    per_beta_steps=50_000_000,  # PER: beta reaches 1 at the run's end; a shorter budget is the run's first part
    eval_epsilon=0.001,  # tuned Double DQN's evaluation epsilon
    eval_every=250_000,
    eval_episodes=8,
    checkpoint_every=1_000_000,
    log_every=10_000,
)
# The MinAtar paper's DQN (Young & Tian 2019, its examples/dqn.py): one step is one frame; PER on top
# (--no-prioritized: the paper's replay). 1-step targets, as the paper's: Rainbow's 3-step returns lost
# most of Asterix's return at 1M (docs/atari_minatar.md compares the configurations per game).
MINATAR_PRESET = dict(
    n_step=1,
    total_timesteps=5_000_000,
    num_envs=16,  # timed on a TPU against 1, 8 and 32; learned as the paper's 1 env did (docs/atari_minatar.md)
    updates_per_call=32,  # 128 ran twice as fast on a TPU v5e but learned less (docs/atari_minatar.md: Tried)
    buffer_size=100_000,
    learning_starts=5_000,
    batch_size=32,
    train_frequency=1,
    target_network_frequency=1_000,
    end_e=0.1,
    exploration_steps=100_000,  # frames, whatever the budget
    optimizer="rmsprop",
    learning_rate=2.5e-4,
    anneal_lr=False,
    hidden_sizes=(128,),
    eval_every=100_000,
    checkpoint_every=500_000,
    log_every=10_000,
)
PRESETS = {"atari": ATARI_PRESET, "minatar": MINATAR_PRESET}


class ConfigError(Exception):
    """Bad input (flags, files, envs): one line on stderr and exit 2."""


class RunFailed(Exception):
    """The run cannot go on (divergence, a full disk): one line and exit 1."""


# ------------------------------------------------------------------------------------------ NETWORK


class QNetwork(nn.Module):
    """Q(s, .): an MLP on vectors; on frame stacks [B, 4, 84, 84] Nature DQN's convolutions; with
    planes=True, on MinAtar's [B, 10, 10, C] its paper's one 3x3 convolution of 16 filters."""

    num_actions: int
    hidden_sizes: Tuple[int, ...]
    planes: bool = False

    @nn.compact
    def __call__(self, obs):
        x = obs.astype(jnp.float32)
        if self.planes:
            x = nn.relu(nn.Conv(16, (3, 3), padding="VALID")(x))
        elif obs.ndim == 4:  # uint8 frames, scaled here so that the replay and transfers carry bytes
            x = jnp.transpose(x, (0, 2, 3, 1)) / 255.0
            for features, kernel, stride in ((32, 8, 4), (64, 4, 2), (64, 3, 1)):
                x = nn.relu(nn.Conv(features, (kernel, kernel), (stride, stride), padding="VALID")(x))
        x = x.reshape((x.shape[0], -1))
        for width in self.hidden_sizes:
            x = nn.relu(nn.Dense(width)(x))
        return nn.Dense(self.num_actions)(x)


def make_network(args: Args, space: gym.spaces.Box, num_actions: int) -> QNetwork:
    """The Q-network of these flags for this observation space (tools/ build theirs here too)."""
    return QNetwork(num_actions, args.hidden_sizes, planes=is_planes(space))


def is_planes(space) -> bool:
    """MinAtar's bool feature planes (H, W, C): the state itself, kept as is, no frame stack."""
    return isinstance(space, gym.spaces.Box) and space.dtype == np.bool_ and len(space.shape) == 3


# ------------------------------------------------------------------------------------------- REPLAY


class NStepAssembler:
    """Per-step transitions of parallel envs in, n-step transitions out: each env keeps its last n steps
    in a ring, the oldest leaves with n rewards once n are pending, and at an episode's end every pending
    step leaves with its k <= n rewards, discount gamma^k if truncated (bootstrap) or 0 if terminated."""

    def __init__(self, n, gamma, num_envs, obs_shape, obs_dtype, clip_reward=None):
        self.n, self.clip_reward, self.t = n, clip_reward, 0  # step t lives in ring slot t % n
        self.powers = gamma ** np.arange(n + 1, dtype=np.float64)
        self.obs = np.zeros((n, num_envs) + tuple(obs_shape), obs_dtype)
        self.action = np.zeros((n, num_envs), np.int64)
        self.reward = np.zeros((n, num_envs), np.float32)
        self.pending = np.zeros(num_envs, np.int64)
        self.all_full = False  # every env has n pending steps: the common case, kept cheap
        ages = (np.arange(n) - np.arange(n)[:, None]) % n  # [oldest slot, slot]: steps since the oldest
        self.rolled_powers = self.powers[ages].astype(np.float32)
        self.full_discount = np.full(num_envs, self.powers[n], np.float32)

    def push(self, obs, action, reward, next_obs, terminated, truncated) -> Optional[dict]:
        """One vector step (next_obs: the real final observation where done); rows may be views of the ring."""
        if self.clip_reward is not None:
            reward = np.clip(reward, -self.clip_reward, self.clip_reward)
        slot = self.t % self.n
        self.obs[slot], self.action[slot], self.reward[slot] = obs, action, reward
        self.t += 1
        done = terminated | truncated
        if self.all_full and not done.any():  # every env emits its oldest step, no per-env indexing
            oldest = self.t % self.n
            ret = self.rolled_powers[oldest] @ self.reward
            return dict(zip(ROW, (self.obs[oldest], self.action[oldest], ret, next_obs, self.full_discount)))
        np.minimum(self.pending + 1, self.n, out=self.pending)
        full = np.flatnonzero((self.pending == self.n) & ~done)
        ended = np.flatnonzero(done)
        envs = np.concatenate([full, np.repeat(ended, self.pending[ended])])  # rows: full envs, then ended ones
        ages = np.concatenate([np.full(full.size, self.n - 1)] + [np.arange(self.pending[i]) for i in ended])
        self.pending[ended] = 0
        self.all_full = bool((self.pending == self.n).all())
        if not envs.size:
            return None
        oldest, k, offsets = (self.t - 1 - ages) % self.n, ages + 1, np.arange(self.n)  # each row's oldest slot
        rewards = self.reward[(oldest[:, None] + offsets) % self.n, envs[:, None]]
        ret = np.where(offsets < k[:, None], rewards * self.powers[: self.n], 0.0).sum(axis=1).astype(np.float32)
        discount = (self.powers[k] * (1.0 - terminated[envs])).astype(np.float32)
        return dict(zip(ROW, (self.obs[oldest, envs], self.action[oldest, envs], ret, next_obs[envs], discount)))


class FrameStore:
    """Atari frames kept once (pixel rows would keep each frame 8 times): frame f lives in ring slot
    f % capacity, rows hold the 4 frame numbers of obs and next_obs, a step writes its newest frame and a
    reset a zero frame and its first (an episode's first stack is 3 zero frames, then the first, as ALE's
    vector env and FrameStackObservation(padding_type="zero") pad it). `written` moves before a frame is
    copied in, so a reader that checks it after copying knows which frames may have changed under it."""

    def __init__(self, buffer_size: int, num_envs: int, frame_shape):
        self.capacity = buffer_size + buffer_size // 10 + 8 * num_envs + 4096  # resets add frames: see docs/dqn.md
        self.ring = np.zeros((self.capacity,) + tuple(frame_shape), np.uint8)
        self.written = 0
        self.stack = np.zeros((num_envs, FRAME_STACK), np.int64)  # frame numbers each env shows

    def _write(self, frames):
        numbers = self.written + np.arange(len(frames))
        self.written += len(frames)
        self.ring[numbers % self.capacity] = frames
        return numbers

    def start(self, obs, envs):
        """Envs `envs` (indexes) start episodes showing the stacks obs (one per env)."""
        if obs[:, :-1].any():  # the rows would name zero frames the env never showed
            raise ConfigError("an image env's first stack must be 3 zero frames, then the first (padding_type='zero')")
        zeros, firsts = self._write(np.zeros_like(obs[:, -1])), self._write(obs[:, -1])
        self.stack[envs] = np.concatenate([np.repeat(zeros[:, None], FRAME_STACK - 1, axis=1), firsts[:, None]], 1)

    def advance(self, reached, next_obs, done, envs=slice(None)):
        """A step of envs `envs` (a slice): (frame numbers of the stacks it led to, of the stacks they show now)."""
        reached_numbers = np.concatenate([self.stack[envs, 1:], self._write(reached[:, -1])[:, None]], axis=1)
        self.stack[envs] = reached_numbers
        if done.any():
            ended = np.flatnonzero(done)
            self.start(next_obs[ended], np.arange(len(self.stack))[envs][ended])
        return reached_numbers, self.stack[envs].copy()

    def read(self, numbers):
        """(pixels of frame-number stacks, whether each is intact)."""
        pixels = self.ring[numbers % self.capacity]
        return pixels, numbers.min(axis=-1) >= self.written - self.capacity


class DeviceFrames:
    """The FrameStore's ring mirrored on the learner's device(s), so that a call's minibatches cross as frame slots
    (32 KB at K=32) rather than pixels (58 MB): the frames written since the last call are copied over just before
    each update call, which gathers its rows there. A frame is a row of 4-byte words padded to a multiple of 128,
    the shape a TPU gathers rows from without copying the whole store (docs/atari_minatar.md)."""

    def __init__(self, frames: FrameStore, sharding):
        self.host, self.pushed, self.shape = frames, 0, frames.ring.shape[1:]
        self.words = frame_words(self.shape)
        self.store = jax.jit(lambda: jnp.zeros((frames.capacity, self.words), jnp.uint32), out_shardings=sharding)()
        self.write = jax.jit(lambda store, at, rows: store.at[at].set(rows), donate_argnums=0, out_shardings=sharding)

    def push(self) -> int:
        """Copies the frames written since the last push; returns the oldest frame number the device now holds."""
        capacity, written = self.host.capacity, self.host.written
        for start in range(max(self.pushed, written - capacity), written, 65_536):
            numbers = np.arange(start, min(start + 65_536, written))
            size = 1 << max(6, (numbers.size - 1).bit_length())  # a few shapes, a few compiles
            slots = np.concatenate([numbers, np.full(size - numbers.size, numbers[-1])]) % capacity  # repeats: same row
            self.store = self.write(self.store, slots.astype(np.int32), self.pack(self.host.ring[slots]))
        self.pushed = written
        return written - capacity

    def pack(self, frames: np.ndarray) -> np.ndarray:
        rows = np.zeros((len(frames), self.words * 4), np.uint8)
        rows[:, : frames[0].size] = frames.reshape(len(frames), -1)
        return rows.view(np.uint32)


def frame_words(shape) -> int:
    """4-byte words of a frame's row on the device: its bytes, rounded up to a multiple of 128 words."""
    return -(-int(np.prod(shape)) // 512) * 128


def unpack_frames(words: jax.Array, shape) -> jax.Array:
    """DeviceFrames.pack's inverse: rows of words [..., W] to uint8 frames [..., H, W']."""
    pixels = jax.lax.bitcast_convert_type(words, jnp.uint8).reshape(words.shape[:-1] + (-1,))
    return pixels[..., : int(np.prod(shape))].reshape(words.shape[:-1] + tuple(shape))


class PrioritizedReplay:
    """Proportional PER (Schaul et al. 2016) on cpprb's PrioritizedReplayBuffer (sum tree, + eps, ^ alpha).
    Inserts are staged and handed over 128 rows at a time (a cpprb call costs about 150 copied rows). One
    lock, as cpprb is not thread-safe; write_count[slot] counts overwrites, so that a |TD| is written back
    only where the slot still holds the row it was computed for."""

    def __init__(self, capacity, obs_shape, obs_dtype, alpha, eps, frames: Optional[FrameStore] = None):
        self.capacity, self.frames = capacity, frames
        if frames is not None:
            obs_shape, obs_dtype = (FRAME_STACK,), np.int64
        kinds = [(tuple(obs_shape), obs_dtype), ((), np.int64), ((), np.float32), (tuple(obs_shape), obs_dtype)]
        self.spec = dict(zip(ROW, kinds + [((), np.float32)]))  # name: (shape of one row, dtype)
        cpprb_spec = {k: {"shape": shape or 1, "dtype": dtype} for k, (shape, dtype) in self.spec.items()}
        self.buffer = cpprb.PrioritizedReplayBuffer(capacity, cpprb_spec, alpha=alpha, eps=eps)
        self.lock = threading.Lock()
        self.write_count = np.zeros(capacity, np.int64)
        self.priority = np.zeros(capacity, np.float64)  # cpprb cannot hand its priorities back
        self.staging_size = min(128, capacity)
        self.staging = {k: np.zeros((self.staging_size,) + shape, dtype) for k, (shape, dtype) in self.spec.items()}
        self.staged_rows = self.stale_rows = 0
        self.rng = np.random.default_rng()  # deals the draws out (cpprb's own draws are not seeded either)

    def add(self, rows: Optional[dict]) -> None:
        copied, total = 0, 0 if rows is None else len(rows["action"])
        while copied < total:
            take = min(total - copied, self.staging_size - self.staged_rows)
            for key, column in self.staging.items():
                column[self.staged_rows : self.staged_rows + take] = rows[key][copied : copied + take]
            self.staged_rows, copied = self.staged_rows + take, copied + take
            if self.staged_rows == self.staging_size:
                self.flush()

    def flush(self) -> None:
        """New rows enter at p = max_j p_j, so that each is replayed soon."""
        if not self.staged_rows:
            return
        with self.lock:
            slots = (self.buffer.get_next_index() + np.arange(self.staged_rows)) % self.capacity
            self.buffer.add(**{key: column[: self.staged_rows] for key, column in self.staging.items()})
            np.add.at(self.write_count, slots, 1)
            self.priority[slots] = self.buffer.get_max_priority()
        self.staged_rows = 0

    def sample(self, batch_size: int, num_batches: int = 1, beta: float = 1.0, decode: bool = True):
        """(K minibatches [K, B, ...] with IS 'weights', slot indexes [K * B], their write counts), each minibatch
        stratified over the whole priority mass (Schaul et al. 2016, B.2.1): one row from each 1/B of it. cpprb
        stratifies one draw of K*B rows into K*B ranges, K in each 1/B; each 1/B's K rows are dealt out to the K
        minibatches in random order, so a minibatch's row there is uniform over that 1/B. A frame row overwritten
        since its insert gets weight 0 and no write-back (the tests' and tools' path; decode=False, the learner's:
        frame rows keep their frame numbers, gathered on its device). Rows add() still stages are not drawn until
        flush()."""
        k, b = num_batches, batch_size
        deal = self.rng.permuted(np.arange(k * b).reshape(b, k), axis=1).T.reshape(-1)  # [K, B]: row of the draw
        with self.lock:
            if not self.buffer.get_stored_size():
                raise ValueError(f"sample: no rows in cpprb yet ({self.staged_rows} staged: flush() hands them over)")
            draw = self.buffer.sample(k * b, beta=beta)  # one beta for the K minibatches
            batch = {key: value[deal].reshape((k, b) + value.shape[1:]) for key, value in draw.items()}  # copies
            indexes = batch.pop("indexes").astype(np.int64).reshape(-1)
            write_counts = self.write_count[indexes]
        for key in ("action", "reward", "discount", "weights"):  # cpprb's columns are [rows, 1]
            batch[key] = batch[key].reshape(k, b)
        weights = batch["weights"]
        batch["weights"] = (weights / weights.max(axis=1, keepdims=True)).astype(np.float32)  # per minibatch, as Acme
        if self.frames is not None and decode:
            batch["obs"], obs_ok = self.frames.read(batch["obs"])
            batch["next_obs"], next_ok = self.frames.read(batch["next_obs"])
            stale = ~(obs_ok & next_ok)
            batch["weights"][stale], write_counts[stale.reshape(-1)] = 0.0, -1
            with self.lock:  # the count's owner is the replay: read on another thread than the one drawing
                self.stale_rows += int(stale.sum())
        return batch, indexes, write_counts

    def __len__(self) -> int:
        """Rows cpprb holds (staged ones not yet)."""
        with self.lock:
            return self.buffer.get_stored_size()

    def update_priorities(self, indexes, write_counts, priorities) -> int:
        """p_i = |delta_i| (+ eps by cpprb) where the slot still holds the sampled row; returns those kept."""
        if not np.all(np.isfinite(priorities) & (priorities >= 0)):  # one NaN poisons every sum in the tree
            raise ValueError("priorities must be finite and >= 0")
        with self.lock:
            fresh = self.write_count[indexes] == write_counts
            if fresh.any():  # cpprb refuses an empty update
                self.buffer.update_priorities(indexes[fresh], priorities[fresh])
                self.priority[indexes[fresh]] = priorities[fresh]
        return int(fresh.sum())

    def max_priority(self) -> float:
        with self.lock:
            return self.buffer.get_max_priority()

    def state_dict(self) -> dict:
        self.flush()
        with self.lock:
            stored = self.buffer.get_stored_size()
            rows = self.buffer.get_all_transitions() if stored else {}
            state = {f"replay/{k}": rows.get(k, np.zeros((0,) + (s or (1,)), d)) for k, (s, d) in self.spec.items()}
            state["replay/priority"] = self.priority[:stored].copy()
            state["replay/next_index"] = np.asarray(self.buffer.get_next_index(), np.int64)
            state["replay/max_priority"] = np.asarray(self.buffer.get_max_priority(), np.float64)
        if self.frames is not None:
            state["replay/frames"] = self.frames.ring[: min(self.frames.written, self.frames.capacity)]
            state["replay/frames_written"] = np.asarray(self.frames.written, np.int64)
        return state

    def load_state_dict(self, arrays: dict, path: str, num_actions: int) -> None:
        """Rebuild cpprb from a checked file: the same slots, priorities and insert position."""
        prio = arrays.get("replay/priority")
        stored = len(prio) if isinstance(prio, np.ndarray) and prio.ndim == 1 else -1
        require(0 <= stored <= self.capacity, f"{path}: replay/priority is not a vector of <= {self.capacity} rows")
        get = functools.partial(checked_array, arrays, path=path)
        prio, next_index = get("replay/priority", (stored,), np.float64), int(get("replay/next_index", (), np.int64))
        top = float(get("replay/max_priority", (), np.float64))
        data = {key: get(f"replay/{key}", (stored,) + (s or (1,)), d) for key, (s, d) in self.spec.items()}
        full = stored == self.capacity
        for ok, what in (
            (0 < top <= 1e30 and np.all((prio >= 0) & (prio <= top)), "priorities"),
            (0 <= next_index < self.capacity and (next_index == stored or full), "next_index"),
            (np.all((data["action"] >= 0) & (data["action"] < num_actions)), "actions"),
            (np.all((data["discount"] >= 0) & (data["discount"] <= 1)), "discounts"),
        ):
            require(ok, f"{path}: replay {what} out of range")
        if self.frames is not None:
            written = int(get("replay/frames_written", (), np.int64))
            require(0 <= written < 2**62, f"{path}: replay/frames_written is out of range")
            kept = min(written, self.frames.capacity)
            self.frames.ring[:kept] = get("replay/frames", (kept,) + self.frames.ring.shape[1:], np.uint8)
            numbers = np.concatenate([data["obs"].ravel(), data["next_obs"].ravel()])
            require(not stored or 0 <= numbers.min() <= numbers.max() < written, f"{path}: rows name unwritten frames")
            self.frames.written = written
        with self.lock:
            self.buffer.clear()
            if stored:
                self.buffer.add(**data, priorities=prio)
                if full and next_index:  # rewrite [0, next_index) so that the next insert lands there
                    self.buffer.add(**{key: v[:next_index] for key, v in data.items()}, priorities=prio[:next_index])
                # cpprb's max priority only rises: raise it on slot 0, then put slot 0's own back.
                self.buffer.update_priorities(np.array([0]), np.array([top]))
                self.buffer.update_priorities(np.array([0]), prio[:1])
            self.priority[:stored], self.write_count[:], self.staged_rows = prio, 0, 0


class Adder:
    """Acme's adder: env steps in, n-step rows into the replay. It keeps what each env shows as the replay
    stores it (the observation, or its frame numbers), stores the real final observation where an episode
    ended, and ends the return at a termination (with --terminal-on-life-loss also at a lost life) only:
    a truncation bootstraps."""

    def __init__(self, replay: PrioritizedReplay, nstep: NStepAssembler, terminal_on_life_loss: bool, envs=slice(None)):
        self.replay, self.nstep, self.frames, self.life_loss = replay, nstep, replay.frames, terminal_on_life_loss
        self.envs, self.shown, self.lives = envs, None, None  # envs: its slice of the run's envs (a FrameStore's)

    def start(self, obs) -> None:
        """The envs' first observations (of a run, or of a resumed one: env state is not saved)."""
        if self.frames is not None:
            self.frames.start(obs, np.arange(len(self.frames.stack))[self.envs])
        self.shown = obs if self.frames is None else self.frames.stack[self.envs].copy()

    def add(self, action, reward, next_obs, terminated, truncated, info) -> None:
        done = terminated | truncated
        reached, shown = real_next_obs(next_obs, done, info), next_obs
        if self.frames is not None:
            reached, shown = self.frames.advance(reached, next_obs, done, self.envs)
        ends_return = terminated
        if self.life_loss:
            lost, self.lives = lost_life(info, self.lives, done)
            ends_return = terminated | lost
        self.replay.add(self.nstep.push(self.shown, action, reward, reached, ends_return, truncated))
        self.shown = shown


def make_replay(args: Args, obs_space: gym.spaces.Box, num_envs=None) -> Tuple[PrioritizedReplay, NStepAssembler]:
    """The replay and an n-step assembler feeding it from num_envs envs (default all); frame stacks go through a
    FrameStore."""
    pixels = len(obs_space.shape) == 3 and not is_planes(obs_space)
    shape, dtype = ((FRAME_STACK,), np.int64) if pixels else (obs_space.shape, obs_space.dtype)
    frame = int(np.prod(obs_space.shape[1:])) * 1.1 if pixels else 0  # the FrameStore keeps 1.1 x the buffer
    row_bytes = 2 * int(np.prod(shape)) * np.dtype(dtype).itemsize + frame + 64  # + action, reward, priorities, trees
    require_memory(args.buffer_size * row_bytes, f"--buffer-size {args.buffer_size}")
    in_flight = 2 * (args.prefetch_size + 1) * args.updates_per_call * args.train_frequency  # frames written while a
    ring = args.buffer_size + in_flight  # draw waits for its call (a step writes 1, a reset 2): stale at use otherwise
    frames = FrameStore(ring, args.num_envs, obs_space.shape[1:]) if pixels else None
    alpha = args.per_alpha if args.prioritized else 0.0
    replay = PrioritizedReplay(args.buffer_size, obs_space.shape, obs_space.dtype, alpha, args.per_eps, frames)
    n = num_envs or args.num_envs
    return replay, NStepAssembler(args.n_step, args.gamma, n, shape, dtype, args.clip_reward)


# ------------------------------------------------------------------------------------------ LEARNER


TrainState = collections.namedtuple("TrainState", ["params", "target_params", "opt_state", "sgd_steps"])


def make_optimizer(args: Args, sgd_steps: int) -> optax.GradientTransformation:
    lr = optax.linear_schedule(args.learning_rate, 0.0, max(sgd_steps, 1)) if args.anneal_lr else args.learning_rate
    if args.optimizer == "rmsprop":  # torch's centred RMSprop: eps outside the root (MinAtar's DQN)
        direction = optax.rmsprop(lr, decay=0.95, eps=0.01, centered=True, eps_in_sqrt=False)
    else:
        direction = optax.adam(lr, eps=args.adam_eps)
    clip = optax.clip_by_global_norm(args.max_grad_norm) if args.max_grad_norm else optax.identity()
    return optax.chain(clip, direction)


@functools.partial(jax.jit, static_argnums=(0, 1, 2))  # one compile, not one per eager op
def init_train_state(network: QNetwork, optimizer, obs_shape: tuple, key) -> TrainState:
    params = network.init(key, jnp.zeros((1, *obs_shape), jnp.float32))
    target = jax.tree_util.tree_map(jnp.copy, params)  # a copy: the update donates its input buffers
    return TrainState(params, target, optimizer.init(params), jnp.zeros((), jnp.int32))


def huber(x: jax.Array, delta: float) -> jax.Array:
    """0.5 x^2 for |x| <= delta, else delta (|x| - delta / 2): its gradient is exact, where rlax's and optax's
    form adds x to delta in float32 and so has a zero gradient below half a float32 step of delta."""
    return jnp.where(jnp.abs(x) <= delta, 0.5 * x**2, delta * (jnp.abs(x) - 0.5 * delta))


def double_q_loss(q_apply, params, target_params, batch: dict, huber_delta: float):
    """IS-weighted Huber loss of double-Q TD errors; returns (loss, (td, mean Q(s, a)))."""
    q_sa = jnp.take_along_axis(q_apply(params, batch["obs"]), batch["action"][:, None], axis=1)[:, 0]
    # The online net only selects a* at s': a pass of its own keeps s' out of the backward pass.
    a_star = jnp.argmax(q_apply(jax.lax.stop_gradient(params), batch["next_obs"]), axis=1)
    q_next = jnp.take_along_axis(q_apply(target_params, batch["next_obs"]), a_star[:, None], axis=1)[:, 0]
    td = jax.lax.stop_gradient(batch["reward"] + batch["discount"] * q_next) - q_sa
    loss = jnp.mean(batch["weights"] * huber(td, huber_delta))
    return loss, (td, q_sa.mean())


def make_update(q_apply, optimizer, args: Args, shardings: "Shardings", unroll: int = 1, frame_shape=None):
    """jit(state, batches[K, B, ...], store) -> (state, metrics, |TD|[K, B]): K SGD steps in one call, a
    lax.scan, its body `unroll` steps long (XLA's CPU backend runs convolutions slower inside a loop). With
    frame_shape, obs and next_obs are slots of DeviceFrames' store [capacity, words], gathered here, and
    batches["fresh"] zeroes the weights of rows whose frames were overwritten since they were drawn."""

    def sgd_step(state: TrainState, batch: dict):
        grad_fn = jax.value_and_grad(double_q_loss, argnums=1, has_aux=True)
        (loss, (td, q_mean)), grads = grad_fn(q_apply, state.params, state.target_params, batch, args.huber_delta)
        updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        steps = state.sgd_steps + 1
        polyak = optax.incremental_update(params, state.target_params, args.tau)
        target = optax.periodic_update(polyak, state.target_params, steps, args.target_network_frequency)
        td = jnp.where(jnp.isfinite(optax.tree.norm(params)), td, jnp.nan)  # non-finite params: NaN priorities
        return TrainState(params, target, opt_state, steps), (loss, q_mean, td)

    def update(state: TrainState, batches: dict, store=None):
        if frame_shape is not None:
            batches = dict(batches)
            fresh = batches.pop("fresh")
            batches.update({key: unpack_frames(store[batches[key]], frame_shape) for key in ("obs", "next_obs")})
            batches["weights"] = batches["weights"] * fresh
        state, (loss, q_mean, td) = jax.lax.scan(sgd_step, state, batches, unroll=unroll)
        return state, {"losses/td_loss": loss.mean(), "losses/q_values": q_mean.mean()}, jnp.abs(td)

    whole, split = shardings
    shardings = (whole, split) if frame_shape is None else (whole, split, whole)
    return jax.jit(update, donate_argnums=0, in_shardings=shardings, out_shardings=(whole, whole, split))


# The train state's sharding (a whole copy on every device), the batches' and |TD|'s (split along B).
Shardings = collections.namedtuple("Shardings", ["replicated", "split"])


def learner_shardings(args: Args) -> Shardings:
    """Data parallel over --num-devices: jit partitions the update by these shardings, the loss's
    mean becomes per-device sums and one all-reduce, so every copy takes the whole batch's step."""
    devices = jax.local_devices()
    n = len(devices) if args.num_devices == -1 else args.num_devices
    names = ", ".join(map(str, devices))
    require(n <= len(devices), f"--num-devices {n}, but this machine has {len(devices)}: {names}")
    require(args.batch_size % n == 0, f"--batch-size {args.batch_size} does not split evenly over {n} devices")
    mesh = jax.sharding.Mesh(np.array(devices[:n]), ("devices",))
    spec = jax.sharding.PartitionSpec
    return Shardings(jax.sharding.NamedSharding(mesh, spec()), jax.sharding.NamedSharding(mesh, spec(None, "devices")))


class Learner:
    """Acme's learner: it owns the train state (on the learner's devices), beta's schedule, a prefetch thread
    that samples K minibatches ahead and puts them on the device(s), and a writer thread that writes each call's
    |TD| back as priorities. step() runs one jitted call of K SGD steps; actor_params is the copy the actor
    uses, taken as each call is dispatched (so it lags the learner by one call, K <= 128 SGD steps). A frame
    replay's frames are mirrored on the device (DeviceFrames): only frame slots cross with the minibatches."""

    def __init__(self, args: Args, network: QNetwork, replay: PrioritizedReplay, obs_shape: tuple):
        self.args, self.replay, self.shardings = args, replay, learner_shardings(args)
        self.act_device = actor_device(args.actor_device, self.shardings.replicated.mesh.devices.flat)
        self.num_actions = network.num_actions
        optimizer = make_optimizer(args, sgd_budget(args))
        init = functools.partial(init_train_state, network, optimizer, obs_shape)
        shapes = jax.eval_shape(init, jax.random.PRNGKey(args.seed))
        state_bytes = sum(x.size * x.dtype.itemsize for x in jax.tree_util.tree_leaves(shapes))
        rows, frames = (args.prefetch_size + 1) * args.updates_per_call * args.batch_size, replay.frames
        batches = rows * 2 * int(np.prod(obs_shape)) * 4  # obs and next_obs as float32
        store = 0
        if frames is not None:  # slots cross; one call's pixels are gathered on the device
            batches = rows * 2 * FRAME_STACK * 4 + args.updates_per_call * args.batch_size * 2 * int(np.prod(obs_shape))
            store = frames.capacity * frame_words(obs_shape[1:]) * 4
        require_memory(3 * state_bytes + batches + store, "the network, its copies, the frames and the batches", True)
        self.state = jax.device_put(init(jax.random.PRNGKey(args.seed)), self.shardings.replicated)
        self.frames = DeviceFrames(frames, self.shardings.replicated) if frames is not None else None
        unroll = 32 if len(obs_shape) == 3 and jax.default_backend() == "cpu" else 1  # convolutions: make_update
        frame_shape = obs_shape[1:] if frames is not None else None
        self.update = make_update(network.apply, optimizer, args, self.shardings, unroll, frame_shape)
        self.sampler = concurrent.futures.ThreadPoolExecutor(1, "prefetch")
        self.writer = concurrent.futures.ThreadPoolExecutor(1, "priority-writer")
        self.batches, self.writes = collections.deque(), collections.deque()  # futures, oldest first
        self.metrics, self.wait_seconds, self.learn_seconds = {}, 0.0, 0.0
        self.sgd_steps, self.stale_rows = 0, 0  # SGD steps done (the train state's count), frame rows gone stale
        self.actor_params = actor_copy(self.state.params, self.act_device)  # the params that act (one call behind)

    def step(self, env_step: int) -> bool:
        """K SGD steps in one call on batches sampled ahead; False, and nothing done, while the replay holds
        fewer than B rows (the n-step rows lag the env steps)."""
        self.replay.flush()
        if len(self.replay) < self.args.batch_size:
            return False
        beta = self.beta(env_step)
        while len(self.batches) <= self.args.prefetch_size:  # prefetch_size calls ahead while this one learns
            self.batches.append(self.sampler.submit(self.sample, beta))
        start = time.perf_counter()
        batches, indexes, write_counts, oldest = self.batches.popleft().result()
        self.wait_seconds += time.perf_counter() - start
        store = ()
        if self.frames is not None:  # rows whose frames the device overwrote since the draw: weight 0, no write-back
            fresh = oldest >= self.frames.push()
            write_counts = np.where(fresh.reshape(-1), write_counts, -1)
            self.stale_rows += fresh.size - int(fresh.sum())
            batches = dict(batches, fresh=jax.device_put(fresh.astype(np.float32), self.shardings.split))
            store = (self.frames.store,)
        self.actor_params = actor_copy(self.state.params, self.act_device)  # call i-1's params act until call i+1
        self.state, self.metrics, priorities = self.update(self.state, batches, *store)
        self.writes.append(self.writer.submit(self.write_priorities, indexes, write_counts, priorities, self.sgd_steps))
        while self.writes and self.writes[0].done():
            self.writes.popleft().result()  # raises the writer's error, e.g. divergence
        self.sgd_steps += self.args.updates_per_call
        self.learn_seconds += time.perf_counter() - start
        return True

    def beta(self, env_step: int) -> float:
        horizon = self.args.per_beta_steps or self.args.total_timesteps
        return linear_schedule(self.args.per_beta0, 1.0, horizon, env_step)

    def sample(self, beta: float):
        """On the prefetch thread: (batches [K, B, ...] on the device(s), slot indexes, write counts, and for frame
        rows each row's oldest frame number [K, B]; their obs and next_obs are slots in the device's store)."""
        args, decode = self.args, self.frames is None
        batches, indexes, write_counts = self.replay.sample(args.batch_size, args.updates_per_call, beta, decode)
        oldest = None
        if not decode:
            oldest = np.minimum(batches["obs"].min(-1), batches["next_obs"].min(-1))
            for key in ("obs", "next_obs"):
                batches[key] = (batches[key] % self.frames.host.capacity).astype(np.int32)
        return jax.device_put(batches, self.shardings.split), indexes, write_counts, oldest

    def write_priorities(self, indexes, write_counts, priorities, first_step: int) -> None:
        """On the writer thread (reading |TD| waits for the call): stop on divergence, else write back."""
        priorities = np.asarray(priorities, np.float64)
        finite = np.isfinite(priorities).all(axis=1)
        if not finite.all():
            step = first_step + int(np.argmin(finite)) + 1
            raise RunFailed(f"the learner diverged: non-finite TD error at SGD step {step}")
        if self.args.prioritized:  # with alpha = 0 a write changes nothing
            self.replay.update_priorities(indexes, write_counts, priorities.reshape(-1))

    def scalars(self, step: int) -> dict:
        """What it logs: the last call's losses, beta, the largest priority (and the frame rows gone stale)."""
        scalars = {k: float(v) for k, v in self.metrics.items()}
        scalars.update({"replay/beta": self.beta(step), "replay/priority_max": self.replay.max_priority()})
        if self.frames is not None:
            scalars["replay/stale_rows"] = self.stale_rows
        return scalars

    def progress(self) -> str:
        return f"loss {float(self.metrics.get('losses/td_loss', np.nan)):.4f}"

    def policy_params(self):
        return self.state.params

    def state_dict(self) -> dict:
        """The train state and the replay, once the priorities of every call so far are in the replay."""
        while self.writes:
            self.writes.popleft().result()
        return {**tree_arrays("train_state/", self.state), **self.replay.state_dict()}

    def load_state_dict(self, arrays: dict, path: str) -> None:
        """A checkpoint's checked train state (one copy, whatever number of devices wrote it) and replay."""
        state = restore_tree(self.state, arrays, "train_state/", path)
        self.state = jax.device_put(state, self.shardings.replicated)
        self.replay.load_state_dict(arrays, path, self.num_actions)
        self.sgd_steps, self.stale_rows = int(self.state.sgd_steps), 0
        require(0 <= self.sgd_steps < 2**31, f"{path}: train_state/sgd_steps is out of range")
        if self.frames is not None:
            self.frames.pushed = 0  # the next push copies the whole ring
        self.actor_params = actor_copy(self.state.params, self.act_device)  # no lag yet

    def close(self) -> None:
        self.sampler.shutdown(cancel_futures=True)
        self.writer.shutdown()


def sgd_budget(args: Args) -> int:
    """SGD steps in the whole run: one per --train-frequency env steps after --learning-starts."""
    return max(0, args.total_timesteps - args.learning_starts) // args.train_frequency


# ------------------------------------------------------------------------------------------- ACTING


# >>> shared: acting (each script that holds it holds this text: tests/test_shared.py)
def actor_device(where: str, learner_devices):
    """The device that acts: the host CPU, as Acme's actors (a round trip to an accelerator per env step
    costs more than a small network), or the learner's ("learner"; Atari's CNN in dqn_prioritized.py)."""
    try:
        return jax.devices("cpu")[0] if where == "cpu" else learner_devices[0]
    except RuntimeError:  # JAX_PLATFORMS without cpu: act where the learner is
        return learner_devices[0]


def actor_copy(params, device):
    """The actor's own copy of device 0's replica on `device`, a copy even there (the next update donates it)."""
    replica = jax.tree_util.tree_map(lambda x: x.addressable_shards[0].data, params)
    return jax.device_put(replica, device, may_alias=False)


def linear_schedule(start: float, end: float, duration: float, t: float) -> float:
    """start at t = 0, linearly to end at t = duration, end after."""
    return end + (start - end) * max(0.0, 1.0 - t / duration)


# <<< shared: acting


def make_act(q_apply, num_actions: int):
    """(params, obs[N], epsilon, numpy rng) -> actions[N], epsilon-greedy; the network runs only if one is greedy.
    On an accelerator the actions return as a device array still being computed: np.asarray waits for them."""
    greedy = jax.jit(lambda params, obs: jnp.argmax(q_apply(params, obs), axis=-1))
    mixed = jax.jit(lambda params, obs, explore, random: jnp.where(explore, random, greedy(params, obs)))

    def act(params, obs, epsilon, rng):
        explore = rng.random(len(obs)) < epsilon
        if not explore.any():
            return greedy(params, obs)
        random = rng.integers(num_actions, size=len(obs))
        return random if explore.all() else mixed(params, obs, explore, random)

    return act


def make_groups(env_fn, num_envs: int, cleanup) -> list:
    """The training envs: where they step in the background (ale_py's) and N is even, two halves that step in
    turn, so that one half steps while the other's policy call and store run (docs/design.md); else one group."""

    def group(n: int, first: int) -> EnvGroup:
        envs = cleanup.enter_context(contextlib.closing(env_fn(n)))
        check_envs(envs)
        require(getattr(envs, "num_envs", None) == n, f"env_fn({n}) made {getattr(envs, 'num_envs', None)} envs")
        return EnvGroup(envs, first)

    if num_envs % 2 == 0:
        half = group(num_envs // 2, 0)
        if half.background:
            return [half, group(num_envs // 2, num_envs // 2)]
        half.envs.close()  # closed again on the way out: gymnasium's and ale_py's close twice safely
    return [group(num_envs, 0)]


class EnvGroup:
    """Envs [first, first + n) of the run as one vector env: send(actions) starts their step, in the env's own
    threads where it steps in the background (ale_py's send/recv), and recv() returns it; `actions` are the
    indexes sent last (an env with Discrete(n, start=s) gets s + index)."""

    def __init__(self, envs, first: int):
        self.envs, self.slice, self.actions, self.in_flight = envs, slice(first, first + envs.num_envs), None, False
        self.background = callable(getattr(envs, "send", None)) and callable(getattr(envs, "recv", None))
        self.action_start = int(getattr(envs.single_action_space, "start", 0))

    def send(self, actions) -> None:
        self.actions, self.in_flight = np.asarray(actions), True  # np.asarray waits for a policy call still running
        if self.background:
            self.envs.send(self.actions + self.action_start)

    def recv(self):
        self.in_flight = False
        return self.envs.recv() if self.background else self.envs.step(self.actions + self.action_start)

    def drain(self) -> None:
        if self.background and self.in_flight:  # a step in flight ends before the env closes
            self.recv()


def exploration_horizon(args: Args) -> float:
    """Env steps over which epsilon decays: --exploration-steps, else --exploration-fraction of the budget."""
    return args.exploration_steps or args.exploration_fraction * args.total_timesteps


# -------------------------------------------------------------------------------------------- TRAIN


def train(args: Args, env_fn=None) -> dict:
    """Train with Args as parse_args gives them; env_fn(num_envs, video=None) -> a vector env in SAME_STEP
    autoreset mode builds the training and evaluation envs (default: make_env for --env-id). Returns a summary;
    a first Ctrl-C checkpoints, then raises KeyboardInterrupt (SIGTERM checkpoints and returns)."""
    args = check_args(args)
    warn(args)
    env_fn = env_fn or functools.partial(make_env, args.env_id)
    with contextlib.ExitStack() as cleanup:  # closes what was opened, in reverse, however the run ends
        signals = Signals(cleanup)  # first: a Ctrl-C while JAX compiles at the start stops the run too
        async_dispatch = jax.config.read("jax_cpu_enable_async_dispatch")
        jax.config.update("jax_cpu_enable_async_dispatch", False)  # the tiny policy call costs less without it
        cleanup.callback(jax.config.update, "jax_cpu_enable_async_dispatch", async_dispatch)  # as found, after
        groups = make_groups(env_fn, args.num_envs, cleanup)
        for group in groups:
            cleanup.callback(group.drain)  # before the envs close
        n = groups[0].envs.num_envs
        space, num_actions = check_envs(groups[0].envs)
        network = make_network(args, space, num_actions)
        replay, nstep = make_replay(args, space, n)
        learner = Learner(args, network, replay, space.shape)
        cleanup.callback(learner.close)
        act = make_act(network.apply, num_actions)
        spaces = (groups[0].envs.single_observation_space, groups[0].envs.single_action_space)
        evaluator = functools.partial(
            evaluate, act, env_fn=env_fn, episodes=args.eval_episodes, epsilon=args.eval_epsilon
        )
        run = Run(args, learner, env_fn, spaces, evaluator, signals, cleanup)
        step, life_loss = run.start_step, args.terminal_on_life_loss
        adders = [Adder(replay, copy.deepcopy(nstep), life_loss, g.slice) for g in groups]  # an assembler each
        rng = np.random.default_rng((args.seed + step, 1))  # exploration's draws: (seed, 1), not env 0's stream
        epsilon = linear_schedule(args.start_e, args.end_e, exploration_horizon(args), step)
        for group, adder in zip(groups, adders):  # env i is seeded seed + i, whichever group holds it
            group.envs.action_space.seed(args.seed + step + group.slice.start)
            obs, _ = group.envs.reset(seed=env_seed(args.seed, step, 1) + group.slice.start)  # env state is not saved
            adder.start(obs)
            group.send(act(learner.actor_params, obs, epsilon, rng))
        run.eval_if_due(step)  # the one a signal cut short, if the run resumed from there
        while step < args.total_timesteps and not run.stopped:
            rewards, dones = [], []
            for group, adder in zip(groups, adders):
                next_obs, reward, terminated, truncated, info = group.recv()

                # ACT: this half's next actions, epsilon-greedy on the actor's copy of the params (epsilon
                # decaying linearly), the policy call running while this step is stored
                epsilon = linear_schedule(args.start_e, args.end_e, exploration_horizon(args), step + n)
                actions = act(learner.actor_params, next_obs, epsilon, rng)

                # STORE: n-step rows, each leading to the real observation its last step reached
                adder.add(group.actions, reward, next_obs, terminated, truncated, info)
                group.send(actions)
                step += n
                rewards.append(reward)
                dones.append(terminated | truncated)

                # LEARN: one SGD step per --train-frequency env steps, K fused per call
                while not run.stopped and sgd_deficit(args, step, learner) >= args.updates_per_call:
                    if not learner.step(step):  # the replay holds fewer than B rows yet
                        break

            scalars = {"charts/epsilon": epsilon, "perf/sgd_deficit": sgd_deficit(args, step, learner)}
            run.tally(step, np.concatenate(rewards), np.concatenate(dones))
            run.log(step, scalars)
            run.eval_if_due(step)
            run.checkpoint(step)
        return run.finish(step)


def sgd_deficit(args: Args, step: int, learner: Learner) -> int:
    """SGD steps the env steps call for (one per --train-frequency after --learning-starts) minus those done."""
    return max(0, step - args.learning_starts) // args.train_frequency - learner.sgd_steps


# ================================================================================================ THE SEAM
# Above, the algorithm; below, the run harness: envs, files, checkpoints and resume, logging, signals, the CLI.


# ------------------------------------------------------------------------------------- ENVIRONMENTS


def is_image(space) -> bool:
    """uint8 images, grey (H, W) or RGB (H, W, 3), told by the space, never by the env's name."""
    shape = getattr(space, "shape", None) or ()
    return isinstance(space, gym.spaces.Box) and space.dtype == np.uint8 and (len(shape) == 2 or shape[2:] == (3,))


def make_env(env_id: str, num_envs: int, video: Optional[Tuple[str, str]] = None) -> gym.vector.VectorEnv:
    """The default env factory: vector envs in SAME_STEP autoreset mode (the step that ends an episode
    returns the next one's first observation, the real last one in info["final_obs"]); images get Nature
    DQN's 84x84 grey stacks of 4. ALE games step in ale_py's C++ vector env (threads, preprocessing and
    stacks inside); filmed, through AtariPreprocessing with the same settings (but 1-30 no-ops, not 0-29).
    Other envs step one after another in this thread: gymnasium's async envs were slower for MinAtar
    (docs/atari_minatar.md)."""
    with contextlib.suppress(ImportError):
        import ale_py  # noqa: F401 (registers the ALE ids)
    try:
        if env_id.startswith("MinAtar/") and env_id not in gym.registry:
            import minatar.gym

            minatar.gym.register_envs()
        probe = gym.make(env_id)
    except ImportError:
        raise ConfigError(f"{env_id} needs its package (MinAtar: pip install minatar)") from None
    except (gym.error.Error, AttributeError, ValueError) as e:
        raise ConfigError(f"cannot make env {env_id!r}: {first_line(e)}") from None
    space, ale = probe.observation_space, hasattr(probe.unwrapped, "ale")
    probe.close()
    vector = isinstance(space, gym.spaces.Box) and len(space.shape) == 1
    require(isinstance(probe.action_space, gym.spaces.Discrete), f"{env_id}: DQN needs Discrete actions (SAC: sac.py)")
    takes = f"this script takes vectors, uint8 images or bool planes: {FLATTEN}"
    require(vector or is_image(space) or is_planes(space), f"{env_id} has observations {space}; {takes}")
    wrappers, kwargs = [], {}
    if is_image(space) and ale and video is None:
        from ale_py.vector_env import AtariVectorEnv

        spec = gym.spec(env_id).kwargs  # the id's game, sticky actions (v5: 0.25) and action set
        return AtariVectorEnv(
            spec["game"],
            num_envs,
            num_threads=min(num_envs, os.cpu_count() or 1),
            repeat_action_probability=spec.get("repeat_action_probability", 0.25),
            full_action_space=spec.get("full_action_space", False),
            frameskip=4,
            maxpool=True,  # the max of the last two frames of each step
            noop_max=30,
            stack_num=FRAME_STACK,
            img_height=84,
            img_width=84,
            grayscale=True,
            max_num_frames_per_episode=108_000,
            reward_clipping=False,  # learning clips (--clip-reward); logged returns are the game's score
            episodic_life=False,  # a lost life ends the return for learning only (--terminal-on-life-loss)
            use_fire_reset=False,
            autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
        )
    if is_image(space) and ale:
        wrappers = [functools.partial(gym.wrappers.AtariPreprocessing, noop_max=30, frame_skip=4, screen_size=84)]
        kwargs = {"frameskip": 1, "max_num_frames_per_episode": 108_000}  # sticky actions: the id's own
    elif is_image(space):
        grey = [gym.wrappers.GrayscaleObservation] if len(space.shape) == 3 else []
        wrappers = grey + [functools.partial(gym.wrappers.ResizeObservation, shape=(84, 84))]
    if is_image(space):
        stack = functools.partial(gym.wrappers.FrameStackObservation, stack_size=FRAME_STACK, padding_type="zero")
        wrappers.append(stack)
    if video is not None:
        if sys.platform.startswith("linux") and not os.environ.get("DISPLAY"):  # pygame opens an SDL display
            os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
        kwargs["render_mode"] = "rgb_array"
    sync = dict(vectorization_mode="sync", vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP})
    envs = gym.make_vec(env_id, num_envs, wrappers=wrappers, **sync, **kwargs)
    if video is not None:  # the first episode of sub-env 0; videos/ keeps the earlier evaluations' files
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*Overwriting existing videos")
            envs.envs[0] = gym.wrappers.RecordVideo(envs.envs[0], video[0], lambda e: e == 0, name_prefix=video[1])
    return envs


def check_envs(envs) -> Tuple[gym.spaces.Box, int]:
    """(observation space, number of actions) of a vector env this script trains on, else a ConfigError."""
    mode = envs.metadata.get("autoreset_mode")
    require(mode == gym.vector.AutoresetMode.SAME_STEP, f"the env factory must set SAME_STEP autoreset, not {mode}")
    require(isinstance(envs.single_action_space, gym.spaces.Discrete), "DQN needs Discrete actions")
    space = envs.single_observation_space
    shape = space.shape if isinstance(space, gym.spaces.Box) else None
    stack = shape and shape[:1] == (FRAME_STACK,) and len(shape) == 3 and space.dtype == np.uint8  # [4, H, W]
    takes = f"the network takes vectors, bool planes or uint8 stacks of {FRAME_STACK} frames [{FRAME_STACK}, H, W]"
    require(shape and (len(shape) == 1 or is_planes(space) or stack), f"{space}: {takes}; {FLATTEN}")
    return space, int(envs.single_action_space.n)


def real_next_obs(next_obs, done, info):
    """The observation each step led to: at an episode's end, info["final_obs"] (SAME_STEP mode)."""
    if not done.any():
        return next_obs
    real = next_obs.copy()
    for i in np.flatnonzero(done):
        real[i] = info["final_obs"][i]
    return real


def lost_life(info, lives, done):
    """(envs that lost a life without ending the game this step, the lives now)."""
    if "lives" not in info:
        return np.zeros_like(done), None
    now = np.asarray(info["lives"])
    return ((now < lives) & ~done if lives is not None else np.zeros_like(done)), now


def env_seed(*entropy: int) -> int:
    """A vector env seeds env i with reset's seed + i: a seed drawn from the run's seed (and step) keeps
    runs of seeds 1 and 2 from sharing the streams of all their envs but one. The callers end `entropy`
    with a nonzero tag of their own: SeedSequence ignores trailing zeros ((1, 0) is 1)."""
    return int(np.random.SeedSequence(entropy).generate_state(1)[0] >> 2)  # env seeds stay int32


def evaluate(act, params, env_fn, episodes: int, epsilon: float, seed: int, video=None, stop=None):
    """Returns of whole episodes (unclipped, lives do not end them) on parallel envs, the same seeds
    every time; an evaluation a signal cuts short returns None."""
    with contextlib.closing(env_fn(episodes, video=video)) as envs:
        envs.action_space.seed(seed)
        obs, _ = envs.reset(seed=env_seed(seed, 2))
        returns, running, rng = np.zeros(episodes), np.ones(episodes, bool), np.random.default_rng((seed, 1))
        action_start = int(envs.single_action_space.start)
        while running.any():
            if stop:  # a signal arrived: the run checkpoints at once
                return None
            obs, reward, terminated, truncated, _ = envs.step(np.asarray(act(params, obs, epsilon, rng)) + action_start)
            returns += reward * running
            running &= ~(terminated | truncated)
        return returns


# -------------------------------------------------------------------------------------------- FILES
# checkpoint.npz and model.npz, read with allow_pickle=False: meta.json (format, counters, flags) and one array per
# leaf named by its place ("train_state/params/params/Dense_0/kernel", "replay/obs"), each checked before use.


def require(ok, message: str) -> None:
    if not ok:
        raise ConfigError(message)


def require_memory(nbytes: int, what: str, device: bool = False) -> None:
    """Refuse before allocating what this machine's RAM (a replay), with device=True its device too, cannot hold."""
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    limit = min(ram, (jax.local_devices()[0].memory_stats() or {}).get("bytes_limit", ram)) if device else ram
    require(nbytes < limit, f"{what}: {nbytes / 2**30:,.1f} GiB, more than the {limit / 2**30:,.1f} GiB here")


def first_line(error: BaseException) -> str:
    return (str(error).splitlines() or [type(error).__name__])[0]


# >>> shared: files (each script that holds it holds this text: tests/test_shared.py)
def write_atomic(path: str, write) -> None:
    """write(file) into a temp file beside `path`, fsync, rename: a crash keeps the old file, a symlink is replaced."""
    tmp = f"{path}.tmp.{os.getpid()}.{time.time_ns()}"
    try:
        with open(tmp, "xb") as f:  # x: a file of its own, never one found there
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        raise RunFailed(f"could not write {path} ({e.strerror or e}); the previous one is unchanged") from None
    finally:
        with contextlib.suppress(OSError):  # gone already: renamed into place, or never made
            os.remove(tmp)


def save_npz(path: str, meta: dict, arrays: dict) -> None:
    meta_bytes = np.frombuffer(json.dumps(meta).encode(), np.uint8)
    write_atomic(path, lambda f: np.savez(f, **{"meta.json": meta_bytes}, **arrays))


def load_npz(path: str, kind: str) -> Tuple[dict, dict]:
    """(meta, arrays) of a `kind` ("checkpoint" or "model") this script wrote, else a ConfigError."""
    path = os.path.join(path, f"{kind}.npz") if os.path.isdir(path) else path
    require(os.path.isfile(path), f"no such file: {path}")
    with open(path, "rb") as f:
        old = f"{path} is a pickle of an earlier version: not loaded (docs/reliability.md, Old .pkl files)"
        require(f.read(1) != b"\x80", old)
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {name: z[name] for name in z.files}
        meta = json.loads(arrays.pop("meta.json").tobytes())
    except Exception as e:  # a cut-short zip, an object array, no meta.json, ...
        raise ConfigError(f"{path} is not a readable {kind} ({type(e).__name__}: {first_line(e)})") from None
    require(all(isinstance(v, np.ndarray) for v in arrays.values()), f"{path} has a member that is not an array")
    ours = isinstance(meta, dict) and meta.get("format") == FORMAT and meta.get("kind") == kind
    require(ours, f"{path} is not a {kind} written by {SCRIPT}.py (format {FORMAT})")
    return meta, arrays


def checked_array(arrays: dict, name: str, shape: tuple, dtype, path: str) -> np.ndarray:
    got = arrays.get(name)
    if got is None or got.shape != tuple(shape) or got.dtype != np.dtype(dtype):
        found = "missing" if got is None else f"{got.dtype}{list(got.shape)}"
        raise ConfigError(f"{path}: {name} is {found}, expected {np.dtype(dtype)}{list(shape)}")
    if np.issubdtype(got.dtype, np.floating):
        require(np.isfinite(got).all(), f"{path}: {name} holds values that are not finite")
    return got


def tree_arrays(prefix: str, tree) -> dict:
    leaves, _ = jax.tree_util.tree_flatten_with_path(jax.device_get(tree))
    return {prefix + jax.tree_util.keystr(p, simple=True, separator="/"): np.asarray(x) for p, x in leaves}


def restore_tree(template, arrays: dict, prefix: str, path: str):
    """The arrays named prefix* in the structure of `template`, each checked, none left over."""
    wanted = tree_arrays(prefix, template)
    leaves = [checked_array(arrays, name, like.shape, like.dtype, path) for name, like in wanted.items()]
    extra = sorted(k for k in arrays if k.startswith(prefix) and k not in wanted)
    require(not extra, f"{path}: unexpected array {extra[0] if extra else ''} (other --hidden-sizes or env?)")
    return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(template), [jnp.asarray(x) for x in leaves])


def check_args(args: Args) -> Args:
    """args_from_json's checks, then the optional packages the flags ask for."""
    args = args_from_json(dataclasses.asdict(args))
    try:
        args.capture_video and __import__("moviepy")
    except ImportError:
        raise ConfigError("--capture-video needs moviepy: pip install moviepy") from None
    try:
        args.track and __import__("wandb")
    except ImportError:
        raise ConfigError("--track needs wandb: pip install wandb") from None
    return args


# <<< shared: files
def args_from_json(saved, where: str = "") -> Args:
    """Flags from JSON (a run folder's, maybe hostile, or the command line's): each of its type and in
    its range, and the checks between flags, or one ConfigError naming the first bad flag."""
    try:
        text = json.dumps(saved, default=lambda v: v.item() if isinstance(v, np.generic) else str(v))  # numpy, paths
        args = pydantic.TypeAdapter(Args).validate_json(text)
    except pydantic.ValidationError as e:
        error = e.errors()[0]
        flag = "--" + str(error["loc"][0]).replace("_", "-") if error["loc"] else "the flags"
        message = f"{flag} {error['msg'].removeprefix('Input ')}, got {error.get('input')!r}"
        raise ConfigError(f"{where}: {message}" if where else message) from None
    between = (
        (args.seed < 2**31 - args.total_timesteps - 10_000, "--seed must be in [0, 2^31 - 10^4 - steps)"),
        (args.batch_size <= args.buffer_size, f"--batch-size {args.batch_size} exceeds --buffer-size"),
        (args.learning_starts >= args.batch_size, "--learning-starts must be at least --batch-size"),
        (args.num_devices != 0, "--num-devices must be positive or -1 (all)"),
    )
    for ok, message in between:
        require(ok, f"{where}: {message}" if where else message)
    return args


# ------------------------------------------------------------------------------------------ LOGGING


# >>> shared: tracking (each script that holds it holds this text: tests/test_shared.py)
def wandb_run(run_dir: str, args):
    """--track, as CleanRL's: a W&B run streamed while this one runs (each scalar as it is written, the
    evaluations' films), named and keyed by the run folder, so that a --resume continues it; the flags its config.
    wandb writes its files where it does for CleanRL (WANDB_DIR, else ./wandb), not into the run folder."""
    if not args.track:
        return None
    import wandb

    name = os.path.basename(os.path.abspath(run_dir))
    run_id = "".join(c if c.isascii() and (c.isalnum() or c in "_-") else "-" for c in name)[-64:]  # as wandb_upload
    config, resume = dataclasses.asdict(args), "allow" if args.resume else "never"  # a new run joins no old one
    flush = wandb.Settings(x_transaction_log_flush_interval=0.25)  # its run file each 0.25 s (15 s): a kill loses less
    names = dict(project=args.wandb_project_name, entity=args.wandb_entity, name=name, id=run_id, config=config)
    try:  # reinit: a W&B run the caller has open stays the caller's
        run = wandb.init(**names, resume=resume, reinit="create_new", settings=flush)
    except wandb.errors.Error as e:  # not logged in, no such entity, the id taken, no network
        raise ConfigError(f"--track: {first_line(e)}") from None
    run.define_metric("*", step_metric="global_step")  # a resume's redone steps are logged again at their step
    return run


def wandb_film(run, video, step: int) -> None:
    """An evaluation's film (its first episode's, as RecordVideo names it) into the W&B run, at its step."""
    path = os.path.join(video[0], f"{video[1]}-episode-0.mp4") if video else None
    if run is not None and path and os.path.isfile(path):
        import wandb

        run.log({"videos/eval": wandb.Video(path, format="mp4"), "global_step": step})


# <<< shared: tracking


# >>> shared: signals (each script that holds it holds this text: tests/test_shared.py)
class Signals:
    """SIGINT and SIGTERM during train(): the first stops the run (it checkpoints); a second Ctrl-C (not SIGTERM:
    `timeout` sends it twice) stops at once, but inside JAX (a compile interrupted there crashed the exit:
    docs/reliability.md) it only marks the run, and check() raises it at the next checkpoint or the run's end."""

    def __init__(self, cleanup):
        self.stopped, self.interrupted, self.resume = [], False, "no checkpoint yet"
        self.install(cleanup)

    def install(self, cleanup) -> None:
        """Takes both (again after a library took them: Ray does); the handlers found are put back at the end."""
        for s in (signal.SIGINT, signal.SIGTERM):
            cleanup.callback(signal.signal, s, signal.signal(s, self.on_signal))

    def on_signal(self, signum, frame):
        if self.stopped and signum == signal.SIGINT:
            print(f"a second Ctrl-C: stopped at once; {self.resume}", flush=True)
            self.interrupted = True
            while frame is not None and not frame.f_globals.get("__name__", "").startswith(("jax.", "jaxlib.")):
                frame = frame.f_back
            if frame is None:  # not inside JAX
                raise KeyboardInterrupt
        self.stopped.append(signum)

    def check(self) -> None:
        if self.interrupted:
            raise KeyboardInterrupt


# <<< shared: signals


# >>> shared: harness (each script that holds it holds this text: tests/test_shared.py)
class Logger:
    """Tensorboard events written on this thread, flushed at each log tick (EventFileWriter's thread cost 12%:
    docs/benchmarks.md), eval.csv, and with --track the same scalars to W&B as they are written."""

    def __init__(self, run_dir: str, args: Args, resumed_at: Optional[int] = None):
        self.wandb = wandb_run(run_dir, args)  # first: a refused --track leaves the folder as it was
        from tensorboard.compat.proto import event_pb2, summary_pb2
        from tensorboard.summary.writer.record_writer import RecordWriter

        self.event, self.summary = event_pb2.Event, summary_pb2.Summary
        name = f"events.out.tfevents.{int(time.time()):010d}.{os.uname().nodename}.{os.getpid()}.{time.time_ns()}"
        self.file = open(os.path.join(run_dir, name), "xb")
        self.writer = RecordWriter(self.file)
        self.writer.write(self.event(wall_time=time.time(), file_version="brain.Event:2").SerializeToString())
        self.file.flush()
        self.csv, rows = os.path.join(run_dir, "eval.csv"), ["step,mean,std,episodes\n"]
        if resumed_at is not None and os.path.isfile(self.csv):  # the rows after the checkpoint are redone
            with open(self.csv, errors="replace") as f:  # the folder's file: maybe not even text
                steps = [(r, r.split(",")[0]) for r in f]
            kept = [r for r, step in steps if step.isdecimal() and len(step) < 12 and int(step) <= resumed_at]
            rows += [r.rstrip("\r\n") + "\n" for r in kept]  # a row a kill cut short gets its line end
        write_atomic(self.csv, lambda f: f.write("".join(rows).encode()))

    def scalars(self, step: int, values: dict) -> None:
        summary = self.summary(value=[self.summary.Value(tag=k, simple_value=float(v)) for k, v in values.items()])
        self.writer.write(self.event(wall_time=time.time(), step=int(step), summary=summary).SerializeToString())
        if self.wandb is not None:
            self.wandb.log({**{k: float(v) for k, v in values.items()}, "global_step": int(step)})

    def eval(self, step: int, returns: np.ndarray) -> None:
        self.scalars(step, {"eval/episodic_return": returns.mean(), "eval/episodic_return_std": returns.std()})
        with open(self.csv, "a") as f:
            f.write(f"{step},{returns.mean():.4f},{returns.std():.4f},{len(returns)}\n")

    def flush(self) -> None:
        self.file.flush()

    def close(self, failed: bool = False) -> None:
        try:
            self.file.close()
        finally:
            if self.wandb is not None:
                self.wandb.finish(exit_code=int(failed))  # a run that failed shows so in W&B


def open_run_dir(args: Args) -> str:
    """A fresh run writes only into a new or empty folder; a resumed one into its own, where the temp
    files of writes a kill cut short go first. Nothing in it may be a symlink, so no write leaves it."""
    default = f"runs/{args.env_id.replace('/', '-')}__{SCRIPT}__{args.seed}__{int(time.time())}"
    run_dir = args.resume or args.run_dir or default
    require(not os.path.exists(run_dir) or os.path.isdir(run_dir), f"--run-dir {run_dir} is not a folder")
    try:
        os.makedirs(run_dir, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"--run-dir {run_dir}: cannot be made ({e.strerror})") from None
    require(args.resume or not os.listdir(run_dir), f"--run-dir {run_dir} is not empty: give a new folder, or --resume")
    for folder, subfolders, files in os.walk(run_dir):
        for name in subfolders + files:
            require(not os.path.islink(os.path.join(folder, name)), f"{run_dir} holds a symlink: not written")
    for name in os.listdir(run_dir):
        if ".tmp." in name and args.resume:
            os.remove(os.path.join(run_dir, name))
    return run_dir


# --------------------------------------------------------------------------------------------- RUN


Tick = collections.namedtuple("Tick", ["time", "step", "sgd_steps", "wait", "learn"])  # the learner's counters


class Run:
    """train()'s harness: the run folder and args.json, resume, logging (tensorboard, W&B, eval.csv, the progress
    bar), evaluations, checkpoints, and the signals: a first Ctrl-C or SIGTERM stops the loop, which checkpoints;
    a second Ctrl-C stops at once. evaluate(params, seed=, video=, stop=) -> the returns of an evaluation's episodes."""

    def __init__(self, args: Args, learner: Learner, env_fn, spaces: tuple, evaluate, signals: Signals, cleanup):
        self.args, self.learner, self.evaluate, self.signals = args, learner, evaluate, signals
        self.dir, self.start_step, self.episodes, self.cut_short = open_run_dir(args), 0, 0, False
        video = (os.path.join(self.dir, "videos"), "probe") if args.capture_video else None
        try:  # called as the evaluations will call it: a bad factory fails before the first env step
            with contextlib.closing(env_fn(args.eval_episodes, video=video)) as probe:
                same = (probe.single_observation_space, probe.single_action_space) == spaces
                require(same, "the evaluation envs' spaces differ from the training envs'")
        except TypeError as e:
            raise ConfigError(f"env_fn(num_envs, video=...) failed: {first_line(e)}") from None
        if args.resume:
            self.start_step, self.episodes, self.cut_short = load_checkpoint(self.dir, learner, args.total_timesteps)
        # On resume eval.csv keeps the rows up to the checkpoint; a finished run's final one is redone.
        resumed_at = (
            (self.start_step if self.start_step < args.total_timesteps else self.start_step - 1)
            if args.resume
            else None
        )
        self.logger = Logger(self.dir, args, resumed_at)
        cleanup.push(lambda kind, *_: self.logger.close(failed=kind not in (None, KeyboardInterrupt)))
        self.meta = {"format": FORMAT, "script": SCRIPT, "args": dataclasses.asdict(args)}
        saved = json.dumps({"script": SCRIPT, "args": self.meta["args"]}, indent=2).encode()
        write_atomic(os.path.join(self.dir, "args.json"), lambda f: f.write(saved))
        progress = tqdm.tqdm(total=args.total_timesteps, initial=self.start_step, unit="step", disable=None)
        self.bar, self.stopped, self.last_eval = cleanup.enter_context(progress), signals.stopped, "-"
        self.saved_step = self.start_step if args.resume else None
        if args.resume:
            signals.resume = f"--resume {self.dir} continues from step {self.start_step}"
        every = (args.log_every, args.eval_every, args.checkpoint_every)
        self.next_log, self.next_eval, self.next_checkpoint = (next_multiple(self.start_step, n) for n in every)
        self.returns, self.lengths = np.zeros(args.num_envs), np.zeros(args.num_envs, np.int64)
        self.tick = Tick(time.perf_counter(), self.start_step, learner.sgd_steps, 0.0, 0.0)

    def tally(self, step: int, reward, done) -> None:
        """Each env's return and length so far; an episode's are logged as it ends."""
        self.returns += reward
        self.lengths += 1
        for i in np.flatnonzero(done):
            self.episode(step, self.returns[i], self.lengths[i])
            self.returns[i], self.lengths[i] = 0.0, 0

    def episode(self, step: int, ret: float, length: int) -> None:
        self.episodes += 1
        self.logger.scalars(step, {"charts/episodic_return": ret, "charts/episodic_length": length})

    def log(self, step: int, scalars: dict) -> None:
        """Every --log-every steps: the rates, `scalars` and the learner's own."""
        if step < self.next_log:
            return
        last, learner = self.tick, self.learner
        self.tick = Tick(time.perf_counter(), step, learner.sgd_steps, learner.wait_seconds, learner.learn_seconds)
        self.next_log, seconds = next_multiple(step, self.args.log_every), self.tick.time - last.time
        sps = (step - last.step) / seconds
        scalars = {"charts/SPS": sps, **scalars, **learner.scalars(step)}
        sgd_steps = self.tick.sgd_steps - last.sgd_steps
        scalars["perf/updates_per_second"] = sgd_steps / seconds
        scalars["perf/replay_ratio"] = sgd_steps * self.args.batch_size / (step - last.step)  # rows drawn per env step
        if self.tick.learn > last.learn:
            scalars["perf/learner_wait_fraction"] = (self.tick.wait - last.wait) / (self.tick.learn - last.learn)
        self.logger.scalars(step, scalars)
        self.logger.flush()
        line = f"SPS {sps:7.0f}  {learner.progress()}  episodes {self.episodes}  eval {self.last_eval}"
        self.bar.update(step - self.bar.n)
        self.bar.set_postfix_str(line, refresh=False)
        final = step >= self.args.total_timesteps
        if self.bar.disable and (step % (10 * self.args.log_every) < step - last.step or final):
            print(f"step {step:>8d}  {line}", flush=True)

    def eval_if_due(self, step: int) -> None:
        """Every --eval-every steps, and at a resume the one a signal cut short (the final one is finish()'s)."""
        if self.cut_short or self.next_eval <= step < self.args.total_timesteps:
            self.next_eval, returns = next_multiple(step, self.args.eval_every), self.eval_at(step, "eval")
            self.last_eval = self.last_eval if returns is None else f"{returns.mean():.1f}"

    def eval_at(self, step: int, prefix: str) -> Optional[np.ndarray]:
        video = (os.path.join(self.dir, "videos"), f"{prefix}-step-{step}") if self.args.capture_video else None
        params = actor_copy(self.learner.policy_params(), self.learner.act_device)  # the current ones, not the actor's
        seed = self.args.seed + 10_000  # the same episodes every time: evaluations differ by the policy only
        returns = self.evaluate(params, seed=seed, video=video, stop=self.stopped)
        if returns is not None:
            self.logger.eval(step, returns)
            wandb_film(self.logger.wandb, video, step)
        self.cut_short = returns is None and prefix == "eval"  # the checkpoint says so: a resume redoes it
        return returns

    def checkpoint(self, step: int, due: bool = False) -> None:
        """Every --checkpoint-every steps (or now, if due): the learner's state, the replay and the counters."""
        if step < self.next_checkpoint and not due:
            return
        self.signals.check()  # before a write a second Ctrl-C was to cut short
        self.next_checkpoint = next_multiple(step, self.args.checkpoint_every)
        counters = {"kind": "checkpoint", "global_step": step, "episodes": self.episodes, "cut_short": self.cut_short}
        save_npz(os.path.join(self.dir, "checkpoint.npz"), {**self.meta, **counters}, self.learner.state_dict())
        self.saved_step, self.signals.resume = step, f"--resume {self.dir} continues from step {step}"

    def finish(self, step: int) -> dict:
        """The last checkpoint, the model, the final evaluation; after a signal, how to resume (a Ctrl-C then
        raises KeyboardInterrupt, so that a caller's loop over seeds stops too)."""
        self.signals.check()
        if self.saved_step != step:
            self.checkpoint(step, due=True)
        self.bar.update(step - self.bar.n)  # the steps after the last log tick
        self.bar.close()  # before anything else prints
        if not self.stopped:
            params = tree_arrays("params/", self.learner.policy_params())
            save_npz(f"{self.dir}/model.npz", {**self.meta, "kind": "model"}, params)
            returns = self.eval_at(step, "final")
        summary = {"run_dir": self.dir, "global_step": step}
        if self.stopped:  # also during the final evaluation, which the checkpoint before it makes safe
            print(f"stopped by signal {self.stopped[0]} at step {step}; continue with --resume {self.dir}", flush=True)
            if self.stopped[0] == signal.SIGINT:
                raise KeyboardInterrupt
            return {**summary, "signal": self.stopped[0]}
        print(f"final eval at step {step}: {returns.mean():.2f} +- {returns.std():.2f}; run dir {self.dir}", flush=True)
        return {**summary, "eval_mean": float(returns.mean()), "sgd_steps": self.learner.sgd_steps}


def load_checkpoint(run_dir: str, learner: Learner, total: int):
    """(global step, episodes, whether an evaluation was cut short); loads the learner's state and replay."""
    path = os.path.join(run_dir, "checkpoint.npz")
    require(os.path.isfile(path), f"no such file: {path} (a run stopped before its first checkpoint: start anew)")
    meta, arrays = load_npz(path, "checkpoint")
    step, episodes = meta.get("global_step"), meta.get("episodes")
    require(all(type(v) is int and 0 <= v < 2**40 for v in (step, episodes)), f"{path}: bad counters in meta.json")
    learner.load_state_dict(arrays, path)
    was = meta["args"].get("total_timesteps") if isinstance(meta.get("args"), dict) else None
    note = "" if was in (None, total) else f"; any schedule over the budget ends at {total} steps, not {was}"
    rows = len(learner.replay)
    print(f"resumed {run_dir} at step {step} ({learner.sgd_steps} SGD steps, {rows} rows in the replay){note}")
    return step, episodes, meta.get("cut_short", meta.get("eval_missed")) is True  # eval_missed: f6a5972's name


def next_multiple(step: int, every: int):
    return (step // every + 1) * every if every else float("inf")


# <<< shared: harness
def warn(args: Args) -> None:
    """One line each, at the start, for settings that will not learn, or did not on CartPole (docs/dqn.md)."""
    sgd_steps, notes = sgd_budget(args), []
    if sgd_steps < args.updates_per_call:
        least = args.learning_starts + args.updates_per_call * args.train_frequency
        notes.append(
            f"no SGD step in this run (learning starts at {args.learning_starts}): give --total-timesteps {least}"
        )
    if args.tau == 1 and args.huber_delta <= 1 and args.target_network_frequency < 500:
        notes.append(
            f"the Huber loss with a target copy every {args.target_network_frequency} SGD steps did not learn at "
            "CleanRL's CartPole settings (docs/dqn.md): give --huber-delta 1e30 (its squared error) or a longer "
            "--target-network-frequency"
        )
    if args.huber_delta <= 1 and args.train_frequency >= 10 and sgd_steps < 35_000:
        notes.append(
            f"with the Huber loss, one SGD step per {args.train_frequency} env steps ({sgd_steps:,} in all) learned "
            "but fell back by the end at CleanRL's CartPole settings (docs/dqn.md): give --train-frequency 2, or "
            "CleanRL's squared error and period (--huber-delta 1e30 --target-network-frequency 50)"
        )
    for note in notes:
        print(f"warning: {note}", file=sys.stderr)


# ---------------------------------------------------------------------------------------------- CLI


def parse_args(argv=None) -> Args:
    """tyro's parse; --preset swaps in the preset's defaults, --resume the run's own flags, and any
    flag typed here wins over both. Where to write and what to send where come from here only."""
    argv = sys.argv[1:] if argv is None else list(argv)
    preset = None
    for token, after in zip(argv, argv[1:] + [None]):  # the last one wins, as in tyro
        preset = token[9:] if token.startswith("--preset=") else after if token == "--preset" else preset
    flags = {token.split("=")[0] for token in argv}
    fraction_typed = "--exploration-fraction" in flags and "--exploration-steps" not in flags
    fraction = {"exploration_steps": None} if fraction_typed else {}  # wins over a preset's or a run's steps
    default = Args(preset=preset, **PRESETS[preset]) if preset in PRESETS else Args()
    typed = tyro.cli(Args, args=argv, default=dataclasses.replace(default, **fraction))
    if typed.resume is None:
        return typed
    path = os.path.join(typed.resume, "args.json")
    require(os.path.isfile(path), f"--resume {typed.resume}: no args.json there (not a run folder of {SCRIPT}.py)")
    try:
        with open(path, "rb") as f:
            saved = json.loads(f.read())
    except (ValueError, RecursionError):
        raise ConfigError(f"{path} is not JSON") from None
    require(isinstance(saved, dict) and saved.get("script") == SCRIPT, f"{path}: not a run of {SCRIPT}.py")
    saved = args_from_json(saved.get("args"), path)
    require(preset in (None, saved.preset), f"--resume {typed.resume}: --preset cannot change on resume")
    args = tyro.cli(Args, args=argv, default=dataclasses.replace(saved, **fraction))
    sent = dict(track=typed.track, wandb_project_name=typed.wandb_project_name, wandb_entity=typed.wandb_entity)
    args = dataclasses.replace(args, resume=typed.resume, run_dir=typed.resume, **sent)  # W&B: as typed only
    require(
        ":" not in args.env_id or args.env_id == typed.env_id,
        f"{path}: env id {args.env_id!r} imports a module: type --env-id to confirm",
    )
    return args


def cli(argv=None) -> int:
    try:
        result = train(parse_args(argv))
    except (ConfigError, RunFailed) as e:
        print(f"{SCRIPT}.py: error: {' '.join(str(e).split())}", file=sys.stderr)  # arrays print over lines
        return 2 if isinstance(e, ConfigError) else 1
    except jax.errors.JaxRuntimeError as e:  # an out-of-memory the checks before allocating did not foresee
        if "RESOURCE_EXHAUSTED" not in str(e):
            raise
        print(f"{SCRIPT}.py: error: out of device memory: {first_line(e)}", file=sys.stderr)
        return 1
    except (MemoryError, OSError) as e:  # a folder that cannot be made, a full disk at a log tick, ...
        print(f"{SCRIPT}.py: error: {str(e) or 'out of memory (a smaller --buffer-size?)'}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # train() checkpointed first and said how to resume (a second Ctrl-C: at once)
        return 128 + signal.SIGINT
    return 128 + result["signal"] if "signal" in result else 0


if __name__ == "__main__":
    sys.exit(cli())
