"""Double DQN with prioritized experience replay and n-step returns, in one file.

What it implements
  * Double DQN (van Hasselt, Guez & Silver 2016, "Deep Reinforcement Learning with Double
    Q-learning", arXiv:1509.06461) on top of DQN (Mnih et al. 2015, Nature 518).
  * Proportional prioritized experience replay (Schaul, Quan, Antonoglou & Silver 2016,
    "Prioritized Experience Replay", arXiv:1511.05952), stored in cpprb.
  * n-step returns (Sutton 1988; used with PER in Rainbow, Hessel et al. 2018, arXiv:1710.02298).
  * An Acme-style learner (Hoffman et al. 2020, arXiv:2006.00979): a background thread samples
    batches and puts them on the device, K SGD steps are fused in one jitted call (a `lax.scan`;
    unrolled for convolutions on CPU, see make_update), and priorities are written back from
    another thread. With --num-devices N the SGD steps run data parallel on N local devices
    (replicated parameters, each batch split, gradients averaged; see learner_shardings).
  * For image observations: the Nature DQN network and preprocessing (Mnih et al. 2015) and a
    replay that stores each frame once (see "Pixels" below).

Update equations (one SGD step on a batch of B transitions i, each spanning k_i <= n steps)
  G_i      = sum_{j<k_i} gamma^j r_{t+j}                       (rewards optionally clipped)
  d_i      = gamma^{k_i} * (1 - terminated_i)                  (truncation still bootstraps)
  a*_i     = argmax_a Q(s'_i, a; theta)                         (online net selects ...)
  y_i      = G_i + d_i * Q(s'_i, a*_i; theta_target)           (... target net evaluates)
  delta_i  = y_i - Q(s_i, a_i; theta)
  L(theta) = (1/B) sum_i w_i * huber(delta_i)
  P(i)     = p_i^alpha / sum_j p_j^alpha,   p_i = |delta_i| + eps,  new transitions get max_j p_j
  w_i      = (N * P(i))^-beta / max_{j in minibatch} (N * P(j))^-beta
             normalised over the minibatch, as Acme and Dopamine do (--per-weight-norm batch).
             cpprb's own rule divides by the largest weight over the whole buffer, i.e. by the
             transition with the smallest priority: one transition fitted to |delta| ~ 0 then
             shrinks every weight, so the effective step size collapses and the gradient clip
             never acts; the minibatch rule learned CartPole-v1 sooner (README, Sampling).
  beta     annealed linearly from --per-beta0 to 1 over --total-timesteps.
  Sampling: each of the K minibatches of one fused call is its own stratified draw over the whole
             buffer (B strata of the total priority, the paper's rule per minibatch); see
             PrioritizedReplay._sample_rows for why one draw of K*B rows cut into K would be wrong.
             One K*B draw and a permutation would also mix the minibatches, and costs less, but
             keeps one draw's strata, not the paper's; the extra time runs on the prefetch thread
             (README, Sampling).
  theta_target <- tau * theta + (1 - tau) * theta_target   every --target-network-frequency SGD steps.

--no-prioritized runs exactly the same code with alpha = 0: every P(i) = 1/N and every w_i = 1,
which is uniform replay, so an ablation changes one number and nothing else.

Pixels (Atari)
  An env whose observation space is a uint8 image (not its name) gets the Nature DQN pipeline:
  84x84 grey frames stacked by 4 and the Nature CNN. ALE games also get gymnasium's
  AtariPreprocessing (up to 30 no-op actions at reset, each action held for 4 frames with the max
  over the last two) and episodes truncated at --max-episode-frames (108k frames, 30 minutes of
  play). For learning only, rewards are clipped to [-1, 1] and a lost life ends the return
  (--terminal-on-life-loss); logged and evaluated returns are the game's own score over whole
  games. Evaluation: epsilon 0.001 (tuned Double DQN's protocol, which the PER paper followed).
  ALE v5 keeps its sticky actions (repeat probability 0.25; Machado et al. 2018, arXiv:1709.06009),
  which the 2016 papers did not have.
  Memory: the replay keeps every frame once (FrameStore) and its rows keep frame numbers, not
  pixel stacks for obs and next_obs: about 8x less, so the PER paper's 1M-transition buffer fits
  in the RAM of a workstation (measured: README, DQN on Atari).
  --preset atari starts from the PER paper's hyper-parameters (ATARI_PRESET, each value with its
  source). On a CPU this is slow (README, DQN on Atari).

MinAtar (Young & Tian 2019, "MinAtar: An Atari-Inspired Testbed for Thorough and Reproducible
Reinforcement Learning Experiments", arXiv:1903.03176)
  Five Atari games on a 10x10 grid (python algos/dqn_prioritized.py --env-id MinAtar/Breakout-v1).
  Their observations, bool feature planes (10, 10, C), are recognised by their space: no
  preprocessing, no frame stack, kept in the replay as they are (1 byte per cell), and the
  network is the MinAtar paper's (QNetwork). --preset minatar starts from that paper's DQN
  hyper-parameters (MINATAR_PRESET), with prioritized replay and 3-step returns on top.

Map of this file
  Part 1, the algorithm: Args (the flags), ATARI_PRESET and MINATAR_PRESET, QNetwork, NStepAssembler,
  PrioritizedReplay, the learner (double_q_loss, make_update), acting (make_act) and train(),
  the loop. Part 2, the machinery, which a reader may skip: flag checks, envs and pixels
  (FrameStore), the prefetch and priority threads, devices, Run (run folder, resume, counters,
  logging, evaluations, checkpoints), evaluation and datasets, files, the command line.

Run
  python algos/dqn_prioritized.py                          # CartPole-v1, solves it (eval 500)
  python algos/dqn_prioritized.py --env-id Acrobot-v1 --seed 2
  python algos/dqn_prioritized.py --resume runs/<run>      # continue an interrupted run
  python algos/dqn_prioritized.py --eval-only --load runs/<run>/model.npz
  python algos/dqn_prioritized.py --save-dataset data/cartpole.hdf5   # offline data for BC
  python algos/dqn_prioritized.py --env-id ALE/Breakout-v5 --preset atari   # the PER paper's setup
  python algos/dqn_prioritized.py --env-id MinAtar/Breakout-v1 --preset minatar   # the MinAtar paper's DQN
  python algos/dqn_prioritized.py --env-id ALE/Breakout-v5 --preset atari --num-devices -1   # every GPU
  python algos/dqn_prioritized.py --capture-video --track  # eval videos, Weights & Biases (optional packages)
  python algos/dqn_prioritized.py --help                   # every flag

Outputs (runs/<env_id>__dqn_prioritized__<seed>__<unix_time>/)
  args.json, eval.csv (step, mean, std, episodes), tensorboard events with the tags
  charts/episodic_return, charts/episodic_length, charts/SPS, charts/epsilon, losses/td_loss,
  losses/q_values, eval/episodic_return(_std), replay/beta, replay/priority_max,
  replay/redrawn_rows (pixels: rows whose frames were overwritten, redrawn when sampled),
  perf/updates_per_second, perf/learner_wait_fraction; checkpoint.npz (latest, written
  atomically; every --checkpoint-every steps and --checkpoint-minutes; --keep-checkpoints K keeps
  the K - 1 before it as checkpoint-<step>.npz) and model.npz (final parameters): arrays and
  JSON, read without pickle; curve.png
  (eval and training returns, with matplotlib), videos/ (--capture-video), wandb/ (--track).
  Console: one refreshing progress line on a terminal, a plain line every 10 --log-every otherwise.
"""

from __future__ import annotations

import os

# Read by jax when it initialises its backend, so it must be set before `import jax`: without it
# a GPU run would grab 75% of the device memory up front.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import csv
import dataclasses
import functools
import importlib
import itertools
import json
import queue
import re
import shutil
import signal
import socket
import sys
import threading
import time
import typing
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Literal, NamedTuple, Optional, Tuple

import cpprb
import flax.linen as nn
import gymnasium as gym
import h5py
import jax
import jax.numpy as jnp
import numpy as np
import optax
import rlax
import tyro

SCRIPT = "dqn_prioritized"
CHECKPOINT_FORMAT = f"{SCRIPT}/2"  # 2: .npz and JSON (1 was a pickle)


# =============================================================================================
# PART 1: THE ALGORITHM
# Flags, network, n-step returns, prioritized replay, loss and update, acting, and the loop.
# =============================================================================================


@dataclass
class Args:
    # Algorithm
    env_id: str = "CartPole-v1"
    """gymnasium id of an environment with a Discrete action space; vector observations get the
    MLP, image observations (e.g. ALE/Breakout-v5) the Atari preprocessing and the Nature CNN"""
    preset: Optional[Literal["atari", "minatar"]] = None
    """'atari': start from the PER paper's Atari hyper-parameters (ATARI_PRESET below), 'minatar':
    from the MinAtar paper's DQN (MINATAR_PRESET), instead of these defaults; flags given
    alongside still override them (see --preset atari --help). Read by the command-line parser
    only: in code, write Args(**ATARI_PRESET, preset="atari", ...)"""
    seed: int = 1
    """seed of the training envs, the eval env, the network and the exploration"""
    total_timesteps: int = 100_000
    """environment steps, summed over all envs"""
    num_envs: int = 1
    """parallel environments (gymnasium's synchronous vector env)"""
    hidden_sizes: Tuple[int, ...] = (120, 84)
    """widths of the hidden layers of the MLP (after the convolutions for image observations)"""
    optimizer: Literal["adam", "rmsprop"] = "adam"
    """Adam, or centred RMSProp (the DQN papers' optimiser; --preset minatar)"""
    learning_rate: float = 1e-3
    """the optimiser's learning rate"""
    adam_eps: float = 1e-8
    """Adam's epsilon"""
    rmsprop_decay: float = 0.95
    """RMSProp: decay of the running averages of the gradient and its square"""
    rmsprop_eps: float = 0.01
    """RMSProp: added to the root of the centred second moment (outside the root, as torch does)"""
    anneal_lr: bool = True
    """decay the learning rate linearly to 0 over training, which steadies the final policy"""
    max_grad_norm: float = 10.0
    """clip the global gradient norm to this value"""
    batch_size: int = 128
    """transitions per SGD step"""
    gamma: float = 0.99
    """discount factor"""
    n_step: int = 3
    """steps per return; 1 is plain one-step Q-learning"""
    huber_delta: float = 1.0
    """Huber loss threshold; a large value gives the squared error"""
    clip_reward: Optional[float] = None
    """clip each per-step reward to [-c, c] before the n-step sum (the DQN paper used 1); the
    logged and evaluated returns are always the env's own"""
    terminal_on_life_loss: bool = True
    """for envs that report info["lives"] (ALE): a lost life ends the return for learning (no
    bootstrap) while the game plays on; evaluation always plays whole games"""
    max_episode_frames: int = 108_000
    """ALE only: emulator frames after which an episode is truncated (108k = 30 minutes)"""
    tau: float = 1.0
    """target-network update rate: 1 copies the online net, < 1 is a Polyak average"""
    target_network_frequency: int = 500
    """SGD steps between target-network updates"""
    learning_starts: int = 1_000
    """environment steps of pure collection before learning starts"""
    train_frequency: int = 2
    """environment steps per SGD step (the replay ratio's inverse), whatever --updates-per-call"""
    start_e: float = 1.0
    """initial exploration epsilon"""
    end_e: float = 0.05
    """final exploration epsilon"""
    exploration_fraction: float = 0.2
    """fraction of --total-timesteps over which epsilon decays linearly"""
    # Replay
    buffer_size: int = 50_000
    """replay capacity, in transitions"""
    prioritized: bool = True
    """prioritized replay; --no-prioritized samples uniformly through the same code (alpha = 0)"""
    per_alpha: float = 0.6
    """priority exponent alpha (0 is uniform)"""
    per_beta0: float = 0.4
    """initial importance-sampling exponent beta, annealed linearly to 1"""
    per_eps: float = 1e-6
    """added to |TD| so that no transition has zero probability"""
    per_weight_norm: Literal["batch", "buffer"] = "batch"
    """divide the IS weights by their largest value in the minibatch (Acme, Dopamine) or in the
    whole buffer (cpprb's rule, which a single well-fitted transition can shrink; see README)"""
    # Learner machinery
    updates_per_call: int = 32
    """SGD steps fused in one jitted call (lax.scan)"""
    prefetch_size: int = 2
    """batches of updates_per_call x batch_size the prefetch thread keeps ready on the device"""
    num_devices: int = 1
    """local devices the learner uses (-1: all): each SGD step's batch is split across them, the
    parameters are replicated and the gradients averaged (data parallel; see learner_shardings)"""
    # Run and output
    eval_every: int = 10_000
    """environment steps between evaluations"""
    eval_episodes: int = 10
    """episodes per evaluation (run in parallel)"""
    eval_epsilon: float = 0.0
    """epsilon of the evaluation policy"""
    checkpoint_every: int = 50_000
    """environment steps between checkpoints (0: none by steps; --checkpoint-minutes still applies)"""
    checkpoint_minutes: float = 30.0
    """also checkpoint when this many minutes have passed since the last one (0: only by steps)"""
    keep_checkpoints: int = 1
    """complete checkpoints kept: checkpoint.npz (the newest) and the K - 1 before it as
    checkpoint-<step>.npz; older ones are removed only once a newer one is complete"""
    checkpoint_replay: bool = True
    """include the replay buffer and its priorities in checkpoints"""
    log_every: int = 1_000
    """environment steps between tensorboard scalars; the console line is every 10 of these"""
    run_dir: Optional[str] = None
    """output folder; default runs/<env_id>__dqn_prioritized__<seed>__<unix_time>"""
    capture_video: bool = False
    """film the first episode of each evaluation to RUN_DIR/videos/*.mp4 (needs moviepy)"""
    track: bool = False
    """log the scalars, flags and videos of a training run to Weights & Biases too (needs wandb)"""
    wandb_project_name: str = "jax-offpolicy-rl"
    """W&B project for --track"""
    wandb_entity: Optional[str] = None
    """W&B team or user for --track (None: wandb's default entity)"""
    resume: Optional[str] = None
    """run folder to continue from its checkpoint.npz (its args.json is reused; flags typed
    here override it; a larger --total-timesteps re-stretches the schedules, see README)"""
    eval_only: bool = False
    """evaluate the parameters in --load and exit"""
    load: Optional[str] = None
    """model.npz or checkpoint.npz (or a run folder) to evaluate with --eval-only"""
    save_dataset: Optional[str] = None
    """after training (or with --eval-only), write rollouts of the policy to this .hdf5 file in
    D4RL's layout, for algos/bc_offline.py"""
    dataset_episodes: int = 20
    """episodes in the --save-dataset file"""
    dataset_epsilon: float = 0.0
    """epsilon of the policy that collects the dataset (0: expert data; larger: noisier data)"""


# --preset atari: the proportional variant of the PER paper (Schaul et al. 2016, Appendix B),
# which kept the rest of tuned Double DQN (van Hasselt et al. 2016), itself Nature DQN (Mnih et
# al. 2015) with a few changes. One agent step is 4 frames.
ATARI_PRESET = dict(
    total_timesteps=50_000_000,  # 200M frames, as in all three papers
    buffer_size=1_000_000,  # Nature DQN's replay memory
    learning_rate=6.25e-5,  # PER: tuned Double DQN's 2.5e-4 / 4 ("step-size reduced by 4")
    anneal_lr=False,  # all three papers: constant step size
    adam_eps=1.5e-4,  # the papers used RMSProp; Adam at this lr and eps is Rainbow's
    batch_size=32,  # Nature DQN
    train_frequency=4,  # Nature DQN: one update per 4 agent steps
    learning_starts=50_000,  # Nature DQN's replay start size
    target_network_frequency=7_500,  # tuned Double DQN: a copy every 30k agent steps = 7.5k updates
    n_step=1,  # the PER paper used one-step targets (Rainbow: 3)
    clip_reward=1.0,  # Nature DQN
    hidden_sizes=(512,),  # Nature DQN's fully connected layer
    end_e=0.01,  # tuned Double DQN (Nature: 0.1) ...
    exploration_fraction=0.02,  # ... reached after 1M agent steps (of 50M)
    eval_epsilon=0.001,  # tuned Double DQN's evaluation epsilon (Nature: 0.05)
    eval_every=250_000,  # 1M frames
    eval_episodes=8,
    checkpoint_every=1_000_000,  # a checkpoint with replay is ~7 GB: not too often
    log_every=10_000,
)  # per_alpha 0.6, per_beta0 0.4 -> 1, gamma 0.99, Huber delta 1, 4-frame stacks: the defaults


# --preset minatar: the DQN of the MinAtar paper (Young & Tian 2019, arXiv:1903.03176), as its
# code has it (MinAtar's examples/dqn.py). MinAtar has no frame skip: one step is one frame; it
# keeps sticky actions itself (probability 0.1, its default). Prioritized replay and 3-step
# returns stay on, as everywhere in this script; --no-prioritized --n-step 1 is the paper's
# uniform one-step replay (with double Q-learning, which this script always uses).
MINATAR_PRESET = dict(
    total_timesteps=5_000_000,  # 5M frames, the paper's budget
    buffer_size=100_000,  # replay memory size
    learning_starts=5_000,  # replay start size (random policy before it)
    batch_size=32,  # minibatch size
    train_frequency=1,  # one update per frame
    target_network_frequency=1_000,  # a copy every 1,000 frames, which are 1,000 updates here
    start_e=1.0,
    end_e=0.1,  # epsilon 1.0 -> 0.1 ...
    exploration_fraction=0.02,  # ... over 100k frames = 2% of 5M (the paper counts them from replay start)
    gamma=0.99,  # discount
    optimizer="rmsprop",  # centred RMSProp (torch.optim.RMSprop, centered=True) ...
    learning_rate=2.5e-4,  # ... step size 0.00025 ...
    rmsprop_decay=0.95,  # ... squared-gradient momentum 0.95 ...
    rmsprop_eps=0.01,  # ... minimum squared gradient 0.01 (torch adds it outside the root)
    anneal_lr=False,  # constant step size
    hidden_sizes=(128,),  # one hidden layer of 128 units after the convolution
    eval_every=100_000,
    eval_episodes=10,
    checkpoint_every=500_000,
    log_every=10_000,
)  # Huber loss (delta 1), no reward clipping, no frame stack: as the defaults have it
PRESETS = {"atari": ATARI_PRESET, "minatar": MINATAR_PRESET}


# ---------------------------------------------------------------------------------------------
# Network
# ---------------------------------------------------------------------------------------------


class QNetwork(nn.Module):
    """Q(s, .): an MLP on vectors; on stacked frames [B, stack, H, W] the convolutions of the Nature
    DQN (Mnih et al. 2015: 32 8x8 /4, 64 4x4 /2, 64 3x3 /1, then 512 units with --preset atari);
    with planes=True, on MinAtar's feature planes [B, H, W, C] the network of the MinAtar paper's
    DQN (Young & Tian 2019: one 3x3 convolution with 16 filters, stride 1, then 128 units with
    --preset minatar)."""

    num_actions: int
    hidden_sizes: Tuple[int, ...]
    planes: bool = False

    @nn.compact
    def __call__(self, obs: jax.Array) -> jax.Array:
        if self.planes:
            x = nn.relu(nn.Conv(16, (3, 3), (1, 1), padding="VALID")(obs.astype(jnp.float32)))
            x = x.reshape((x.shape[0], -1))
        elif obs.ndim == 4:
            # uint8 in, scaled here: the replay and the device transfer carry bytes, not floats.
            x = jnp.transpose(obs, (0, 2, 3, 1)).astype(jnp.float32) / 255.0
            for features, kernel, stride in ((32, 8, 4), (64, 4, 2), (64, 3, 1)):
                x = nn.relu(nn.Conv(features, (kernel, kernel), (stride, stride), padding="VALID")(x))
            x = x.reshape((x.shape[0], -1))
        else:
            x = obs.astype(jnp.float32)
        for width in self.hidden_sizes:
            x = nn.relu(nn.Dense(width)(x))
        return nn.Dense(self.num_actions)(x)


# ---------------------------------------------------------------------------------------------
# Replay: n-step assembly and the prioritized buffer
# ---------------------------------------------------------------------------------------------


class NStepAssembler:
    """Turns per-step transitions of num_envs parallel streams into n-step transitions.

    Each env keeps its last n (obs, action, reward) in a ring. A step emits, per env:
      * nothing while fewer than n steps are pending and the episode goes on;
      * the oldest pending step, with the return over n rewards, next_obs = the obs after this
        step and discount gamma^n, once n are pending;
      * every pending step when the episode ends, each with its own k <= n rewards, next_obs =
        the real final observation, and discount gamma^k if the episode was truncated (the state
        was not terminal, so the return still bootstraps) or 0 if it terminated.
    """

    def __init__(self, n: int, gamma: float, num_envs: int, obs_shape, obs_dtype, clip_reward: Optional[float] = None):
        self.n, self.clip_reward = n, clip_reward
        self.powers = gamma ** np.arange(n + 1, dtype=np.float64)
        self.obs = np.zeros((n, num_envs) + tuple(obs_shape), obs_dtype)
        self.action = np.zeros((n, num_envs), np.int64)
        self.reward = np.zeros((n, num_envs), np.float32)
        self.pending = np.zeros(num_envs, np.int64)
        self.all_full = False  # every env has n pending steps: the common case, kept cheap
        self.t = 0  # steps pushed so far; step s lives in ring slot s % n
        # Ring slots from oldest to newest when the oldest is in slot i: rows of this table.
        self.oldest_first = (np.arange(n)[:, None] + np.arange(n)) % n
        self.n_step_discount = np.full(num_envs, self.powers[n], np.float32)

    def _emit(self, envs, ages: np.ndarray, next_obs: np.ndarray, terminated: np.ndarray) -> dict:
        """Transitions of `envs` that started `ages` steps before the latest step."""
        first = self.t - 1 - ages
        k = ages + 1  # rewards in each transition
        offsets = np.arange(self.n)
        rewards = self.reward[(first[:, None] + offsets) % self.n, np.reshape(envs, (-1, 1))]
        ret = np.where(offsets < k[:, None], rewards * self.powers[: self.n], 0.0).sum(axis=1)
        return {
            "obs": self.obs[first % self.n, envs],
            "action": self.action[first % self.n, envs],
            "reward": ret.astype(np.float32),
            "next_obs": next_obs,
            "discount": (self.powers[k] * (1.0 - terminated)).astype(np.float32),
        }

    def push(self, obs, action, reward, next_obs, terminated, truncated) -> Optional[dict]:
        """Add one vector step; next_obs must hold the real final observation where done.

        The arrays returned may be views of the ring: copy them before the next push.
        """
        if self.clip_reward is not None:
            reward = np.clip(reward, -self.clip_reward, self.clip_reward)
        slot = self.t % self.n
        self.obs[slot], self.action[slot], self.reward[slot] = obs, action, reward
        self.t += 1
        done = terminated | truncated
        if self.all_full and not done.any():
            # Every env emits its oldest step: no per-env indexing (this runs every step).
            oldest = self.t % self.n
            ret = self.powers[: self.n] @ self.reward[self.oldest_first[oldest]]
            return {
                "obs": self.obs[oldest],
                "action": self.action[oldest],
                "reward": ret.astype(np.float32),
                "next_obs": next_obs,
                "discount": self.n_step_discount,
            }
        np.minimum(self.pending + 1, self.n, out=self.pending)
        full = (self.pending == self.n) & ~done
        parts = []
        if full.any():
            envs = np.flatnonzero(full)
            parts.append(self._emit(envs, np.full(envs.size, self.n - 1), next_obs[envs], np.zeros(envs.size)))
        if done.any():
            ended = np.flatnonzero(done)
            envs = np.repeat(ended, self.pending[ended])
            ages = np.concatenate([np.arange(self.pending[i]) for i in ended])
            parts.append(self._emit(envs, ages, next_obs[envs], terminated[envs].astype(np.float64)))
            self.pending[ended] = 0
        self.all_full = bool((self.pending == self.n).all())
        if len(parts) < 2:
            return parts[0] if parts else None
        return {key: np.concatenate([p[key] for p in parts]) for key in parts[0]}


class PrioritizedReplay:
    """Proportional prioritized replay (Schaul et al. 2016) on cpprb's PrioritizedReplayBuffer.

    The PER rules, and where they are:
      * new transitions enter with p = max_j p_j                                   (flush)
      * P(i) = p_i^alpha / sum_j p_j^alpha, one stratified draw of B per minibatch (_sample_rows)
      * w_i = (N P(i))^-beta / max_{j in minibatch} w_j                            (sample)
      * after learning, p_i = |delta_i| + eps                                      (update_priorities)
    cpprb keeps the sum tree, adds eps and raises to alpha. The rest of the class makes it safe
    for the three threads that touch it:

    * One lock serialises inserts (main thread), sampling (prefetch thread) and priority updates
      (writer thread); cpprb itself is not thread-safe.
    * Inserts are staged in numpy and handed to cpprb in chunks: one cpprb call costs about as
      much as 150 rows copied inside it, so row-by-row inserts would dominate the acting loop.
    * write_count[slot] counts how often a slot has been overwritten. A sample remembers the
      counts it saw; its priorities are written back only where the count has not moved, so a
      |TD| computed for an old transition never lands on the new one that replaced it.
    * priority[slot] mirrors the raw priorities that went into cpprb, which cannot read them
      back, so a checkpoint can save and restore them.
    """

    STAGE_ROWS = 128

    def __init__(
        self,
        capacity: int,
        obs_shape,
        obs_dtype,
        alpha: float,
        eps: float,
        frames: Optional[FrameStore] = None,
        weight_norm: str = "batch",
    ):
        self.capacity, self.frames, self.weight_norm = capacity, frames, weight_norm
        if frames is not None:  # rows hold the frame numbers of the two stacks
            obs_shape, obs_dtype = (FRAME_STACK,), np.int64
        shapes = {"obs": tuple(obs_shape), "next_obs": tuple(obs_shape), "action": (), "reward": (), "discount": ()}
        dtypes = {
            "obs": obs_dtype,
            "next_obs": obs_dtype,
            "action": np.int64,
            "reward": np.float32,
            "discount": np.float32,
        }
        spec = {k: {"shape": shapes[k] or 1, "dtype": dtypes[k]} for k in shapes}  # cpprb: 1, not ()
        self.buffer = cpprb.PrioritizedReplayBuffer(capacity, spec, alpha=alpha, eps=eps)
        self.lock = threading.Lock()
        self.write_count = np.zeros(capacity, np.int64)
        self.priority = np.zeros(capacity, np.float64)
        self.beta = 0.4  # set by the main loop; read by whoever samples
        self.stage = {k: np.zeros((self.STAGE_ROWS,) + shapes[k], dtypes[k]) for k in shapes}
        self.staged = 0
        self.redrawn = 0

    def add(self, batch: Optional[dict]) -> None:
        if batch is None:
            return
        rows = len(batch["action"])
        start = 0
        while start < rows:
            take = min(rows - start, self.STAGE_ROWS - self.staged)
            for key, column in self.stage.items():
                column[self.staged : self.staged + take] = batch[key][start : start + take]
            self.staged += take
            start += take
            if self.staged == self.STAGE_ROWS:
                self.flush()

    def flush(self) -> None:
        """Hand staged rows to cpprb at the current max priority: p_new = max_j p_j (the paper's
        rule for new data, so that each is replayed at least once soon)."""
        if not self.staged:
            return
        rows = {key: column[: self.staged] for key, column in self.stage.items()}
        with self.lock:
            slots = (self.buffer.get_next_index() + np.arange(self.staged)) % self.capacity
            self.buffer.add(**rows)
            np.add.at(self.write_count, slots, 1)
            self.priority[slots] = self.buffer.get_max_priority()
        self.staged = 0

    def _sample_rows(self, batch_size: int, num_batches: int, beta: float) -> Tuple[dict, np.ndarray, np.ndarray]:
        # PER's stratified sampling is per minibatch: "to sample a minibatch of size k, the range
        # [0, p_total] is divided equally into k ranges" (Schaul et al. 2016, B.2.1). cpprb
        # stratifies the draws of one call, so a single call of K*B rows cut into K minibatches
        # would give minibatch k only the k-th 1/K of the priority mass: a thin slice of time.
        # One call per minibatch, all under one lock so that the K see one tree.
        with self.lock:
            draws = []
            for _ in range(num_batches):
                draw = self.buffer.sample(batch_size, beta=beta)
                # cpprb returns indexes and weights in arrays that its next sample() overwrites.
                draw["indexes"], draw["weights"] = draw["indexes"].astype(np.int64), draw["weights"].copy()
                draws.append(draw)
            batch = {key: np.concatenate([d[key] for d in draws]) for key in draws[0]}
            indexes = batch.pop("indexes")
            stamps = self.write_count[indexes]
        batch["action"] = batch["action"].reshape(-1)
        for key in ("reward", "discount", "weights"):
            batch[key] = batch[key].reshape(-1).astype(np.float32)
        return batch, indexes, stamps

    def sample(self, batch_size: int, num_batches: int = 1) -> Tuple[dict, np.ndarray, np.ndarray]:
        """num_batches minibatches of batch_size rows, each a stratified sample of the whole
        buffer, flat: minibatch k is rows [k B, (k+1) B). Returns (batch with IS 'weights', slot
        indexes, their write counts) at the current beta.

        With a FrameStore the frame numbers become pixels here, on the prefetch thread
        (FrameStore.decode; a row whose frames were overwritten is redrawn, counted in
        self.redrawn)."""
        beta = self.beta  # one beta for the whole call, redraws included
        batch, indexes, stamps = self._sample_rows(batch_size, num_batches, beta)
        if self.frames is not None:
            self.redrawn += self.frames.decode(batch, indexes, stamps, lambda rows: self._sample_rows(rows, 1, beta))
        if self.weight_norm == "batch":  # w_i / max_{j in minibatch} w_j (cpprb's rule: the buffer's)
            weights = batch["weights"].reshape(num_batches, batch_size)
            batch["weights"] = (weights / weights.max(axis=1, keepdims=True)).reshape(-1)
        return batch, indexes, stamps

    def update_priorities(self, indexes: np.ndarray, stamps: np.ndarray, priorities: np.ndarray) -> int:
        """p_i = |delta_i| (+ eps, by cpprb), where the slot still holds the sampled transition;
        returns the rows kept."""
        # One negative or non-finite priority turns every sum in cpprb's tree into NaN, after which
        # each draw returns slot 0 with NaN weights: refuse it before it gets there.
        if not np.all(np.isfinite(priorities) & (priorities >= 0)):
            raise ValueError("priorities must be finite and >= 0")
        with self.lock:
            fresh = self.write_count[indexes] == stamps
            if fresh.any():
                self.buffer.update_priorities(indexes[fresh], priorities[fresh])
                self.priority[indexes[fresh]] = priorities[fresh]
        return int(fresh.sum())

    def max_priority(self) -> float:
        with self.lock:
            return float(self.buffer.get_max_priority())

    def state_dict(self) -> dict:
        """Flat arrays, named as in the checkpoint file."""
        self.flush()
        with self.lock:
            stored = self.buffer.get_stored_size()
            rows = (
                self.buffer.get_all_transitions()
                if stored
                else {
                    key: np.zeros((0,) + (column.shape[1:] or (1,)), column.dtype) for key, column in self.stage.items()
                }
            )
            state = {f"replay/{k}": v for k, v in rows.items()}
            state.update(
                {
                    "replay/priority": self.priority[:stored].copy(),
                    "replay/next_index": np.asarray(self.buffer.get_next_index(), np.int64),
                    "replay/max_priority": np.asarray(self.buffer.get_max_priority(), np.float64),
                }
            )
        if self.frames is not None:
            state.update(self.frames.state_dict())
        return state

    def load_state_dict(self, arrays: dict, path: str) -> None:
        """Check every array against this replay's layout (the file may be hostile), then rebuild
        cpprb slot by slot, so that indexes, priorities and the insert position all match."""
        prio = arrays.get("replay/priority")
        stored = len(prio) if isinstance(prio, np.ndarray) and prio.ndim == 1 else -1
        if not 0 <= stored <= self.capacity:
            raise ConfigError(f"{path}: replay/priority is not a vector of at most --buffer-size {self.capacity} rows")
        check_array(arrays, "replay/priority", (stored,), np.float64, path)
        k = int(check_array(arrays, "replay/next_index", (), np.int64, path))
        max_priority = float(check_array(arrays, "replay/max_priority", (), np.float64, path))
        if not (
            np.isfinite(prio).all()
            and (prio >= 0).all()
            and np.isfinite(max_priority)
            and max_priority > 0
            and 0 <= k < self.capacity
            and (k == stored or stored == self.capacity)
        ):
            raise ConfigError(f"{path}: the replay's priorities or insert position are out of range")
        data = {}
        for key, column in self.stage.items():
            # cpprb hands back scalar columns as [rows, 1]
            data[key] = check_array(arrays, f"replay/{key}", (stored,) + (column.shape[1:] or (1,)), column.dtype, path)
        if self.frames is not None:
            self.frames.load_state_dict(arrays, path)
            numbers = np.concatenate([data["obs"].ravel(), data["next_obs"].ravel()])
            if stored and (numbers.min() < 0 or numbers.max() >= self.frames.written):
                raise ConfigError(f"{path}: the replay names frames that were never written")
        with self.lock:
            self.buffer.clear()
            if stored:
                self.buffer.add(**data, priorities=prio)
                if stored == self.capacity and k:
                    # Full buffer: rewrite slots [0, k) with the same rows so that the next
                    # insert overwrites the oldest transition, as it would have.
                    self.buffer.add(**{key: v[:k] for key, v in data.items()}, priorities=prio[:k])
                # cpprb only ever raises its max priority: raise it on slot 0 to the saved max,
                # then put slot 0's own priority back.
                self.buffer.update_priorities(np.array([0]), np.array([max_priority]))
                self.buffer.update_priorities(np.array([0]), prio[:1])
                self.priority[:stored] = prio
            self.write_count[:] = 0
        self.staged = 0


# ---------------------------------------------------------------------------------------------
# Learner
# ---------------------------------------------------------------------------------------------


class TrainState(NamedTuple):
    params: Any
    target_params: Any
    opt_state: Any
    sgd_steps: jax.Array


def make_optimizer(args: Args, total_sgd_steps: int) -> optax.GradientTransformation:
    lr = (
        optax.linear_schedule(args.learning_rate, 0.0, max(total_sgd_steps, 1))
        if args.anneal_lr
        else args.learning_rate
    )
    if args.optimizer == "rmsprop":  # torch's centred RMSprop: eps outside the root, moments from 0
        step = optax.rmsprop(lr, decay=args.rmsprop_decay, eps=args.rmsprop_eps, centered=True, eps_in_sqrt=False)
    else:
        step = optax.adam(lr, eps=args.adam_eps)
    return optax.chain(optax.clip_by_global_norm(args.max_grad_norm), step)


def double_q_loss(q_apply, params, target_params, batch: dict, huber_delta: float):
    """IS-weighted Huber loss of double-Q TD errors; returns (loss, (td, mean Q(s, a)))."""
    q_tm1 = q_apply(params, batch["obs"])
    # The online net at s' only selects a*: no gradient flows there (rlax stops it as well), and a
    # forward pass of its own keeps s' out of the backward pass: cheaper on CPU than one pass
    # over s and s' together (README, Design notes).
    q_t_selector = q_apply(jax.lax.stop_gradient(params), batch["next_obs"])
    q_t_value = q_apply(target_params, batch["next_obs"])
    td = jax.vmap(rlax.double_q_learning)(
        q_tm1, batch["action"], batch["reward"], batch["discount"], q_t_value, q_t_selector
    )
    loss = jnp.mean(batch["weights"] * rlax.huber_loss(td, huber_delta))
    q_taken = jnp.take_along_axis(q_tm1, batch["action"][:, None], axis=1)
    return loss, (td, q_taken.mean())


def make_update(q_apply, optimizer, args: Args, unroll: bool = False):
    """jit(state, batches[K, B, ...]) -> (state, metrics, |TD|[K, B]): K SGD steps in one call.

    The K steps are a lax.scan, or with unroll=True K copies of the step in one program. Unrolling
    is for convolutions on CPU: XLA's CPU backend runs them slower inside a loop (several times for
    the Nature CNN, less for MinAtar's; README), at the price of a compile time that grows with K.
    The state must be on the devices of learner_shardings(args) (jax.device_put(state,
    shardings.replicated)).
    """
    shardings = learner_shardings(args)

    def sgd_step(state: TrainState, batch: dict):
        grad_fn = jax.value_and_grad(double_q_loss, argnums=1, has_aux=True)
        (loss, (td, q_mean)), grads = grad_fn(q_apply, state.params, state.target_params, batch, args.huber_delta)
        updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        sgd_steps = state.sgd_steps + 1
        target_params = optax.periodic_update(
            optax.incremental_update(params, state.target_params, args.tau),
            state.target_params,
            sgd_steps,
            args.target_network_frequency,
        )
        # A step whose new parameters are not finite reports NaN priorities, so the priority
        # writer stops the run here rather than one call later (after a checkpoint, maybe).
        td = jnp.where(jnp.isfinite(optax.global_norm(params)), td, jnp.nan)
        return TrainState(params, target_params, opt_state, sgd_steps), (loss, q_mean, td)

    def update(state: TrainState, batches: dict):
        if unroll:
            steps = []
            for k in range(batches["action"].shape[0]):
                state, out = sgd_step(state, jax.tree_util.tree_map(lambda x, k=k: x[k], batches))
                steps.append(out)
            loss, q_mean, td = (jnp.stack(column) for column in zip(*steps))
        else:
            state, (loss, q_mean, td) = jax.lax.scan(sgd_step, state, batches)
        return state, {"losses/td_loss": loss.mean(), "losses/q_values": q_mean.mean()}, jnp.abs(td)

    return jax.jit(
        update,
        donate_argnums=0,
        in_shardings=(shardings.replicated, shardings.batch),
        out_shardings=(shardings.replicated, shardings.replicated, shardings.batch),
    )


def init_train_state(network: QNetwork, optimizer, obs_shape, key) -> TrainState:
    params = network.init(key, jnp.zeros((1,) + tuple(obs_shape), jnp.float32))
    # A copy, not the same arrays: the update donates its input state, and one buffer cannot be
    # donated twice.
    target_params = jax.tree_util.tree_map(jnp.copy, params)
    return TrainState(params, target_params, optimizer.init(params), jnp.zeros((), jnp.int32))


# ---------------------------------------------------------------------------------------------
# Acting
# ---------------------------------------------------------------------------------------------


def make_act(q_apply, num_actions: int):
    """jit(params, obs[N], epsilon, key, step) -> actions[N], epsilon-greedy.

    One uniform u per env decides both things: explore if u < epsilon, and then u / epsilon is
    itself uniform on [0, 1) and picks the random action. The key is fold_in(key, step), so no
    key has to be carried out of the call. On CPU the PRNG, not the network, dominates this
    call, so drawing once instead of three times matters.
    """

    def act(params, obs, epsilon, key, step):
        u = jax.random.uniform(jax.random.fold_in(key, step), (obs.shape[0],))
        greedy = jnp.argmax(q_apply(params, obs), axis=-1)
        random = jnp.minimum((u / epsilon * num_actions).astype(greedy.dtype), num_actions - 1)
        return jnp.where(u < epsilon, random, greedy)

    return jax.jit(act)


def linear_schedule(start: float, end: float, duration: float, t: float) -> float:
    """start -> end linearly over `duration`, then end."""
    return end + (start - end) * max(0.0, 1.0 - t / duration)


# ---------------------------------------------------------------------------------------------
# Training loop
# ---------------------------------------------------------------------------------------------


def train(args: Args) -> dict:
    """Train with checked flags (main() checks them and merges a --resume run's own). Returns
    {run_dir, global_step, eval_mean, sgd_steps}, or {..., signal} when a signal stopped it."""
    # The learner's devices (one by default): parameters replicated, each batch split across them.
    shardings = learner_shardings(args)
    env_fn = functools.partial(make_env, args.env_id, max_episode_frames=args.max_episode_frames)
    envs = env_fn(args.num_envs)
    num_actions, obs_space = int(envs.single_action_space.n), envs.single_observation_space
    network = QNetwork(num_actions, args.hidden_sizes, planes=is_planes(obs_space))
    optimizer = make_optimizer(args, max(0, args.total_timesteps - args.learning_starts) // args.train_frequency)
    key, init_key = jax.random.split(jax.random.PRNGKey(args.seed))
    state = init_train_state(network, optimizer, obs_space.shape, init_key)
    replay, nstep = make_replay(args, obs_space)
    act = make_act(network.apply, num_actions)
    # Convolutions (Nature CNN, MinAtar's) run faster unrolled than in a scan on CPU: see make_update.
    update = make_update(
        network.apply, optimizer, args, unroll=len(obs_space.shape) == 3 and jax.default_backend() == "cpu"
    )
    # The run folder, a --resume checkpoint, logging, the prefetch and priority threads, signals,
    # evaluations and checkpoints: Part 2. The loop below is the algorithm.
    run = Run(args, envs, env_fn, replay, act, shardings)
    state, key = run.restore(state, key)
    with run:
        obs = run.reset()
        while run.global_step < args.total_timesteps and not run.stopped:
            # ACT: epsilon-greedy, epsilon decaying linearly over exploration_fraction of the run
            epsilon = linear_schedule(
                args.start_e, args.end_e, args.exploration_fraction * args.total_timesteps, run.global_step
            )
            actions = np.asarray(act(run.act_params, obs, np.float32(epsilon), key, np.int32(run.global_step)))
            next_obs, reward, terminated, truncated, info = envs.step(actions)

            # STORE: the n-step transition. Its next observation is the one the step really led
            # to (info["final_obs"] at an episode's end); only `terminated` (or a lost life) ends
            # the return, a time-limit truncation bootstraps. Pixels become frame numbers.
            stored_obs, stored_next, ends_return = run.to_replay(next_obs, terminated, truncated, info)
            replay.add(nstep.push(stored_obs, actions, reward, stored_next, ends_return, truncated))
            obs = next_obs
            run.count_step(reward, terminated | truncated)

            # LEARN: one SGD step per train_frequency env steps, K of them fused per jitted call;
            # the batches come from the prefetch thread, the priorities go back on another thread.
            for _ in range(run.update_calls_due()):
                replay.beta = linear_schedule(args.per_beta0, 1.0, args.total_timesteps, run.global_step)
                batches, indexes, stamps = run.next_batches()
                state, metrics, priorities = update(state, batches)
                run.learned(state, metrics, indexes, stamps, priorities)

            run.log_if_due(epsilon)
            run.evaluate_if_due()
            run.checkpoint_if_due(state, key)
    return run.finish(state, key)


# =============================================================================================
# PART 2: THE MACHINERY
# What makes the loop above a dependable program: a reader learning the algorithm can stop
# here. Flag checks, envs and pixels, threads, devices, the run (folder, resume, logging,
# evaluation, checkpoints), files, and the command line.
# =============================================================================================


# ---------------------------------------------------------------------------------------------
# Errors and flag checks
# ---------------------------------------------------------------------------------------------


class ConfigError(Exception):
    """Bad input from the user: reported as one line, without a traceback."""


class RunFailed(Exception):
    """The run cannot go on (a checkpoint that cannot be written, divergence): one line, exit 1."""


class Diverged(RunFailed):
    """The learner produced a non-finite TD error or parameters: one line, naming the SGD step."""


def check_args(args: Args, packages: bool = True) -> None:
    """One ConfigError for the first bad flag. packages=False skips the optional packages of
    --capture-video and --track: flags read from a file need them only where this process acts on
    them (a model's flags for --eval-only do not; a resumed run's merged flags are checked with)."""
    positive = (
        "total_timesteps",
        "num_envs",
        "buffer_size",
        "batch_size",
        "n_step",
        "target_network_frequency",
        "train_frequency",
        "updates_per_call",
        "prefetch_size",
        "eval_every",
        "eval_episodes",
        "log_every",
    )
    for name in positive:
        if getattr(args, name) <= 0:
            raise ConfigError(f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}")
    if not args.hidden_sizes or min(args.hidden_sizes) <= 0 or max(args.hidden_sizes) > 65_536:
        raise ConfigError(f"--hidden-sizes must be widths in 1..65536, got {args.hidden_sizes}")
    for flag in dataclasses.fields(Args):  # NaN passes every comparison below
        value = getattr(args, flag.name)
        if isinstance(value, float) and not np.isfinite(value):
            raise ConfigError(f"--{flag.name.replace('_', '-')} must be a finite number, got {value}")
    if args.batch_size > args.buffer_size:
        raise ConfigError(f"--batch-size {args.batch_size} is larger than --buffer-size {args.buffer_size}")
    if args.learning_starts < args.batch_size:
        raise ConfigError(f"--learning-starts {args.learning_starts} must be at least --batch-size {args.batch_size}")
    for name in ("gamma", "tau", "exploration_fraction"):
        if not 0.0 < getattr(args, name) <= 1.0:
            raise ConfigError(f"--{name.replace('_', '-')} must be in (0, 1], got {getattr(args, name)}")
    for name in ("start_e", "end_e", "eval_epsilon", "per_beta0", "dataset_epsilon"):
        if not 0.0 <= getattr(args, name) <= 1.0:
            raise ConfigError(f"--{name.replace('_', '-')} must be in [0, 1], got {getattr(args, name)}")
    if not 0.0 < args.rmsprop_decay < 1.0:
        raise ConfigError(f"--rmsprop-decay must be in (0, 1), got {args.rmsprop_decay}")
    for name in (
        "learning_rate",
        "adam_eps",
        "rmsprop_eps",
        "max_grad_norm",
        "huber_delta",
        "per_eps",
        "max_episode_frames",
    ):
        if getattr(args, name) <= 0:
            raise ConfigError(f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}")
    if args.per_alpha < 0:
        raise ConfigError(f"--per-alpha must be >= 0, got {args.per_alpha}")
    if args.checkpoint_every < 0 or args.learning_starts < 0 or args.checkpoint_minutes < 0:
        raise ConfigError("--checkpoint-every, --checkpoint-minutes and --learning-starts must be >= 0")
    if args.keep_checkpoints < 1:
        raise ConfigError(f"--keep-checkpoints must be at least 1, got {args.keep_checkpoints}")
    if args.num_devices == 0 or args.num_devices < -1:
        raise ConfigError(f"--num-devices must be positive or -1 (all local devices), got {args.num_devices}")
    if args.clip_reward is not None and args.clip_reward <= 0:
        raise ConfigError(f"--clip-reward must be positive, got {args.clip_reward}")
    if args.dataset_episodes <= 0:
        raise ConfigError(f"--dataset-episodes must be positive, got {args.dataset_episodes}")
    if args.eval_only and not args.load:
        raise ConfigError("--eval-only needs --load PATH (a model.npz or checkpoint.npz)")
    if packages and args.capture_video and not importable("moviepy"):
        raise ConfigError("--capture-video needs moviepy: pip install moviepy (its imageio-ffmpeg wheel ships ffmpeg)")
    if packages and args.track and not importable("wandb"):
        raise ConfigError("--track needs wandb: pip install wandb")


def importable(name: str) -> bool:
    try:
        importlib.import_module(name)
    except ImportError:
        return False
    return True


# ---------------------------------------------------------------------------------------------
# Environment and pixels
# ---------------------------------------------------------------------------------------------

FRAME_STACK = 4  # frames per image observation (Nature DQN)


def is_planes(space: gym.Space) -> bool:
    """MinAtar's observations: bool feature planes (H, W, C), channels last, one channel per kind
    of object; told apart by the observation space, never by the env's name. They are the
    state itself (trails included), so they get no preprocessing and no frame stack."""
    return isinstance(space, gym.spaces.Box) and space.dtype == np.bool_ and len(space.shape) == 3


def is_image(space: gym.Space) -> bool:
    """Grey (H, W) or RGB (H, W, 3) uint8 images; told apart from vectors by the observation
    space, never by the env's name."""
    return (
        isinstance(space, gym.spaces.Box)
        and space.dtype == np.uint8
        and (len(space.shape) == 2 or (len(space.shape) == 3 and space.shape[2] == 3))
    )


def image_pipeline(probe: gym.Env, max_episode_frames: int) -> Tuple[list, dict]:
    """(wrappers, env kwargs) giving 84x84 grey frames stacked by 4 (Nature DQN). ALE games get
    gymnasium's AtariPreprocessing: up to 30 no-op actions at reset, each action repeated for 4
    frames with the max of the last two (Atari sprites flicker), grey and resized; the wrapper
    skips the frames, so the game itself must not. Lives are read from info["lives"] by the
    training loop instead of the wrapper's terminal_on_life_loss, which would reset the whole
    game at every lost life under autoreset. Other image envs are only made grey, resized and
    stacked."""
    from gymnasium import wrappers

    stack = functools.partial(wrappers.FrameStackObservation, stack_size=FRAME_STACK)
    if hasattr(probe.unwrapped, "ale"):
        preprocess = functools.partial(wrappers.AtariPreprocessing, noop_max=30, frame_skip=4, screen_size=84)
        return [preprocess, stack], {"frameskip": 1, "max_num_frames_per_episode": max_episode_frames}
    grey = [wrappers.GrayscaleObservation] if len(probe.observation_space.shape) == 3 else []
    return grey + [functools.partial(wrappers.ResizeObservation, shape=(84, 84)), stack], {}


def make_env(
    env_id: str, num_envs: int, max_episode_frames: int = 108_000, video: Optional[Tuple[str, str]] = None
) -> gym.vector.VectorEnv:
    """A synchronous vector env in SAME_STEP autoreset mode, checked for what DQN can handle;
    with video = (folder, prefix), sub-env 0 films its first episode (see film_first_episode).

    SAME_STEP: the step that ends an episode returns the first observation of the next one and
    puts the real last observation in info["final_obs"]. The default (NEXT_STEP) would instead
    spend one extra step per episode on a reset whose transition must be thrown away.
    """
    try:
        import ale_py  # ALE ids are registered by importing ale_py (gymnasium 1.x has no plugins)

        gym.register_envs(ale_py)
    except ImportError:
        pass
    if env_id.startswith("MinAtar/") and env_id not in gym.registry:
        if not importable("minatar.gym"):
            raise ConfigError(f"{env_id} needs MinAtar: pip install minatar")
        import minatar.gym  # its ids are registered when asked to (gymnasium 1.x has no plugins)

        minatar.gym.register_envs()
    try:
        probe = gym.make(env_id)
    except gym.error.Error as e:
        raise ConfigError(f"cannot make env {env_id!r}: {e}") from None
    try:
        action_space, space = probe.action_space, probe.observation_space
        if not isinstance(action_space, gym.spaces.Discrete):
            raise ConfigError(
                f"{env_id} has a {type(action_space).__name__} action space; "
                "DQN needs Discrete actions (use algos/sac.py for continuous control)"
            )
        wrappers, kwargs = [], {}
        if is_image(space):
            wrappers, kwargs = image_pipeline(probe, max_episode_frames)
        elif not is_planes(space) and (not isinstance(space, gym.spaces.Box) or len(space.shape) != 1):
            raise ConfigError(
                f"{env_id} has observations {space}; this script takes flat vectors or uint8 images, "
                "(H, W) or (H, W, 3), or bool feature planes (H, W, C)"
            )
    finally:
        probe.close()
    if video is not None:
        wrappers, kwargs = wrappers + [film_first_episode(*video)], {**kwargs, "render_mode": "rgb_array"}
    return gym.make_vec(
        env_id,
        num_envs=num_envs,
        vectorization_mode="sync",
        wrappers=wrappers,
        vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP},
        **kwargs,
    )


def film_first_episode(folder: str, prefix: str) -> Callable[[gym.Env], gym.Env]:
    """A make_vec wrapper that films the first episode of the first sub-env it wraps (make_vec
    builds sub-env 0 first) with gymnasium's RecordVideo, into video_file((folder, prefix)); the
    env must render rgb_array frames. RecordVideo films the reset frame and one frame per step of
    the wrapper it sits in (ALE: one per 4 emulator frames, behind the frame skip)."""
    if sys.platform.startswith("linux") and not os.environ.get("DISPLAY"):
        # Headless: MuJoCo needs EGL (glfw and osmesa failed without a display), and pygame's
        # renderers open an SDL display even for rgb_array (SDL prints an error line without one).
        os.environ.setdefault("MUJOCO_GL", "egl")
        os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
    filmed = []

    def wrap(env: gym.Env) -> gym.Env:
        if filmed:
            return env
        filmed.append(True)
        with warnings.catch_warnings():  # the folder exists from the previous evaluation, its files stay
            warnings.filterwarnings("ignore", message=".*Overwriting existing videos")
            return gym.wrappers.RecordVideo(
                env, folder, episode_trigger=lambda episode: episode == 0, name_prefix=prefix
            )

    return wrap


def video_file(video: Tuple[str, str]) -> str:
    """The file RecordVideo writes for episode 0 of film_first_episode(folder, prefix)."""
    folder, prefix = video
    return os.path.join(folder, f"{prefix}-episode-0.mp4")


def seed_envs(envs: gym.vector.VectorEnv, seed: int) -> np.ndarray:
    """Reset with seeds seed, seed+1, ... (one per sub-env) and seed the action space."""
    envs.action_space.seed(seed)
    obs, _ = envs.reset(seed=seed)
    return obs


def lost_life(info: dict, lives: Optional[np.ndarray], done: np.ndarray) -> Tuple[np.ndarray, Optional[np.ndarray]]:
    """(envs whose game lost a life this step without ending, the lives now). The count of a
    finished env is already the next game's, so done envs never count as a loss."""
    if "lives" not in info:
        return np.zeros_like(done), None
    now = np.asarray(info["lives"])
    return (now < lives) & ~done if lives is not None else np.zeros_like(done), now


def real_next_obs(next_obs: np.ndarray, done: np.ndarray, info: dict) -> np.ndarray:
    """The observation each step really led to. In SAME_STEP mode a finished env's next_obs is
    already the reset of its next episode; the last observation is in info["final_obs"]."""
    if not done.any():
        return next_obs
    real = next_obs.copy()
    for i in np.flatnonzero(done):
        real[i] = info["final_obs"][i]
    return real


class FrameStore:
    """Image observations kept once per frame; the replay rows hold frame numbers.

    A stacked observation shares 3 of its 4 frames with the next one, and s'_t is s_{t+1}, so
    storing obs and next_obs as pixels keeps every frame 8 times (56 KB per 84x84 transition).
    Here each frame is written once into a ring, frame number f in slot f % capacity, and the
    n-step assembler and cpprb carry the 4 frame numbers of obs and next_obs instead of pixels
    (64 bytes). Per env step one frame is written (the newest of the stack the step led to); a
    new episode writes all frames of its first stack, so a stack is exact whatever its padding.
    n-step, several envs and episode ends need nothing special: every stored stack names its
    own frames. (cpprb's own stack_compress and next_of would need consecutive rows to be
    consecutive steps of one env, and next_of yields s_{t+1}, not the s_{t+n} of an n-step row.)

    The ring holds a margin beyond the replay's capacity because new episodes write extra
    frames. A row whose oldest frame has been overwritten anyway (many very short episodes) is
    detected when read, never returned: `written` is advanced before a frame is copied in, so a
    reader that checks it after its copy knows which frames could have changed underneath it.
    """

    def __init__(self, capacity: int, num_envs: int, frame_shape):
        self.capacity = capacity
        self.frames = np.zeros((capacity,) + tuple(frame_shape), np.uint8)  # pages fill as written
        self.written = 0
        self.stack = np.zeros((num_envs, FRAME_STACK), np.int64)  # frame numbers of each env's obs

    @staticmethod
    def capacity_for(buffer_size: int, num_envs: int, n_step: int, stage_rows: int) -> int:
        """Frames for `buffer_size` rows: one per row, 10% for the extra frames of new episodes
        (episodes of 40+ steps), and the frames of stacks written before their rows reach cpprb
        (the n-step delay and the rows staged before an insert)."""
        return buffer_size + buffer_size // 10 + FRAME_STACK * num_envs * (n_step + 2) + stage_rows

    def _write(self, frames: np.ndarray) -> np.ndarray:
        numbers = self.written + np.arange(len(frames))
        self.written += len(frames)  # first: a concurrent reader must treat these slots as changing
        self.frames[numbers % self.capacity] = frames
        return numbers

    def start(self, obs: np.ndarray, envs: np.ndarray) -> None:
        """New episodes in `envs` begin with observations obs[envs]."""
        numbers = self._write(obs[envs].reshape((-1,) + self.frames.shape[1:]))
        self.stack[envs] = numbers.reshape(len(envs), FRAME_STACK)

    def step(self, real_next_obs: np.ndarray, next_obs: np.ndarray, done: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
        """Frame numbers of (the stacks each step led to, the stacks the envs now show): they
        differ where an episode ended and the env has already reset."""
        newest = self._write(real_next_obs[:, -1])
        reached = np.concatenate([self.stack[:, 1:], newest[:, None]], axis=1)
        self.stack = reached.copy()
        if done.any():
            self.start(next_obs, np.flatnonzero(done))
        return reached, self.stack.copy()

    def read(self, numbers: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
        """(frames of each stack of frame numbers [..., stack], whether each stack is intact)."""
        pixels = self.frames[numbers % self.capacity]
        intact = numbers.min(axis=-1) >= self.written - self.capacity
        return pixels, intact

    def decode(self, batch: dict, indexes: np.ndarray, stamps: np.ndarray, draw: Callable) -> int:
        """Replace the frame numbers of batch["obs"] and batch["next_obs"] by their pixels, in
        place. A row whose frames were overwritten since is replaced by a fresh row from
        draw(rows) -> (rows, indexes, stamps), its slot and write count too, until every row is
        intact. Returns the rows redrawn."""
        obs, obs_ok = self.read(batch["obs"])
        next_obs, next_ok = self.read(batch["next_obs"])
        bad, redrawn = np.flatnonzero(~(obs_ok & next_ok)), 0
        while bad.size:
            # Row by row: redrawing whole minibatches would rarely succeed once a few percent of
            # rows are stale. A redrawn row's cpprb weight is relative to the smallest priority at
            # its own draw, which a flush in between can change (not measured).
            redrawn += bad.size
            fresh, indexes[bad], stamps[bad] = draw(bad.size)
            for key, column in fresh.items():
                batch[key][bad] = column
            obs[bad], obs_ok = self.read(fresh["obs"])
            next_obs[bad], next_ok = self.read(fresh["next_obs"])
            bad = bad[~(obs_ok & next_ok)]
        batch["obs"], batch["next_obs"] = obs, next_obs
        return redrawn

    def state_dict(self) -> dict:
        return {
            "replay/frames": self.frames[: min(self.written, self.capacity)],
            "replay/frames_written": np.asarray(self.written, np.int64),
        }

    def load_state_dict(self, arrays: dict, path: str) -> None:
        written = int(check_array(arrays, "replay/frames_written", (), np.int64, path))
        kept = min(written, self.capacity)
        if written < 0:
            raise ConfigError(f"{path}: replay/frames_written is negative")
        self.frames[:kept] = check_array(arrays, "replay/frames", (kept,) + self.frames.shape[1:], np.uint8, path)
        self.written = written


# ---------------------------------------------------------------------------------------------
# Replay plumbing
# ---------------------------------------------------------------------------------------------


def make_replay(args: Args, obs_space: gym.spaces.Box) -> Tuple[PrioritizedReplay, NStepAssembler]:
    """The prioritized replay and the n-step assembler that feeds it. make_env gives flat vectors,
    bool feature planes (kept as they are: 1 byte per cell) or stacks of frames; stacks go through
    a FrameStore, so the rows and the assembler carry frame numbers instead of pixels."""
    frames = None
    if len(obs_space.shape) == 3 and not is_planes(obs_space):
        capacity = FrameStore.capacity_for(args.buffer_size, args.num_envs, args.n_step, PrioritizedReplay.STAGE_ROWS)
        frames = FrameStore(capacity, args.num_envs, obs_space.shape[1:])
    alpha = args.per_alpha if args.prioritized else 0.0
    replay = PrioritizedReplay(
        args.buffer_size, obs_space.shape, obs_space.dtype, alpha, args.per_eps, frames, args.per_weight_norm
    )
    stored = replay.stage["obs"]  # what a row keeps of an observation: the obs, or frame numbers
    nstep = NStepAssembler(args.n_step, args.gamma, args.num_envs, stored.shape[1:], stored.dtype, args.clip_reward)
    return replay, nstep


def sample_batches(replay, batch_size: int, num_batches: int, sharding: Optional[jax.sharding.Sharding] = None):
    """What the learner gets for one call: (batches[K, B, ...] on the device(s), slot indexes[K * B],
    write counts). Runs on the prefetch thread, so the device transfer is off the learner's path
    too; with several devices each gets its own slice of B here (Shardings.batch)."""
    batch, indexes, stamps = replay.sample(batch_size, num_batches)
    batch = {k: v.reshape((num_batches, batch_size) + v.shape[1:]) for k, v in batch.items()}
    return jax.device_put(batch, sharding), indexes, stamps


def next_multiple(step: int, every: int) -> Optional[int]:
    """The first multiple of `every` after `step`; None (never) when every is 0."""
    return (step // every + 1) * every if every else None


# ---------------------------------------------------------------------------------------------
# Prefetch and priority write-back threads
# ---------------------------------------------------------------------------------------------


class Prefetcher:
    """Samples ahead on a background thread and puts the batches on the device (as Acme does).

    The learner then only waits when sampling is slower than learning; perf/learner_wait_fraction
    measures that. An exception in the thread is re-raised by the next get().
    """

    def __init__(self, produce: Callable[[], Any], size: int):
        self._produce = produce
        self._queue: queue.Queue = queue.Queue(maxsize=size)
        self._stop = threading.Event()
        self._error: Optional[BaseException] = None
        self._thread = threading.Thread(target=self._run, name="prefetch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                item = self._produce()
                while not self._stop.is_set():
                    try:
                        self._queue.put(item, timeout=0.05)
                        break
                    except queue.Full:
                        pass
        except BaseException as e:  # handed to the consumer, who re-raises it
            self._error = e
            self._stop.set()

    def get(self) -> Any:
        while True:
            try:
                return self._queue.get(timeout=0.05)
            except queue.Empty:
                if self._error is not None:
                    raise RuntimeError(f"prefetch thread failed: {self._error!r}") from self._error
                if self._stop.is_set():
                    raise RuntimeError("prefetcher is closed") from None

    def close(self) -> None:
        self._stop.set()
        self._thread.join()


class PriorityWriter:
    """Writes |TD| back into the replay on a background thread, and stops the run on a
    non-finite one (with uniform replay too: it only checks then).

    Reading the priorities waits for the learner's computation, so doing it here keeps that wait
    (and the lock) off the acting loop. flush() blocks until everything submitted is written.
    """

    def __init__(self, replay: PrioritizedReplay, write: bool = True):
        self._replay, self._write = replay, write
        self._queue: queue.Queue = queue.Queue()
        self._error: Optional[BaseException] = None
        self._thread = threading.Thread(target=self._run, name="priority-writer", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is None:
                    return
                indexes, stamps, priorities, first_step = item
                priorities = np.asarray(priorities, np.float64)  # [K, B]: waits for the learner
                finite = np.isfinite(priorities).all(axis=1)
                if not finite.all():
                    raise Diverged(
                        f"the learner diverged: non-finite TD error or parameters at SGD step "
                        f"{first_step + int(np.argmin(finite)) + 1}; try a lower --learning-rate"
                    )
                if self._write:
                    self._replay.update_priorities(indexes, stamps, priorities.reshape(-1))
            except BaseException as e:
                self._error = self._error or e  # the first one is the one to report
            finally:
                self._queue.task_done()

    def submit(self, indexes: np.ndarray, stamps: np.ndarray, priorities: jax.Array, first_step: int) -> None:
        """Queue the |TD|[K, B] of the K SGD steps after SGD step first_step."""
        self._raise()
        self._queue.put((indexes, stamps, priorities, first_step))

    def flush(self) -> None:
        self._queue.join()
        self._raise()

    def _raise(self) -> None:
        if isinstance(self._error, Diverged):
            raise self._error
        if self._error is not None:
            raise RuntimeError(f"priority writer failed: {self._error!r}") from self._error

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join()


# ---------------------------------------------------------------------------------------------
# Devices
# ---------------------------------------------------------------------------------------------


class Shardings(NamedTuple):
    replicated: jax.sharding.NamedSharding  # train state: a whole copy on every device
    batch: jax.sharding.NamedSharding  # batches[K, B, ...] and |TD|[K, B]: split along B


def learner_shardings(args: Args) -> Shardings:
    """Data-parallel SGD over --num-devices local devices, as Acme's learners do with pmap.

    Written the current JAX way: jit with these shardings on its inputs and outputs partitions
    the update itself. Each device computes the loss terms of its slice of the batch, the mean in
    the loss becomes per-device sums and one all-reduce, so the gradient is the whole batch's and
    every device applies the same update to its copy: the one-device result up to the order of
    float additions (tests/test_multidevice.py). With one device this is plain jit.
    """
    devices = jax.local_devices()
    n = len(devices) if args.num_devices == -1 else args.num_devices
    if n > len(devices):
        raise ConfigError(
            f"--num-devices {n}, but this machine has {len(devices)}: {', '.join(str(d) for d in devices)}"
        )
    if args.batch_size % n:
        raise ConfigError(f"--batch-size {args.batch_size} does not split evenly over {n} devices")
    mesh = jax.sharding.Mesh(np.array(devices[:n]), ("devices",))
    return Shardings(
        jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec()),
        jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(None, "devices")),
    )


def local_copy(tree):
    """One device's copy of a replicated state, without a transfer (a view of its buffers), for
    acting: a policy call on the replicated arrays would run on every device (measured: README).
    Take it again after each update: the update donates the state whose buffers it shares."""
    return jax.tree_util.tree_map(lambda x: x.addressable_shards[0].data, tree)


# ---------------------------------------------------------------------------------------------
# The run: folder, resume, counters, threads, logging, evaluations, checkpoints
# ---------------------------------------------------------------------------------------------


class Run:
    """Everything train() needs besides the algorithm: the run folder and args.json, a --resume
    checkpoint, the step counters, the observations the replay keeps (frame numbers for pixels),
    the prefetch and priority-writer threads, the devices, logging and the progress line,
    evaluations, checkpoints, and Ctrl-C / SIGTERM (`with run:` stops the threads however the
    loop ends)."""

    def __init__(self, args: Args, envs, env_fn, replay: PrioritizedReplay, act, shardings: Shardings):
        self.args, self.envs, self.env_fn, self.replay, self.act = args, envs, env_fn, replay, act
        self.frames, self.shardings = replay.frames, shardings
        self.global_step = self.episodes = 0
        # SGD steps due = sgd_base + (global_step - learn_from) // train_frequency: learning starts
        # once the replay holds learning_starts rows, and again after a resume whose replay was not
        # checkpointed (the updates of the waiting steps are skipped, not replayed in one burst).
        self.sgd_base, self.learn_from = 0, args.learning_starts
        self.prefetcher: Optional[Prefetcher] = None
        self.stop = StopRequest()
        self.metrics: dict = {}
        self.last_eval: Optional[str] = None

    @property
    def stopped(self) -> bool:
        return self.stop.signum is not None

    def restore(self, state: TrainState, key):
        """(state, key) of the --resume checkpoint, or the fresh ones given; then the run folder,
        the logger and the counters. The state goes on the learner's devices."""
        args = self.args
        if args.resume:
            ckpt = os.path.join(args.resume, "checkpoint.npz")
            meta, arrays = load_npz(ckpt, "checkpoint")
            state = restore_tree(state, arrays, "train_state/", ckpt)
            key = jnp.asarray(check_array(arrays, "key", (2,), np.uint32, ckpt))
            self.global_step, self.episodes = (
                saved_count(meta, "global_step", ckpt),
                saved_count(meta, "episodes", ckpt),
            )
            if any(name.startswith("replay/") for name in arrays):
                self.replay.load_state_dict(arrays, ckpt)
            rows = self.replay.buffer.get_stored_size()
            if rows < args.learning_starts:
                self.sgd_base, self.learn_from = int(state.sgd_steps), self.global_step + args.learning_starts - rows
            note = (
                f"; learning waits for {self.learn_from - self.global_step} new rows"
                if self.learn_from > self.global_step
                else ""
            )
            saved_total = meta["args"].get("total_timesteps") if isinstance(meta.get("args"), dict) else None
            if saved_total not in (None, args.total_timesteps):
                note += f"; the schedules now run to --total-timesteps {args.total_timesteps}, not {saved_total}"
            print(
                f"resumed {args.resume} at step {self.global_step} ({int(state.sgd_steps)} SGD steps, "
                f"{rows} rows in the replay){note}"
            )
        state = jax.device_put(state, self.shardings.replicated)  # a checkpoint holds one copy, whatever N wrote it
        self.act_params = local_copy(state.params)
        self.sgd_done = int(state.sgd_steps)

        self.run_dir = args.run_dir or os.path.join(
            "runs", f"{args.env_id.replace('/', '-')}__{SCRIPT}__{args.seed}__{int(time.time())}"
        )
        os.makedirs(self.run_dir, exist_ok=True)
        for name in os.listdir(self.run_dir):
            # A write that a kill cut short (the file it was replacing is whole), and on a fresh
            # start the kept checkpoints of an earlier run in this folder, which would mix with ours.
            if ".tmp." in name or (not args.resume and re.fullmatch(r"checkpoint-\d+\.npz", name)):
                os.remove(os.path.join(self.run_dir, name))
        write_atomic(
            os.path.join(self.run_dir, "args.json"),
            lambda f: f.write(json.dumps({"script": SCRIPT, "args": dataclasses.asdict(args)}, indent=2).encode()),
        )
        # On resume, eval.csv keeps the rows up to the checkpoint (a finished run's final
        # evaluation is done again, so its row goes too).
        step = self.global_step
        self.logger = Logger(
            self.run_dir, (step if step < args.total_timesteps else step - 1) if args.resume else None, args
        )
        self.meta = {"format": CHECKPOINT_FORMAT, "script": SCRIPT, "args": dataclasses.asdict(args)}
        self.saved = {"step": step if args.resume else None, "time": time.monotonic()}  # the newest checkpoint
        self.window = {"time": time.perf_counter(), "step": step, "sgd": self.sgd_done, "wait": 0.0, "learn": 0.0}
        self.next_eval, self.next_log = next_multiple(step, args.eval_every), next_multiple(step, args.log_every)
        self.next_ckpt = next_multiple(step, args.checkpoint_every)
        self.console = Console(args.total_timesteps, step, "steps")
        self.ep_return, self.ep_length = np.zeros(args.num_envs), np.zeros(args.num_envs, np.int64)
        self.lives = None
        self.writer = PriorityWriter(self.replay, write=args.prioritized)  # with alpha = 0 a write changes nothing
        return state, key

    def reset(self) -> np.ndarray:
        """First observations. The envs restart on resume (their state is not checkpointed); the
        seed moves with the step so that a resumed run does not replay the episodes it began with."""
        obs = seed_envs(self.envs, self.args.seed + self.global_step)
        if self.frames is not None:
            self.frames.start(obs, np.arange(self.args.num_envs))
        self.stored_obs = obs if self.frames is None else self.frames.stack.copy()
        return obs

    def to_replay(self, next_obs, terminated, truncated, info) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(what the replay keeps of the observation before the step, and of the one the step led
        to, whether the step ended the return): observations, or for pixels the frame numbers of
        their stacks; `terminated`, or with --terminal-on-life-loss also a lost life (ALE)."""
        done = terminated | truncated
        reached = real_next_obs(next_obs, done, info)
        if self.frames is None:
            stored_reached, stored_next = reached, next_obs
        else:
            stored_reached, stored_next = self.frames.step(reached, next_obs, done)
        ends_return = terminated
        if self.args.terminal_on_life_loss and "lives" in info:  # ALE; other envs pay nothing per step
            lost, self.lives = lost_life(info, self.lives, done)
            ends_return = terminated | lost
        stored_obs, self.stored_obs = self.stored_obs, stored_next
        return stored_obs, stored_reached, ends_return

    def count_step(self, reward: np.ndarray, done: np.ndarray) -> None:
        self.global_step += self.args.num_envs
        self.ep_return += reward
        self.ep_length += 1
        if done.any():
            for i in np.flatnonzero(done):
                self.episodes += 1
                self.logger.scalars(
                    self.global_step,
                    {"charts/episodic_return": self.ep_return[i], "charts/episodic_length": self.ep_length[i]},
                )
            self.ep_return[done], self.ep_length[done] = 0.0, 0

    def update_calls_due(self) -> int:
        """Jitted update calls (of --updates-per-call SGD steps) due at this step: the replay ratio
        is one SGD step per --train-frequency env steps after learning starts."""
        sgd_due = self.sgd_base + max(0, self.global_step - self.learn_from) // self.args.train_frequency
        return (sgd_due - self.sgd_done) // self.args.updates_per_call

    def next_batches(self):
        """(batches[K, B, ...] on the devices, slot indexes, write counts) from the prefetch thread,
        which starts at the first call (so its first draws see the beta train() set); the staged
        inserts reach cpprb first."""
        args = self.args
        self.replay.flush()
        if self.prefetcher is None:
            self.prefetcher = Prefetcher(
                functools.partial(
                    sample_batches, self.replay, args.batch_size, args.updates_per_call, self.shardings.batch
                ),
                args.prefetch_size,
            )
        self.t0 = time.perf_counter()
        batches = self.prefetcher.get()
        self.window["wait"] += time.perf_counter() - self.t0
        return batches

    def learned(self, state: TrainState, metrics: dict, indexes, stamps, priorities) -> None:
        """After an update call: queue its priorities for the writer thread, take the acting copy
        of the new parameters."""
        self.writer.submit(indexes, stamps, priorities, self.sgd_done)
        self.window["learn"] += time.perf_counter() - self.t0
        self.sgd_done += self.args.updates_per_call
        self.metrics = metrics
        self.act_params = local_copy(state.params)

    def log_if_due(self, epsilon: float) -> None:
        args, step = self.args, self.global_step
        if step < self.next_log:
            return
        self.next_log += args.log_every
        now = time.perf_counter()
        window, elapsed = self.window, now - self.window["time"]
        scalars = {
            "charts/SPS": (step - window["step"]) / elapsed,
            "charts/epsilon": epsilon,
            "replay/beta": self.replay.beta,
            "replay/priority_max": self.replay.max_priority(),
            "perf/updates_per_second": (self.sgd_done - window["sgd"]) / elapsed,
        }
        if window["learn"] > 0:
            scalars["perf/learner_wait_fraction"] = window["wait"] / window["learn"]
        if self.frames is not None:
            scalars["replay/redrawn_rows"] = self.replay.redrawn
        scalars.update({k: float(v) for k, v in self.metrics.items()})
        self.logger.scalars(step, scalars)
        self.logger.flush()
        fields = (
            f"eps {epsilon:.3f}  loss {scalars.get('losses/td_loss', float('nan')):.4f}  "
            f"episodes {self.episodes}  eval {self.last_eval if self.last_eval is not None else '-'}"
        )
        plain = step % (10 * args.log_every) < args.num_envs or step >= args.total_timesteps
        line = f"step {step:>8d}  SPS {scalars['charts/SPS']:7.0f}  {fields}"
        self.console.update(step, scalars["charts/SPS"], fields, line if plain else None)
        window.update(time=now, step=step, sgd=self.sgd_done, wait=0.0, learn=0.0)

    def evaluate(self, prefix: str) -> np.ndarray:
        video = (os.path.join(self.run_dir, "videos"), prefix) if self.args.capture_video else None
        returns = evaluate(
            self.act,
            self.act_params,
            self.env_fn,
            self.args.eval_episodes,
            self.args.eval_epsilon,
            self.args.seed + 10_000,
            video,
        )
        self.logger.eval(self.global_step, returns, video)
        self.last_eval = f"{returns.mean():.1f}"
        return returns

    def evaluate_if_due(self) -> None:
        if self.next_eval <= self.global_step < self.args.total_timesteps:  # the final one comes in finish()
            self.next_eval += self.args.eval_every
            self.evaluate(f"eval-step-{self.global_step}")

    def checkpoint(self, state: TrainState, key) -> None:
        self.writer.flush()
        arrays = {**tree_arrays("train_state/", state), "key": np.asarray(key)}
        if self.args.checkpoint_replay:
            arrays.update(self.replay.state_dict())
        save_checkpoint(
            self.run_dir,
            {**self.meta, "kind": "checkpoint", "global_step": self.global_step, "episodes": self.episodes},
            arrays,
            self.global_step,
            self.saved["step"],
            self.args.keep_checkpoints,
        )
        self.saved.update(step=self.global_step, time=time.monotonic())

    def checkpoint_if_due(self, state: TrainState, key) -> None:
        args = self.args
        if (self.next_ckpt is not None and self.global_step >= self.next_ckpt) or (
            args.checkpoint_minutes and time.monotonic() - self.saved["time"] >= 60 * args.checkpoint_minutes
        ):
            self.next_ckpt = next_multiple(self.global_step, args.checkpoint_every)
            self.checkpoint(state, key)

    def __enter__(self):
        try:
            self.stop.__enter__()
        except BaseException:  # e.g. signal handlers can only be set from the main thread
            self.close()
            raise
        return self

    def __exit__(self, *exc):
        self.stop.__exit__(*exc)
        self.close()
        if exc[0] is not None:  # finish() will not run: write out the events since the last tick
            self.logger.close()

    def close(self) -> None:
        """Stop the threads and close the envs (the writer writes what was submitted first)."""
        self.console.end()
        if self.prefetcher is not None:
            self.prefetcher.close()
        self.writer.close()  # writes what was submitted; its error, if any, is raised by checkpoint()
        self.envs.close()

    def finish(self, state: TrainState, key) -> dict:
        """The last checkpoint; then, unless a signal stopped the run, model.npz, the final
        evaluation, curve.png and the --save-dataset file."""
        self.checkpoint(state, key)
        run_dir, step = self.run_dir, self.global_step
        if self.stopped:
            self.logger.close()
            print(f"stopped by signal {self.stop.signum} at step {step}; continue with --resume {run_dir}", flush=True)
            return {"run_dir": run_dir, "global_step": step, "signal": self.stop.signum}
        save_npz_atomic(
            os.path.join(run_dir, "model.npz"), {**self.meta, "kind": "model"}, tree_arrays("params/", state.params)
        )
        returns = self.evaluate(f"final-step-{step}")
        self.logger.close()
        write_curve(run_dir)
        if self.args.save_dataset:
            save_dataset(self.args.save_dataset, self.act, self.act_params, self.env_fn, self.args)
        print(f"final eval at step {step}: {returns.mean():.2f} +- {returns.std():.2f}; run dir {run_dir}", flush=True)
        return {
            "run_dir": run_dir,
            "global_step": step,
            "eval_mean": float(returns.mean()),
            "sgd_steps": int(state.sgd_steps),
        }


# ---------------------------------------------------------------------------------------------
# Evaluation and datasets
# ---------------------------------------------------------------------------------------------


def rollout(
    act,
    params,
    env_fn: Callable[..., gym.vector.VectorEnv],
    episodes: int,
    epsilon: float,
    seed: int,
    record: bool = False,
    video: Optional[Tuple[str, str]] = None,
) -> Tuple[np.ndarray, Optional[dict]]:
    """Returns of `episodes` episodes, run as parallel envs (each contributes its first episode),
    and with record=True their transitions in D4RL's flat layout, episode after episode; with
    video = (folder, prefix) the first episode is filmed to video_file(video).

    The same seeds every time, so successive evaluations differ only by the policy.
    """
    envs = env_fn(episodes, video=video)
    try:
        obs = seed_envs(envs, seed)
        key = jax.random.PRNGKey(seed)
        returns = np.zeros(episodes)
        running = np.ones(episodes, bool)
        steps = []
        while running.any():
            actions = np.asarray(act(params, obs, np.float32(epsilon), key, np.int32(len(steps))))
            next_obs, reward, terminated, truncated, info = envs.step(actions)
            steps.append(
                (
                    running.copy(),
                    obs,
                    actions,
                    reward,
                    real_next_obs(next_obs, terminated | truncated, info) if record else None,
                    terminated,
                    truncated,
                )
            )
            returns += reward * running
            running &= ~(terminated | truncated)
            obs = next_obs
        if not record:
            return returns, None
        columns = [np.stack(c) for c in zip(*steps)]  # each [T, episodes, ...]
        live = columns[0]
        names = ("observations", "actions", "rewards", "next_observations", "terminals", "timeouts")
        return returns, {
            name: np.concatenate([col[live[:, i], i] for i in range(episodes)]) for name, col in zip(names, columns[1:])
        }
    finally:
        envs.close()


def evaluate(
    act, params, env_fn, episodes: int, epsilon: float, seed: int, video: Optional[Tuple[str, str]] = None
) -> np.ndarray:
    """Returns of whole episodes in the env's own rewards: unclipped, lives do not end them."""
    return rollout(act, params, env_fn, episodes, epsilon, seed, video=video)[0]


def save_dataset(path: str, act, params, env_fn, args: Args) -> dict:
    """Rollouts of the policy (epsilon = --dataset-epsilon) in D4RL's HDF5 layout, with the
    reference returns of the normalised score in metadata/: ref_min from the uniformly random
    policy (epsilon = 1), ref_max from the greedy policy itself. Written atomically."""
    seed = args.seed + 20_000
    returns, data = rollout(act, params, env_fn, args.dataset_episodes, args.dataset_epsilon, seed, record=True)
    ref_min = float(evaluate(act, params, env_fn, args.dataset_episodes, 1.0, seed).mean())
    ref_max = float(evaluate(act, params, env_fn, args.dataset_episodes, 0.0, seed).mean())
    metadata = {
        "env_id": args.env_id,
        "algorithm": f"{SCRIPT}.py",
        "dataset_epsilon": args.dataset_epsilon,
        "episodes": args.dataset_episodes,
        "seed": seed,
        "ref_min_score": ref_min,
        "ref_max_score": ref_max,
        "mean_return": float(returns.mean()),
    }
    tmp = f"{path}.tmp.{os.getpid()}"
    with h5py.File(tmp, "w") as f:
        for name, values in data.items():
            f.create_dataset(name, data=values, compression="gzip")
        group = f.create_group("metadata")
        for name, value in metadata.items():
            group.attrs[name] = value
    os.replace(tmp, path)
    print(
        f"wrote {len(data['rewards'])} transitions ({args.dataset_episodes} episodes, mean return "
        f"{returns.mean():.1f}; ref_min {ref_min:.1f}, ref_max {ref_max:.1f}) to {path}",
        flush=True,
    )
    return metadata


def run_eval_only(args: Args, given: Optional[frozenset] = None) -> np.ndarray:
    path = args.load if not os.path.isdir(args.load) else os.path.join(args.load, "model.npz")
    kind = "checkpoint" if os.path.basename(path).startswith("checkpoint") else "model"
    meta, arrays = load_npz(path, kind)
    saved = args_from_json(meta.get("args"), path)
    # The run's own evaluation protocol (e.g. --preset atari's epsilon), unless typed here.
    given = typed(args, given)
    epsilon = args.eval_epsilon if "eval_epsilon" in given else saved.eval_epsilon
    max_frames = args.max_episode_frames if "max_episode_frames" in given else saved.max_episode_frames
    env_fn = functools.partial(make_env, saved.env_id, max_episode_frames=max_frames)
    envs = env_fn(1)
    num_actions, obs_space = int(envs.single_action_space.n), envs.single_observation_space
    envs.close()
    network = QNetwork(num_actions, saved.hidden_sizes, planes=is_planes(obs_space))
    template = network.init(jax.random.PRNGKey(0), jnp.zeros((1,) + obs_space.shape, jnp.float32))
    prefix = "train_state/params/" if kind == "checkpoint" else "params/"
    params = restore_tree(template, arrays, prefix, path)
    act = make_act(network.apply, num_actions)
    video = (os.path.join(os.path.dirname(path), "videos"), f"eval-{kind}") if args.capture_video else None
    returns = evaluate(act, params, env_fn, args.eval_episodes, epsilon, args.seed + 10_000, video)
    print(
        f"eval {saved.env_id}: {returns.mean():.2f} +- {returns.std():.2f} over {len(returns)} episodes "
        f"(epsilon {epsilon})"
    )
    if args.save_dataset:
        save_dataset(args.save_dataset, act, params, env_fn, dataclasses.replace(args, env_id=saved.env_id))
    return returns


# ---------------------------------------------------------------------------------------------
# Checkpoint and model files
# ---------------------------------------------------------------------------------------------

# A checkpoint or a model is one .npz (a zip of .npy arrays) read with allow_pickle=False: a
# file someone shared can be refused, but loading it never runs code (pickle, which earlier
# versions used, runs whatever the file tells it to). Member "meta.json" holds the format tag,
# the flags and the counters as JSON; every other member is one array named by its place
# ("train_state/params/params/Dense_0/kernel", "replay/obs", ...). Every name, shape and dtype
# is compared with what this script builds before any of it is used.
META = "meta.json"


def write_atomic(path: str, write: Callable) -> None:
    """write(file) into a temp file in the same folder, fsync, then rename: a crash, a kill or
    a full disk leaves the previous file whole."""
    tmp = f"{path}.tmp.{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        if os.path.exists(tmp):
            os.remove(tmp)
        if isinstance(e, OSError):
            raise RunFailed(f"could not write {path} ({e.strerror or e}); the previous one is unchanged") from None
        raise
    folder = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
    try:
        os.fsync(folder)  # so that the rename, not only the data, survives a power cut
    finally:
        os.close(folder)


def save_npz_atomic(path: str, meta: dict, arrays: dict) -> None:
    write_atomic(path, lambda f: np.savez(f, **{META: np.frombuffer(json.dumps(meta).encode(), np.uint8)}, **arrays))


def save_checkpoint(run_dir: str, meta: dict, arrays: dict, step: int, previous: Optional[int], keep: int) -> None:
    """RUN_DIR/checkpoint.npz is always the newest complete checkpoint (written atomically). With
    --keep-checkpoints K > 1 the one it replaces, taken at step `previous`, stays as
    checkpoint-<previous>.npz: a second name for the same file (a hard link, so no copy of a
    replay of gigabytes), made before the new one is written; only once that is complete are the
    oldest of those removed, so a crash at any point leaves the K newest complete checkpoints."""
    path = os.path.join(run_dir, "checkpoint.npz")
    if keep > 1 and previous is not None and previous != step and os.path.isfile(path):
        older = os.path.join(run_dir, f"checkpoint-{previous}.npz")
        link = f"{older}.tmp.{os.getpid()}"
        try:  # linked under a temp name, then renamed over any file of that name a crash left
            os.link(path, link)
            os.replace(link, older)
        except OSError:  # a file system without hard links: a copy, itself written atomically
            with open(path, "rb") as src:
                write_atomic(older, lambda f: shutil.copyfileobj(src, f))
    save_npz_atomic(path, meta, arrays)
    kept = sorted(
        (int(m.group(1)), m.group(0))
        for m in map(re.compile(r"checkpoint-(\d+)\.npz").fullmatch, os.listdir(run_dir))
        if m
    )
    for _, name in kept[: max(0, len(kept) - (keep - 1))]:
        os.remove(os.path.join(run_dir, name))


def read_json(path: str):
    try:
        with open(path, "rb") as f:
            return json.loads(f.read())
    except (ValueError, RecursionError):  # not JSON, not UTF-8, or nested deeper than Python recurses
        raise ConfigError(f"{path} is not JSON") from None


def load_npz(path: str, kind: str) -> Tuple[dict, dict]:
    """(meta, arrays) of a `kind` ("checkpoint" or "model") this script wrote, or a ConfigError."""
    if os.path.isdir(path):
        path = os.path.join(path, f"{kind}.npz")
    if not os.path.isfile(path):
        old = path[: -len(".npz")] + ".pkl"
        hint = f" ({os.path.basename(old)} there is an earlier version's pickle; README, 'Old .pkl files')"
        raise ConfigError(f"no such file: {path}" + (hint if os.path.isfile(old) else ""))
    with open(path, "rb") as f:
        if f.read(1) == b"\x80":  # pickle's PROTO opcode: a .pkl of an earlier version
            raise ConfigError(
                f"{path} is a pickle from an earlier version of {SCRIPT}.py; not loaded, "
                "since unpickling can run any code; convert a model.pkl you trust with the project's "
                "tools/convert_pkl.py (README, 'Old .pkl files')"
            )
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {name: z[name] for name in z.files}
    except Exception as e:  # a cut-short zip, an object array, a member that is not .npy, ...
        reason = f"{type(e).__name__}: {e}".splitlines()[0]
        raise ConfigError(f"{path} is not a readable {kind} ({reason})") from None
    strange = [name for name, value in arrays.items() if not isinstance(value, np.ndarray)]
    if strange:  # np.load hands back a member that is not a .npy file as raw bytes
        raise ConfigError(f"{path} is not a readable {kind} (member {strange[0]!r} is not an array)")
    raw = arrays.pop(META, None)
    try:
        meta = json.loads(raw.tobytes()) if raw is not None and raw.dtype == np.uint8 else None
    except (ValueError, RecursionError):
        meta = None
    if not isinstance(meta, dict) or meta.get("format") != CHECKPOINT_FORMAT or meta.get("kind") != kind:
        raise ConfigError(f"{path} is not a {kind} written by {SCRIPT}.py (format {CHECKPOINT_FORMAT})")
    return meta, arrays


def check_array(arrays: dict, name: str, shape: tuple, dtype, path: str, hint: str = "") -> np.ndarray:
    got = arrays.get(name)
    if got is None or got.shape != tuple(shape) or got.dtype != np.dtype(dtype):
        found = "missing" if got is None else f"{got.dtype}{list(got.shape)}"
        raise ConfigError(f"{path}: {name} is {found}, expected {np.dtype(dtype)}{list(shape)}{hint}")
    return got


def saved_count(meta: dict, name: str, path: str) -> int:
    value = meta.get(name)
    if type(value) is not int or value < 0:
        raise ConfigError(f"{path}: {name} in meta.json is {value!r}, not a count")
    return value


def tree_arrays(prefix: str, tree) -> dict:
    leaves, _ = jax.tree_util.tree_flatten_with_path(jax.device_get(tree))
    return {prefix + jax.tree_util.keystr(p, simple=True, separator="/"): np.asarray(x) for p, x in leaves}


def restore_tree(template, arrays: dict, prefix: str, path: str):
    """The arrays named prefix* put into the structure of `template`, each checked for name,
    shape and dtype, none left over."""
    wanted = tree_arrays(prefix, template)
    hint = " (written for other --hidden-sizes or another env?)"
    leaves = [check_array(arrays, name, like.shape, like.dtype, path, hint) for name, like in wanted.items()]
    extra = sorted(k for k in arrays if k.startswith(prefix) and k not in wanted)
    if extra:
        raise ConfigError(f"{path}: unexpected array {extra[0]}{hint}")
    return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(template), [jnp.asarray(x) for x in leaves])


def json_fits(value, hint) -> bool:
    """Whether a value read from JSON has the type an Args field is annotated with."""
    origin, params = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Union:
        return any(json_fits(value, h) for h in params)
    if origin is typing.Literal:
        return any(type(value) is type(p) and value == p for p in params)
    if origin in (tuple, list):
        return isinstance(value, list) and all(json_fits(v, params[0]) for v in value)
    if hint is float:
        return type(value) in (int, float)
    return type(value) is (type(None) if hint is None else hint)


def args_from_json(saved, path: str) -> Args:
    """Flags read back from a file, each checked against its annotation (the file may be
    hostile); flags this version does not know are ignored, missing ones take the default."""
    if not isinstance(saved, dict):
        raise ConfigError(f"{path}: no flags in it")
    hints, defaults, values = typing.get_type_hints(Args), Args(), {}
    for flag in dataclasses.fields(Args):
        if flag.name not in saved:
            continue
        value = saved[flag.name]
        if not json_fits(value, hints[flag.name]):
            raise ConfigError(f"{path}: flag {flag.name} is {value!r}, not a {flag.type}")
        if isinstance(getattr(defaults, flag.name), tuple):
            value = tuple(value)
        elif type(value) is int and json_fits(0.5, hints[flag.name]):
            value = float(value)
        values[flag.name] = value
    args = Args(**values)
    if ":" in (args.env_id or ""):  # gymnasium imports the module named before ':' when making the env
        raise ConfigError(f"{path}: env id {args.env_id!r} names a module to import; not taken from a file")
    check_args(args, packages=False)
    return args


# ---------------------------------------------------------------------------------------------
# Logging
# ---------------------------------------------------------------------------------------------


EVENT_FILES = itertools.count()  # tells apart the event files of one process and second


class Logger:
    """Tensorboard scalars through tensorboard's own record writer (no torch, no TensorFlow), and
    with args.track the same scalars, the flags and the eval videos in a Weights & Biases run."""

    def __init__(self, run_dir: str, keep_until: Optional[int] = None, args: Optional[Args] = None):
        from tensorboard.compat.proto import event_pb2, summary_pb2
        from tensorboard.summary.writer.record_writer import RecordWriter

        self._event, self._summary = event_pb2.Event, summary_pb2.Summary
        self._wandb = self._run = None
        if args is not None and args.track:
            import wandb  # optional: imported only with --track

            name = os.path.basename(os.path.abspath(run_dir))
            try:  # the W&B id is the run folder's name, so that --resume continues the same W&B run
                self._wandb, self._run = (
                    wandb,
                    wandb.init(
                        project=args.wandb_project_name,
                        entity=args.wandb_entity,
                        config=dataclasses.asdict(args),
                        name=name,
                        dir=run_dir,
                        id=re.sub(r"[^A-Za-z0-9_-]", "-", name)[-64:],
                        resume="allow",
                    ),
                )
            except wandb.errors.Error as e:  # no login, a bad entity, ...: one line, not a traceback
                raise ConfigError(f"--track: {str(e).splitlines()[0]} (or set WANDB_MODE=offline)") from None
            self._run.define_metric("global_step")
            self._run.define_metric("*", step_metric="global_step")
        # tensorboard's own event format and record writer, written on this thread into a buffered
        # file that flush() empties at each log tick. Its EventFileWriter would hand each event to a
        # writer thread: at one event per episode, that thread's turns at the GIL cost about 12% of
        # a CartPole run at CleanRL's settings (README, Speed).
        name = f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}.{os.getpid()}.{next(EVENT_FILES)}"
        self._file = open(os.path.join(run_dir, name), "wb")
        self._writer = RecordWriter(self._file)
        self._write(file_version="brain.Event:2")
        self._file.flush()  # the file's first event on disk at once, as tensorboard's writer does
        self._eval_csv = os.path.join(run_dir, "eval.csv")
        if keep_until is not None and os.path.exists(self._eval_csv):
            # Evaluations logged after the checkpoint belong to steps that are about to be done
            # again: drop them, so that eval.csv keeps one row per step.
            with open(self._eval_csv, newline="") as f:
                rows = list(csv.reader(f))
            keep = rows[:1] + [r for r in rows[1:] if r and r[0].isdigit() and int(r[0]) <= keep_until]
            with open(self._eval_csv + ".tmp", "w", newline="") as f:
                csv.writer(f).writerows(keep)
            os.replace(self._eval_csv + ".tmp", self._eval_csv)

    def _write(self, **fields) -> None:
        self._writer.write(self._event(wall_time=time.time(), **fields).SerializeToString())

    def scalars(self, step: int, values: dict) -> None:
        summary = self._summary(value=[self._summary.Value(tag=k, simple_value=float(v)) for k, v in values.items()])
        self._write(step=int(step), summary=summary)
        if self._run is not None:
            self._run.log({**{k: float(v) for k, v in values.items()}, "global_step": int(step)})

    def eval(self, step: int, returns: np.ndarray, video: Optional[Tuple[str, str]] = None) -> None:
        self.scalars(step, {"eval/episodic_return": returns.mean(), "eval/episodic_return_std": returns.std()})
        new = not os.path.exists(self._eval_csv)
        with open(self._eval_csv, "a", newline="") as f:
            writer = csv.writer(f)
            if new:
                writer.writerow(["step", "mean", "std", "episodes"])
            writer.writerow([step, f"{returns.mean():.4f}", f"{returns.std():.4f}", len(returns)])
        if self._run is not None and video is not None and os.path.isfile(video_file(video)):
            self._run.log({"videos/eval": self._wandb.Video(video_file(video), format="mp4"), "global_step": int(step)})

    def flush(self) -> None:
        self._file.flush()

    def close(self) -> None:
        self._file.close()
        if self._run is not None:
            self._run.finish()
            self._run = None  # close() may come twice: after an error, then from finish()


class Console:
    """The progress line. On a terminal, one line rewritten in place at every log tick: steps
    done / total, env steps/s, the script's fields (last eval, loss) and the time left at the rate
    since the loop started in this process. Elsewhere (a log file, CI) the plain line, exactly as
    and when the caller passes it. end() closes the refreshing line before anything else prints."""

    # A few lines rather than tqdm or rich: the line carries this script's own fields (last eval,
    # loss), the plain mode of logs must stay as it was, and a library would be a dependency for
    # one line.

    def __init__(self, total: int, done: int, unit: str):
        self.total, self.unit, self.tty = total, unit, sys.stdout.isatty()
        self.started, self.done_at_start = time.perf_counter(), done
        self.open = False

    def update(self, done: int, rate: float, fields: str, plain: Optional[str]) -> None:
        if not self.tty:
            if plain is not None:
                print(plain, flush=True)
            return
        speed = (done - self.done_at_start) / max(time.perf_counter() - self.started, 1e-9)
        left = round((self.total - done) / speed) if speed > 0 else None
        eta = "?" if left is None else f"{left // 3600}:{left % 3600 // 60:02d}:{left % 60:02d}"
        sys.stdout.write(
            f"\r{done}/{self.total} {self.unit} ({100 * done // self.total}%)  "
            f"{rate:.0f} {self.unit}/s  {fields}  {eta} left\x1b[K"
        )
        sys.stdout.flush()
        self.open = True

    def end(self) -> None:
        if self.open:
            sys.stdout.write("\n")
            sys.stdout.flush()
            self.open = False


def write_curve(run_dir: str) -> Optional[str]:
    """RUN_DIR/curve.png (written atomically): the evaluation returns over env steps from eval.csv
    (mean, and a band of one std over the episodes) beside the training episodes' returns read back
    from the run's tensorboard events. None, quietly, without matplotlib (an optional package)."""
    try:
        import matplotlib  # noqa: F401  (first, so that a missing matplotlib is an ImportError here)
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        return None
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
    from tensorboard.util.tensor_util import make_ndarray

    train_tag, x_label = "charts/episodic_return", "env steps"
    with open(os.path.join(run_dir, "eval.csv"), newline="") as f:
        rows = sorted((int(r["step"]), float(r["mean"]), float(r["std"])) for r in csv.DictReader(f))
    train = []
    for name in sorted(os.listdir(run_dir)):
        if name.startswith("events.out.tfevents."):
            for event in EventFileLoader(os.path.join(run_dir, name)).Load():  # scalars come back as tensors
                train += [
                    (event.step, make_ndarray(v.tensor).item()) for v in event.summary.value if v.tag == train_tag
                ]
    fig = Figure(figsize=(11, 4), layout="constrained")
    FigureCanvasAgg(fig)  # Agg, set on this figure only: pyplot's global backend is left alone
    left, right = fig.subplots(1, 2)
    if rows:
        steps, mean, std = (np.array(column) for column in zip(*rows))
        left.plot(steps, mean, marker="o")
        left.fill_between(steps, mean - std, mean + std, alpha=0.25)
    left.set(title="evaluation return (mean, band of one std)", xlabel=x_label, ylabel="return")
    if train:
        steps, values = zip(*sorted(train))
        right.plot(steps, values, linewidth=0.8)
    right.set(title=f"training episodes ({train_tag})", xlabel=x_label)
    fig.suptitle(os.path.basename(os.path.abspath(run_dir)))
    path = os.path.join(run_dir, "curve.png")
    try:
        write_atomic(path, lambda f: fig.savefig(f, format="png", dpi=100))
    except RunFailed as e:  # a full disk: the run itself is finished and saved, so only say so
        print(f"{SCRIPT}.py: {e}", file=sys.stderr)
        return None
    return path


# ---------------------------------------------------------------------------------------------
# Command line, resume and signals
# ---------------------------------------------------------------------------------------------


def given_flags(argv) -> frozenset:
    """The Args fields typed on a command line (tyro's --flag-name, --flag-name=value, --no-flag)."""
    names, given = {f.name for f in dataclasses.fields(Args)}, set()
    for token in argv:
        if token.startswith("--"):
            name = token[2:].split("=", 1)[0].replace("-", "_")
            name = name[3:] if name not in names and name.startswith("no_") else name
            given.add(name)
    return frozenset(given & names)


def typed(args: Args, given: Optional[frozenset]) -> frozenset:
    """Flags that count as given: those typed (from cli), or for code that builds Args itself,
    those that differ from their defaults."""
    if given is not None:
        return given
    defaults = Args()
    return frozenset(f.name for f in dataclasses.fields(Args) if getattr(args, f.name) != getattr(defaults, f.name))


def resolve_args(args: Args, given: Optional[frozenset] = None) -> Args:
    """For --resume: the run's saved flags, overridden by those typed here (e.g. a larger
    --total-timesteps to extend the run; --preset's values count only where typed)."""
    path = os.path.join(args.resume, "args.json")
    if not os.path.isfile(path):
        raise ConfigError(f"--resume {args.resume}: no args.json there (not a run folder of this script)")
    saved = read_json(path)
    if not isinstance(saved, dict) or saved.get("script") != SCRIPT:
        raise ConfigError(f"--resume {args.resume}: that run was not made by {SCRIPT}.py")
    merged = args_from_json(saved.get("args"), path)
    if "preset" in typed(args, given) and getattr(args, "preset", None) != getattr(merged, "preset", None):
        raise ConfigError(f"--resume {args.resume}: --preset cannot change on resume (the run's values stay)")
    merged = dataclasses.replace(merged, **{name: getattr(args, name) for name in typed(args, given)})
    # What to do and where to write come from the command line only, never from the folder:
    # a shared run folder's args.json must not pick files to overwrite.
    local = {name: getattr(args, name) for name in ("eval_only", "load", "save_dataset") if hasattr(args, name)}
    merged = dataclasses.replace(merged, resume=args.resume, run_dir=args.resume, **local)
    return merged


class StopRequest:
    """SIGINT/SIGTERM set a flag that the loop checks between steps, so the last checkpoint is
    taken from a consistent state; a second signal interrupts at once."""

    def __init__(self):
        self.signum: Optional[int] = None
        self._previous = {}

    def __enter__(self):
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame):
        if self.signum is not None:
            raise KeyboardInterrupt
        self.signum = signum

    def __exit__(self, *exc):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


def main(args: Args, given: Optional[frozenset] = None) -> dict:
    """Train (or evaluate with --eval-only). Returns a summary dict; errors raise ConfigError.
    `given`: the flags typed on the command line (cli passes them; see typed())."""
    if args.resume and not args.eval_only:
        args = resolve_args(args, given)  # the run's flags and those typed here, checked together below
    check_args(args)
    # On CPU, jax's asynchronous dispatch hands every call to another thread; for the tiny
    # per-step policy call that handoff costs more than the network (README: Speed).
    jax.config.update("jax_cpu_enable_async_dispatch", False)
    if args.eval_only:
        returns = run_eval_only(args, given)
        return {"eval_mean": float(returns.mean())}
    return train(args)


def parse_args(argv=None) -> Args:
    """tyro's parse, with the defaults of --preset (if given) in place of Args' own, so that
    every flag given on the command line overrides the preset and --help shows its values."""
    argv = sys.argv[1:] if argv is None else list(argv)
    default = Args()
    for i, token in enumerate(argv):
        name = token[len("--preset=") :] if token.startswith("--preset=") else None
        if token == "--preset" and i + 1 < len(argv):
            name = argv[i + 1]
        if name in PRESETS:
            default = Args(preset=name, **PRESETS[name])
    return tyro.cli(Args, args=argv, default=default)


def cli(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    try:
        result = main(args, given_flags(argv))
    except (ConfigError, RunFailed) as e:
        print(f"{SCRIPT}.py: error: {e}", file=sys.stderr)
        return 2 if isinstance(e, ConfigError) else 1
    except MemoryError:
        print(f"{SCRIPT}.py: error: out of memory (a smaller --buffer-size or --hidden-sizes?)", file=sys.stderr)
        return 1
    return 128 + result["signal"] if "signal" in result else 0


if __name__ == "__main__":
    sys.exit(cli())
