"""Soft actor-critic with prioritized experience replay, in one file.

What it implements
  * Soft actor-critic with twin critics, a tanh-squashed Gaussian actor and a learned
    temperature (Haarnoja, Zhou, Hartikainen, Tucker, Ha, Tan, Kumar, Zhu, Gupta, Abbeel & Levine
    2018, "Soft Actor-Critic Algorithms and Applications", arXiv:1812.05905). The temperature
    follows CleanRL's sac_continuous_action.py: it starts at 1 (--alpha-init) and learns at the
    critics' rate (--alpha-lr defaults to --q-lr); starting it at 0.2 with the actor's rate cost
    most of the return on Hopper-v5 at 100k steps and nothing on Pendulum-v1. The actor
    follows CleanRL too (3e-4, two steps every second critic step, 1,000 random steps first).
    Tianshou's MuJoCo settings (actor at 1e-3 every step, 10,000 random steps) did better on
    HalfCheetah-v5 and worse on Hopper, Walker2d and Ant-v5 at 100k steps (docs/sampling.md), so they
    are a command line away, not the default.
  * Proportional prioritized experience replay (Schaul et al. 2016, arXiv:1511.05952) on cpprb,
    with importance-sampling-weighted critic loss, and optional n-step returns.
  * An Acme-style learner (Hoffman et al. 2020, arXiv:2006.00979): a background thread samples
    and puts batches on the device, K SGD steps run fused in one jitted `lax.scan`, and
    priorities are written back from another thread. With --num-devices N the SGD steps run
    data parallel on N local devices (replicated parameters, each batch split, gradients
    averaged; see learner_shardings).

Update equations (batch of B transitions i spanning k_i <= n steps; actions live in [-1, 1]^|A|)
  u ~ N(mu_phi(s), sigma_phi(s)),  a = tanh(u)
  log pi(a|s) = log N(u; mu, sigma) - sum_j log(1 - tanh(u_j)^2)
              = log N(u; mu, sigma) - sum_j 2 (log 2 - u_j - softplus(-2 u_j))   (stable form)
  y_i      = G_i + d_i * (min_{m=1,2} Q_target_m(s'_i, a'_i) - alpha * log pi(a'_i|s'_i)),
             a'_i ~ pi(.|s'_i),  G_i = n-step return,  d_i = gamma^{k_i} (1 - terminated_i)
  L_Q      = (1/B) sum_i w_i * sum_m huber(Q_m(s_i, a_i) - y_i)       (w_i: PER IS weights)
  L_pi     = (1/B) sum_i [alpha * log pi(a~_i|s_i) - min_m Q_m(s_i, a~_i)],  a~_i ~ pi(.|s_i)
  L_alpha  = (1/B) sum_i -alpha * (log pi(a~_i|s_i) + H_target),  H_target = -scale * |A|
  p_i      = mean_m |Q_m(s_i, a_i) - y_i| + eps      (the priority written back)
  Q_target <- tau * Q + (1 - tau) * Q_target every --target-network-frequency SGD steps;
  every --policy-frequency SGD steps the actor and alpha take --policy-frequency steps, so they
  get as many updates as the critics, only later (CleanRL's schedule).
  PER: P(i) = p_i^alpha_per / sum_j p_j^alpha_per, w_i = (N P(i))^-beta / max_j (N P(j))^-beta
  with the max over the minibatch (--per-weight-norm batch, as Acme and Dopamine; 'buffer' is
  cpprb's rule, the max over all N), beta annealed to 1. Each of the K minibatches of a fused
  call is its own stratified draw over the whole buffer (the PER paper's rule per minibatch;
  one K*B draw and a permutation would mix them too for less, but keeps one draw's strata; the
  extra time runs on the prefetch thread: docs/sampling.md).

Design choices
  * The log-probability is that of the action in [-1, 1]; the env's bounds are applied after,
    as an affine map. The temperature's target entropy -|A| therefore means the same thing for
    every env, whatever its units.
  * The priority is the mean of the two critics' |TD|: both critics are fitted on the sample,
    so the mean is the error the sample still has to correct; the max would follow whichever
    critic is momentarily worse and make priorities noisier.
  * The actor and temperature losses are plain means. The IS weights exist to keep the critic's
    fixed point (an expectation under the replay distribution) unbiased. The actor step is a
    policy improvement step: any state distribution with full support improves the policy, so
    sampling high-TD states more often biases nothing there, and weighting by w <= 1 would only
    shrink its step size.

Map of this file
  Part 1, the algorithm: Args (the flags), the networks (Actor, TwinCritic, the tanh-Gaussian),
  NStepAssembler, PrioritizedReplay, the learner (critic_loss, actor_alpha_loss, make_update),
  acting (make_act) and train(), the loop. Part 2, the machinery, which a reader may skip: flag
  checks, envs, the prefetch and priority threads, devices, Run (run folder, resume, counters,
  logging, evaluations, checkpoints), evaluation and datasets, files, the command line.

Run
  python algos/sac.py                                       # Pendulum-v1, 20k steps
  python algos/sac.py --env-id HalfCheetah-v5 --total-timesteps 1000000
  python algos/sac.py --env-id HalfCheetah-v5 --num-devices -1   # SGD over every local GPU
  python algos/sac.py --resume runs/<run>                   # continue an interrupted run
  python algos/sac.py --eval-only --load runs/<run>/model.npz
  python algos/sac.py --save-dataset data/pendulum.hdf5 --dataset-noise 0.3   # data for BC
  python algos/sac.py --capture-video --track               # eval videos, Weights & Biases (optional packages)
  python algos/sac.py --help                                # every flag

Outputs (runs/<env_id>__sac__<seed>__<unix_time>/)
  args.json, eval.csv (step, mean, std, episodes), tensorboard events with the tags
  charts/episodic_return, charts/episodic_length, charts/SPS, losses/qf_loss, losses/qf_values,
  losses/actor_loss, losses/alpha, losses/alpha_loss, losses/entropy, eval/episodic_return(_std),
  replay/beta, replay/priority_max, perf/updates_per_second, perf/learner_wait_fraction;
  checkpoint.npz (latest, written atomically; every --checkpoint-every steps and
  --checkpoint-minutes; --keep-checkpoints K keeps the K - 1 before it as checkpoint-<step>.npz)
  and model.npz (final actor): arrays and JSON, read without pickle; curve.png (eval and
  training returns, with matplotlib), videos/ (--capture-video), wandb/ (--track).
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
import tyro

SCRIPT = "sac"
CHECKPOINT_FORMAT = f"{SCRIPT}/2"  # 2: .npz and JSON (1 was a pickle)
LOG_STD_MIN, LOG_STD_MAX = -20.0, 2.0  # the clip of the SAC authors' code (softlearning)


# =============================================================================================
# PART 1: THE ALGORITHM
# Flags, networks, n-step returns, prioritized replay, losses and update, acting, and the loop.
# =============================================================================================


@dataclass
class Args:
    # Algorithm
    env_id: str = "Pendulum-v1"
    """gymnasium id of an environment with a bounded Box action space"""
    seed: int = 1
    """seed of the training envs, the eval env, the networks and the exploration"""
    total_timesteps: int = 20_000
    """environment steps, summed over all envs"""
    num_envs: int = 1
    """parallel environments (gymnasium's synchronous vector env)"""
    hidden_sizes: Tuple[int, ...] = (256, 256)
    """widths of the hidden layers of the actor and of each critic"""
    policy_lr: float = 3e-4
    """Adam learning rate of the actor"""
    alpha_lr: Optional[float] = None
    """Adam learning rate of log alpha (default: --q-lr, as CleanRL)"""
    q_lr: float = 1e-3
    """Adam learning rate of the critics"""
    batch_size: int = 256
    """transitions per SGD step"""
    gamma: float = 0.99
    """discount factor"""
    n_step: int = 1
    """steps per return (the entropy bonus is taken at the bootstrap state only)"""
    tau: float = 0.005
    """Polyak rate of the target critics"""
    target_network_frequency: int = 1
    """SGD steps between target-critic updates"""
    policy_frequency: int = 2
    """SGD steps between actor/alpha updates (each time that many of them, as CleanRL does)"""
    huber_delta: float = 1e6
    """Huber threshold of the critic loss; the default is so large that it is the squared error"""
    alpha: float = 0.2
    """entropy temperature when --no-autotune"""
    alpha_init: float = 1.0
    """initial temperature with --autotune (CleanRL, sbx, softlearning and jaxrl start at 1; a
    start at 0.2 fell far behind on Hopper-v5: docs/sampling.md)"""
    autotune: bool = True
    """learn the temperature to reach the target entropy"""
    target_entropy_scale: float = 1.0
    """target entropy = -scale * |A|"""
    learning_starts: int = 1_000
    """environment steps of uniformly random actions before learning starts"""
    train_frequency: int = 1
    """environment steps per SGD step (the replay ratio's inverse), whatever --updates-per-call"""
    # Replay
    buffer_size: int = 1_000_000
    """replay capacity, in transitions"""
    prioritized: bool = False
    """prioritized replay (off by default: no gain measured, level with uniform on Pendulum-v1 over
    5 seeds and on HalfCheetah-v5 in 1 seed; docs/benchmarks.md, Ablations); --no-prioritized samples uniformly through
    the same code (alpha = 0)"""
    per_alpha: float = 0.6
    """priority exponent alpha (0 is uniform)"""
    per_beta0: float = 0.4
    """initial importance-sampling exponent beta, annealed linearly to 1"""
    per_eps: float = 1e-6
    """added to |TD| so that no transition has zero probability"""
    per_weight_norm: Literal["batch", "buffer"] = "batch"
    """divide the IS weights by their largest value in the minibatch (Acme, Dopamine) or in the
    whole buffer (cpprb's rule, which a single well-fitted transition can shrink; docs/sampling.md)"""
    # Learner machinery
    updates_per_call: int = 32
    """SGD steps fused in one jitted call (lax.scan)"""
    prefetch_size: int = 2
    """batches of updates_per_call x batch_size the prefetch thread keeps ready on the device"""
    num_devices: int = 1
    """local devices the learner uses (-1: all): each SGD step's batch is split across them, the
    parameters are replicated and the gradients averaged (data parallel; see learner_shardings)"""
    # Run and output
    eval_every: int = 5_000
    """environment steps between evaluations"""
    eval_episodes: int = 10
    """episodes per evaluation (run in parallel, deterministic actions)"""
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
    """output folder; default runs/<env_id>__sac__<seed>__<unix_time>"""
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
    here override it; a larger --total-timesteps re-stretches the schedules, docs/runs.md)"""
    eval_only: bool = False
    """evaluate the actor in --load and exit"""
    load: Optional[str] = None
    """model.npz or checkpoint.npz (or a run folder) to evaluate with --eval-only"""
    save_dataset: Optional[str] = None
    """after training (or with --eval-only), write rollouts of the policy to this .hdf5 file in
    D4RL's layout, for algos/bc_offline.py"""
    dataset_episodes: int = 20
    """episodes in the --save-dataset file"""
    dataset_noise: float = 0.0
    """std of Gaussian noise added (in [-1, 1] action units) to the deterministic policy while
    collecting the dataset (0: expert data; larger: noisier data)"""


# ---------------------------------------------------------------------------------------------
# Networks
# ---------------------------------------------------------------------------------------------


class Actor(nn.Module):
    """s -> (mean, log_std) of the Gaussian that tanh squashes into [-1, 1]^|A|."""

    action_dim: int
    hidden_sizes: Tuple[int, ...]

    @nn.compact
    def __call__(self, obs: jax.Array):
        x = obs.astype(jnp.float32)
        for width in self.hidden_sizes:
            x = nn.relu(nn.Dense(width)(x))
        mean = nn.Dense(self.action_dim)(x)
        log_std = jnp.clip(nn.Dense(self.action_dim)(x), LOG_STD_MIN, LOG_STD_MAX)
        return mean, log_std


class Critic(nn.Module):
    hidden_sizes: Tuple[int, ...]

    @nn.compact
    def __call__(self, obs: jax.Array, action: jax.Array) -> jax.Array:
        x = jnp.concatenate([obs.astype(jnp.float32), action], axis=-1)
        for width in self.hidden_sizes:
            x = nn.relu(nn.Dense(width)(x))
        return nn.Dense(1)(x)[..., 0]


class TwinCritic(nn.Module):
    """Two independent critics evaluated as one vmapped network: output [2, batch]."""

    hidden_sizes: Tuple[int, ...]

    @nn.compact
    def __call__(self, obs: jax.Array, action: jax.Array) -> jax.Array:
        twins = nn.vmap(
            Critic, variable_axes={"params": 0}, split_rngs={"params": True}, in_axes=None, out_axes=0, axis_size=2
        )
        return twins(self.hidden_sizes)(obs, action)


def sample_tanh_gaussian(mean: jax.Array, log_std: jax.Array, key: jax.Array):
    """a = tanh(u), u ~ N(mean, std); returns (a, log pi(a)) with the numerically stable
    change-of-variables term log(1 - tanh(u)^2) = 2 (log 2 - u - softplus(-2u))."""
    std = jnp.exp(log_std)
    u = mean + std * jax.random.normal(key, mean.shape)
    log_normal = -0.5 * (((u - mean) / std) ** 2 + 2.0 * log_std + jnp.log(2.0 * jnp.pi))
    log_det = 2.0 * (jnp.log(2.0) - u - jax.nn.softplus(-2.0 * u))
    return jnp.tanh(u), jnp.sum(log_normal - log_det, axis=-1)


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

    def __init__(self, n: int, gamma: float, num_envs: int, obs_dim: int, action_dim: int):
        self.n = n
        self.powers = gamma ** np.arange(n + 1, dtype=np.float64)
        self.obs = np.zeros((n, num_envs, obs_dim), np.float32)
        self.action = np.zeros((n, num_envs, action_dim), np.float32)
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
      * P(i) = p_i^alpha / sum_j p_j^alpha, one stratified draw of B per minibatch (sample)
      * w_i = (N P(i))^-beta / max_{j in minibatch} w_j                            (sample)
      * after learning, p_i = mean_m |delta_m,i| + eps                             (update_priorities)
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
        self, capacity: int, obs_dim: int, action_dim: int, alpha: float, eps: float, weight_norm: str = "batch"
    ):
        self.capacity, self.weight_norm = capacity, weight_norm
        shapes = {"obs": (obs_dim,), "next_obs": (obs_dim,), "action": (action_dim,), "reward": (), "discount": ()}
        spec = {k: {"shape": shapes[k] or 1, "dtype": np.float32} for k in shapes}  # cpprb: 1, not ()
        self.buffer = cpprb.PrioritizedReplayBuffer(capacity, spec, alpha=alpha, eps=eps)
        self.lock = threading.Lock()
        self.write_count = np.zeros(capacity, np.int64)
        self.priority = np.zeros(capacity, np.float64)
        self.beta = 0.4  # set by the main loop; read by whoever samples
        self.stage = {k: np.zeros((self.STAGE_ROWS,) + shapes[k], np.float32) for k in shapes}
        self.staged = 0

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

    def sample(self, batch_size: int, num_batches: int = 1) -> Tuple[dict, np.ndarray, np.ndarray]:
        """num_batches minibatches of batch_size rows, each a stratified sample of the whole
        buffer, flat: minibatch k is rows [k B, (k+1) B). Returns (batch with IS 'weights', slot
        indexes, their write counts) at the current beta."""
        # PER's stratified sampling is per minibatch: "to sample a minibatch of size k, the range
        # [0, p_total] is divided equally into k ranges" (Schaul et al. 2016, B.2.1). cpprb
        # stratifies the draws of one call, so a single call of K*B rows cut into K minibatches
        # would give minibatch k only the k-th 1/K of the priority mass: a thin slice of time.
        # One call per minibatch, all under one lock so that the K share one beta and one tree.
        beta = self.beta  # read once: the main loop may move it meanwhile
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
        for key in ("reward", "discount", "weights"):
            batch[key] = batch[key].reshape(-1).astype(np.float32)
        if self.weight_norm == "batch":  # w_i / max_{j in minibatch} w_j (cpprb's rule: the buffer's)
            weights = batch["weights"].reshape(num_batches, batch_size)
            batch["weights"] = (weights / weights.max(axis=1, keepdims=True)).reshape(-1)
        return batch, indexes, stamps

    def update_priorities(self, indexes: np.ndarray, stamps: np.ndarray, priorities: np.ndarray) -> int:
        """p_i = mean_m |delta_m,i| (+ eps, by cpprb), where the slot still holds the sampled
        transition; returns the rows kept."""
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
    actor_params: Any
    critic_params: Any
    target_critic_params: Any
    log_alpha: jax.Array
    actor_opt: Any
    critic_opt: Any
    alpha_opt: Any
    sgd_steps: jax.Array


class Nets(NamedTuple):
    actor: Actor
    critic: TwinCritic
    actor_tx: optax.GradientTransformation
    critic_tx: optax.GradientTransformation
    alpha_tx: optax.GradientTransformation


def make_nets(args: Args, action_dim: int) -> Nets:
    return Nets(
        Actor(action_dim, args.hidden_sizes),
        TwinCritic(args.hidden_sizes),
        optax.adam(args.policy_lr),
        optax.adam(args.q_lr),
        optax.adam(args.q_lr if args.alpha_lr is None else args.alpha_lr),
    )


def init_train_state(nets: Nets, args: Args, obs_dim: int, action_dim: int, key) -> TrainState:
    k_actor, k_critic = jax.random.split(key)
    obs, action = jnp.zeros((1, obs_dim)), jnp.zeros((1, action_dim))
    actor_params = nets.actor.init(k_actor, obs)
    critic_params = nets.critic.init(k_critic, obs, action)
    log_alpha = jnp.asarray(np.log(args.alpha_init if args.autotune else args.alpha), jnp.float32)
    return TrainState(
        actor_params,
        critic_params,
        jax.tree_util.tree_map(jnp.copy, critic_params),
        log_alpha,
        nets.actor_tx.init(actor_params),
        nets.critic_tx.init(critic_params),
        nets.alpha_tx.init(log_alpha),
        jnp.zeros((), jnp.int32),
    )


def critic_loss(nets: Nets, critic_params, state: TrainState, batch: dict, key, huber_delta: float):
    """IS-weighted Huber loss of both critics against the clipped double-Q soft target.

    Returns (loss, (td[2, B], mean Q)).
    """
    mean, log_std = nets.actor.apply(state.actor_params, batch["next_obs"])
    next_action, next_log_prob = sample_tanh_gaussian(mean, log_std, key)
    next_q = nets.critic.apply(state.target_critic_params, batch["next_obs"], next_action).min(axis=0)
    alpha = jnp.exp(state.log_alpha)
    target = batch["reward"] + batch["discount"] * (next_q - alpha * next_log_prob)
    q = nets.critic.apply(critic_params, batch["obs"], batch["action"])
    td = q - jax.lax.stop_gradient(target)
    abs_td = jnp.abs(td)
    quadratic = jnp.minimum(abs_td, huber_delta)
    huber = 0.5 * quadratic**2 + huber_delta * (abs_td - quadratic)
    return jnp.mean(batch["weights"] * huber.sum(axis=0)), (td, q.mean())


def actor_alpha_loss(nets: Nets, actor_params, log_alpha, critic_params, obs, key, target_entropy):
    """L_pi + L_alpha, plain means (see the docstring); aux = (L_pi, L_alpha, entropy estimate).

    The stop_gradients make the sum separate: d/d(actor) sees only L_pi (alpha held fixed) and
    d/d(log alpha) sees only L_alpha (log pi held fixed), so one backward pass serves both.
    """
    mean, log_std = nets.actor.apply(actor_params, obs)
    action, log_prob = sample_tanh_gaussian(mean, log_std, key)
    q = nets.critic.apply(critic_params, obs, action).min(axis=0)
    alpha = jnp.exp(log_alpha)
    actor_loss = jnp.mean(jax.lax.stop_gradient(alpha) * log_prob - q)
    alpha_loss = jnp.mean(-alpha * (jax.lax.stop_gradient(log_prob) + target_entropy))
    return actor_loss + alpha_loss, (actor_loss, alpha_loss, -jnp.mean(log_prob))


def make_update(nets: Nets, args: Args, action_dim: int):
    """jit(state, batches[K, B, ...], key) -> (state, metrics, priorities[K, B]): K SGD steps fused.

    The priority of a sample is the mean of the twin critics' |TD| (see the docstring). The state
    must be on the devices of learner_shardings(args) (jax.device_put(state, shardings.replicated)).
    """
    shardings = learner_shardings(args)
    target_entropy = -args.target_entropy_scale * action_dim

    def actor_step(carry, key):
        state, obs = carry
        grad_fn = jax.grad(actor_alpha_loss, argnums=(1, 2), has_aux=True)
        (actor_grads, alpha_grad), (actor_l, alpha_l, entropy) = grad_fn(
            nets, state.actor_params, state.log_alpha, state.critic_params, obs, key, target_entropy
        )
        updates, actor_opt = nets.actor_tx.update(actor_grads, state.actor_opt, state.actor_params)
        state = state._replace(actor_params=optax.apply_updates(state.actor_params, updates), actor_opt=actor_opt)
        if args.autotune:
            updates, alpha_opt = nets.alpha_tx.update(alpha_grad, state.alpha_opt, state.log_alpha)
            state = state._replace(log_alpha=optax.apply_updates(state.log_alpha, updates), alpha_opt=alpha_opt)
        return (state, obs), (actor_l, alpha_l, entropy)

    def sgd_step(state: TrainState, inputs):
        batch, key = inputs
        critic_key, actor_key = jax.random.split(key)
        grad_fn = jax.value_and_grad(critic_loss, argnums=1, has_aux=True)
        (q_loss, (td, q_mean)), grads = grad_fn(nets, state.critic_params, state, batch, critic_key, args.huber_delta)
        updates, critic_opt = nets.critic_tx.update(grads, state.critic_opt, state.critic_params)
        critic_params = optax.apply_updates(state.critic_params, updates)
        sgd_steps = state.sgd_steps + 1
        target = optax.periodic_update(
            optax.incremental_update(critic_params, state.target_critic_params, args.tau),
            state.target_critic_params,
            sgd_steps,
            args.target_network_frequency,
        )
        state = state._replace(
            critic_params=critic_params, critic_opt=critic_opt, target_critic_params=target, sgd_steps=sgd_steps
        )

        def delayed_actor_updates(state):
            keys = jax.random.split(actor_key, args.policy_frequency)
            (state, _), (actor_l, alpha_l, entropy) = jax.lax.scan(actor_step, (state, batch["obs"]), keys)
            return state, (actor_l.mean(), alpha_l.mean(), entropy.mean())

        def skip(state):
            return state, (jnp.nan, jnp.nan, jnp.nan)

        state, (actor_l, alpha_l, entropy) = jax.lax.cond(
            sgd_steps % args.policy_frequency == 0, delayed_actor_updates, skip, state
        )
        # A step whose new parameters are not finite reports NaN priorities, so the priority
        # writer stops the run here rather than one call later (after a checkpoint, maybe).
        finite = jnp.isfinite(optax.global_norm((state.critic_params, state.actor_params, state.log_alpha)))
        td = jnp.where(finite, td, jnp.nan)
        return state, (q_loss, q_mean, actor_l, alpha_l, entropy, td)

    def update(state: TrainState, batches: dict, key):
        keys = jax.random.split(jax.random.fold_in(key, state.sgd_steps), batches["reward"].shape[0])
        state, (q_loss, q_mean, actor_l, alpha_l, entropy, td) = jax.lax.scan(sgd_step, state, (batches, keys))
        metrics = {
            "losses/qf_loss": q_loss.mean(),
            "losses/qf_values": q_mean.mean(),
            "losses/actor_loss": jnp.nanmean(actor_l),
            "losses/alpha_loss": jnp.nanmean(alpha_l),
            "losses/entropy": jnp.nanmean(entropy),
            "losses/alpha": jnp.exp(state.log_alpha),
        }
        return state, metrics, jnp.abs(td).mean(axis=1)

    return jax.jit(
        update,
        donate_argnums=0,
        in_shardings=(shardings.replicated, shardings.batch, shardings.replicated),
        out_shardings=(shardings.replicated, shardings.replicated, shardings.batch),
    )


# ---------------------------------------------------------------------------------------------
# Acting
# ---------------------------------------------------------------------------------------------


def make_act(actor: Actor):
    """jit(params, obs[N], key, step, deterministic) -> actions[N, |A|] in [-1, 1].

    Stochastic: a sample of the tanh-Gaussian, keyed by fold_in(key, step) so that no key has to
    be carried out of the call. Deterministic (evaluation): tanh of the mean.
    """

    def act(params, obs, key, step, deterministic: bool):
        mean, log_std = actor.apply(params, obs)
        if deterministic:
            return jnp.tanh(mean)
        return sample_tanh_gaussian(mean, log_std, jax.random.fold_in(key, step))[0]

    return jax.jit(act, static_argnames="deterministic")


def linear_schedule(start: float, end: float, duration: float, t: float) -> float:
    """start -> end linearly over `duration`, then end."""
    return end + (start - end) * max(0.0, 1.0 - t / duration)


def to_env_action(action: np.ndarray, low: np.ndarray, high: np.ndarray) -> np.ndarray:
    """[-1, 1] -> [low, high], affine per dimension; clipped against float rounding."""
    return np.clip(low + (action + 1.0) * 0.5 * (high - low), low, high)


def from_env_action(env_action: np.ndarray, low: np.ndarray, high: np.ndarray) -> np.ndarray:
    """[low, high] -> [-1, 1], the inverse of to_env_action."""
    return np.clip(2.0 * (env_action - low) / (high - low) - 1.0, -1.0, 1.0)


# ---------------------------------------------------------------------------------------------
# Training loop
# ---------------------------------------------------------------------------------------------


def train(args: Args) -> dict:
    """Train with checked flags (main() checks them and merges a --resume run's own). Returns
    {run_dir, global_step, eval_mean, sgd_steps}, or {..., signal} when a signal stopped it."""
    # The learner's devices (one by default): parameters replicated, each batch split across them.
    shardings = learner_shardings(args)
    envs = make_env(args.env_id, args.num_envs)
    obs_dim, action_dim = envs.single_observation_space.shape[0], envs.single_action_space.shape[0]
    low, high = envs.single_action_space.low, envs.single_action_space.high
    nets = make_nets(args, action_dim)
    key, init_key = jax.random.split(jax.random.PRNGKey(args.seed))
    state = init_train_state(nets, args, obs_dim, action_dim, init_key)
    replay = PrioritizedReplay(
        args.buffer_size,
        obs_dim,
        action_dim,
        args.per_alpha if args.prioritized else 0.0,
        args.per_eps,
        args.per_weight_norm,
    )
    nstep = NStepAssembler(args.n_step, args.gamma, args.num_envs, obs_dim, action_dim)
    act = make_act(nets.actor)
    update = make_update(nets, args, action_dim)
    # The run folder, a --resume checkpoint, logging, the prefetch and priority threads, signals,
    # evaluations and checkpoints: Part 2. The loop below is the algorithm.
    run = Run(args, envs, replay, act, shardings)
    state, key = run.restore(state, key)
    with run:
        obs = run.reset()
        while run.global_step < args.total_timesteps and not run.stopped:
            # ACT: uniform random actions until learning starts, then samples of the policy
            if run.global_step < args.learning_starts:
                action = from_env_action(envs.action_space.sample(), low, high)
            else:
                action = np.asarray(act(run.act_params, obs, key, np.int32(run.global_step), deterministic=False))
            next_obs, reward, terminated, truncated, info = envs.step(to_env_action(action, low, high))

            # STORE: the n-step transition. Its next observation is the one the step really led
            # to (info["final_obs"] at an episode's end); only `terminated` ends the return, a
            # time-limit truncation bootstraps.
            done = terminated | truncated
            replay.add(nstep.push(obs, action, reward, real_next_obs(next_obs, done, info), terminated, truncated))
            obs = next_obs
            run.count_step(reward, done)

            # LEARN: one SGD step per train_frequency env steps, K of them fused per jitted call;
            # the batches come from the prefetch thread, the priorities go back on another thread.
            for _ in range(run.update_calls_due()):
                replay.beta = linear_schedule(args.per_beta0, 1.0, args.total_timesteps, run.global_step)
                batches, indexes, stamps = run.next_batches()
                state, metrics, priorities = update(state, batches, key)
                run.learned(state, metrics, indexes, stamps, priorities)

            run.log_if_due()
            run.evaluate_if_due()
            run.checkpoint_if_due(state, key)
    return run.finish(state, key)


# =============================================================================================
# PART 2: THE MACHINERY
# What makes the loop above a dependable program: a reader learning the algorithm can stop
# here. Flag checks, envs, threads, devices, the run (folder, resume, logging, evaluation,
# checkpoints), files, and the command line.
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
        "policy_frequency",
        "train_frequency",
        "updates_per_call",
        "prefetch_size",
        "eval_every",
        "eval_episodes",
        "log_every",
        "policy_lr",
        "q_lr",
        "huber_delta",
        "per_eps",
        "alpha",
        "alpha_init",
    )
    for name in positive:
        if getattr(args, name) <= 0:
            raise ConfigError(f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}")
    if args.alpha_lr is not None and args.alpha_lr <= 0:
        raise ConfigError(f"--alpha-lr must be positive, got {args.alpha_lr}")
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
    for name in ("gamma", "tau"):
        if not 0.0 < getattr(args, name) <= 1.0:
            raise ConfigError(f"--{name.replace('_', '-')} must be in (0, 1], got {getattr(args, name)}")
    if not 0.0 <= args.per_beta0 <= 1.0:
        raise ConfigError(f"--per-beta0 must be in [0, 1], got {args.per_beta0}")
    if args.per_alpha < 0 or args.checkpoint_every < 0 or args.dataset_noise < 0:
        raise ConfigError("--per-alpha, --checkpoint-every and --dataset-noise must be >= 0")
    if args.dataset_episodes <= 0:
        raise ConfigError(f"--dataset-episodes must be positive, got {args.dataset_episodes}")
    if args.checkpoint_minutes < 0:
        raise ConfigError(f"--checkpoint-minutes must be >= 0, got {args.checkpoint_minutes}")
    if args.keep_checkpoints < 1:
        raise ConfigError(f"--keep-checkpoints must be at least 1, got {args.keep_checkpoints}")
    if args.num_devices == 0 or args.num_devices < -1:
        raise ConfigError(f"--num-devices must be positive or -1 (all local devices), got {args.num_devices}")
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
# Environment
# ---------------------------------------------------------------------------------------------


def make_env(env_id: str, num_envs: int, video: Optional[Tuple[str, str]] = None) -> gym.vector.VectorEnv:
    """A synchronous vector env in SAME_STEP autoreset mode, checked for what SAC can handle;
    with video = (folder, prefix), sub-env 0 films its first episode (see film_first_episode).

    SAME_STEP: the step that ends an episode returns the first observation of the next one and
    puts the real last observation in info["final_obs"]. The default (NEXT_STEP) would instead
    spend one extra step per episode on a reset whose transition must be thrown away.
    """
    wrappers, kwargs = ([film_first_episode(*video)], {"render_mode": "rgb_array"}) if video is not None else ([], {})
    try:
        envs = gym.make_vec(
            env_id,
            num_envs=num_envs,
            vectorization_mode="sync",
            wrappers=wrappers,
            vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP},
            **kwargs,
        )
    except gym.error.Error as e:
        raise ConfigError(f"cannot make env {env_id!r}: {e}") from None
    except ImportError as e:
        raise ConfigError(f"cannot make env {env_id!r}: {e} (pip install -r requirements.txt)") from None
    action_space = envs.single_action_space
    problem = None
    if not isinstance(action_space, gym.spaces.Box):
        problem = (
            f"{env_id} has a {type(action_space).__name__} action space; SAC needs a Box "
            "action space (use algos/dqn_prioritized.py for discrete actions)"
        )
    elif not (np.all(np.isfinite(action_space.low)) and np.all(np.isfinite(action_space.high))):
        problem = f"{env_id} has unbounded actions {action_space}; SAC's tanh policy needs finite bounds"
    elif not isinstance(envs.single_observation_space, gym.spaces.Box) or len(envs.single_observation_space.shape) != 1:
        problem = (
            f"{env_id} has observations {envs.single_observation_space}; this script takes flat vector observations"
        )
    if problem:
        envs.close()
        raise ConfigError(problem)
    return envs


def film_first_episode(folder: str, prefix: str) -> Callable[[gym.Env], gym.Env]:
    """A make_vec wrapper that films the first episode of the first sub-env it wraps (make_vec
    builds sub-env 0 first) with gymnasium's RecordVideo, into video_file((folder, prefix)); the
    env must render rgb_array frames. RecordVideo films the reset frame and one frame per step."""
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


def real_next_obs(next_obs: np.ndarray, done: np.ndarray, info: dict) -> np.ndarray:
    """The observation each step really led to. In SAME_STEP mode a finished env's next_obs is
    already the reset of its next episode; the last observation is in info["final_obs"]."""
    if not done.any():
        return next_obs
    real = next_obs.copy()
    for i in np.flatnonzero(done):
        real[i] = info["final_obs"][i]
    return real


# ---------------------------------------------------------------------------------------------
# Replay plumbing
# ---------------------------------------------------------------------------------------------


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
                        f"{first_step + int(np.argmin(finite)) + 1}; try a lower --q-lr or --policy-lr"
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
    batch: jax.sharding.NamedSharding  # batches[K, B, ...] and priorities[K, B]: split along B


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
    acting: a policy call on the replicated arrays would run on every device (measured: docs/multidevice.md).
    Take it again after each update: the update donates the state whose buffers it shares."""
    return jax.tree_util.tree_map(lambda x: x.addressable_shards[0].data, tree)


# ---------------------------------------------------------------------------------------------
# The run: folder, resume, counters, threads, logging, evaluations, checkpoints
# ---------------------------------------------------------------------------------------------


class Run:
    """Everything train() needs besides the algorithm: the run folder and args.json, a --resume
    checkpoint, the step counters, the prefetch and priority-writer threads, the devices, logging
    and the progress line,
    evaluations, checkpoints, and Ctrl-C / SIGTERM (`with run:` stops the threads however the
    loop ends)."""

    def __init__(self, args: Args, envs, replay: PrioritizedReplay, act, shardings: Shardings):
        self.args, self.envs, self.replay, self.act, self.shardings = args, envs, replay, act, shardings
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
        self.act_params = local_copy(state.actor_params)
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
        self.writer = PriorityWriter(self.replay, write=args.prioritized)  # with alpha = 0 a write changes nothing
        return state, key

    def reset(self) -> np.ndarray:
        """First observations. The envs restart on resume (their state is not checkpointed); the
        seed moves with the step so that a resumed run does not replay the episodes it began with."""
        return seed_envs(self.envs, self.args.seed + self.global_step)

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
        self.act_params = local_copy(state.actor_params)

    def log_if_due(self) -> None:
        args, step = self.args, self.global_step
        if step < self.next_log:
            return
        self.next_log += args.log_every
        now = time.perf_counter()
        window, elapsed = self.window, now - self.window["time"]
        scalars = {
            "charts/SPS": (step - window["step"]) / elapsed,
            "replay/beta": self.replay.beta,
            "replay/priority_max": self.replay.max_priority(),
            "perf/updates_per_second": (self.sgd_done - window["sgd"]) / elapsed,
        }
        if window["learn"] > 0:
            scalars["perf/learner_wait_fraction"] = window["wait"] / window["learn"]
        scalars.update({k: float(v) for k, v in self.metrics.items()})
        self.logger.scalars(step, scalars)
        self.logger.flush()
        fields = (
            f"qf_loss {scalars.get('losses/qf_loss', float('nan')):.3f}  "
            f"alpha {scalars.get('losses/alpha', float('nan')):.3f}  "
            f"episodes {self.episodes}  eval {self.last_eval if self.last_eval is not None else '-'}"
        )
        plain = step % (10 * args.log_every) < args.num_envs or step >= args.total_timesteps
        line = f"step {step:>8d}  SPS {scalars['charts/SPS']:6.0f}  {fields}"
        self.console.update(step, scalars["charts/SPS"], fields, line if plain else None)
        window.update(time=now, step=step, sgd=self.sgd_done, wait=0.0, learn=0.0)

    def evaluate(self, prefix: str) -> np.ndarray:
        video = (os.path.join(self.run_dir, "videos"), prefix) if self.args.capture_video else None
        returns = evaluate(
            self.act, self.act_params, self.args.env_id, self.args.eval_episodes, self.args.seed + 10_000, video
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
            os.path.join(run_dir, "model.npz"),
            {**self.meta, "kind": "model"},
            tree_arrays("params/", state.actor_params),
        )
        returns = self.evaluate(f"final-step-{step}")
        self.logger.close()
        write_curve(run_dir)
        if self.args.save_dataset:
            save_dataset(self.args.save_dataset, self.act, self.act_params, self.args)
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
    env_id: str,
    episodes: int,
    seed: int,
    noise: float = 0.0,
    random: bool = False,
    record: bool = False,
    video: Optional[Tuple[str, str]] = None,
) -> Tuple[np.ndarray, Optional[dict]]:
    """Returns of `episodes` episodes run as parallel envs (each contributes its first episode)
    with the deterministic policy tanh(mean) (plus N(0, noise^2) clipped to [-1, 1]), or with
    uniformly random actions; with record=True also their transitions in D4RL's flat layout
    (actions in env units), episode after episode; with video = (folder, prefix) the first
    episode is filmed to video_file(video). The same seeds every time."""
    envs = make_env(env_id, episodes, video)
    try:
        low, high = envs.single_action_space.low, envs.single_action_space.high
        obs = seed_envs(envs, seed)
        rng = np.random.default_rng(seed)
        returns = np.zeros(episodes)
        running = np.ones(episodes, bool)
        steps = []
        while running.any():
            if random:
                env_action = envs.action_space.sample()
            else:
                action = np.asarray(act(params, obs, None, None, deterministic=True))
                if noise:
                    action = np.clip(action + noise * rng.standard_normal(action.shape), -1.0, 1.0)
                env_action = to_env_action(action, low, high)
            next_obs, reward, terminated, truncated, info = envs.step(env_action)
            steps.append(
                (
                    running.copy(),
                    obs,
                    env_action,
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


def evaluate(act, params, env_id: str, episodes: int, seed: int, video: Optional[Tuple[str, str]] = None) -> np.ndarray:
    return rollout(act, params, env_id, episodes, seed, video=video)[0]


def save_dataset(path: str, act, params, args: Args) -> dict:
    """Rollouts of the policy (with --dataset-noise) in D4RL's HDF5 layout, with the reference
    returns of the normalised score in metadata/: ref_min from uniformly random actions, ref_max
    from the deterministic policy itself. Written atomically."""
    seed = args.seed + 20_000
    returns, data = rollout(
        act, params, args.env_id, args.dataset_episodes, seed, noise=args.dataset_noise, record=True
    )
    ref_min = float(rollout(act, params, args.env_id, args.dataset_episodes, seed, random=True)[0].mean())
    ref_max = float(evaluate(act, params, args.env_id, args.dataset_episodes, seed).mean())
    metadata = {
        "env_id": args.env_id,
        "algorithm": f"{SCRIPT}.py",
        "dataset_noise": args.dataset_noise,
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


def env_dims(env_id: str) -> Tuple[int, int]:
    envs = make_env(env_id, 1)
    dims = envs.single_observation_space.shape[0], envs.single_action_space.shape[0]
    envs.close()
    return dims


def run_eval_only(args: Args) -> np.ndarray:
    path = args.load if not os.path.isdir(args.load) else os.path.join(args.load, "model.npz")
    kind = "checkpoint" if os.path.basename(path).startswith("checkpoint") else "model"
    meta, arrays = load_npz(path, kind)
    saved = args_from_json(meta.get("args"), path)
    obs_dim, action_dim = env_dims(saved.env_id)
    actor = Actor(action_dim, saved.hidden_sizes)
    template = actor.init(jax.random.PRNGKey(0), jnp.zeros((1, obs_dim)))
    prefix = "train_state/actor_params/" if kind == "checkpoint" else "params/"
    params = restore_tree(template, arrays, prefix, path)
    act = make_act(actor)
    video = (os.path.join(os.path.dirname(path), "videos"), f"eval-{kind}") if args.capture_video else None
    returns = evaluate(act, params, saved.env_id, args.eval_episodes, args.seed + 10_000, video)
    print(f"eval {saved.env_id}: {returns.mean():.2f} +- {returns.std():.2f} over {len(returns)} episodes")
    if args.save_dataset:
        save_dataset(args.save_dataset, act, params, dataclasses.replace(args, env_id=saved.env_id))
    return returns


# ---------------------------------------------------------------------------------------------
# Checkpoint and model files
# ---------------------------------------------------------------------------------------------

# A checkpoint or a model is one .npz (a zip of .npy arrays) read with allow_pickle=False: a
# file someone shared can be refused, but loading it never runs code (pickle, which earlier
# versions used, runs whatever the file tells it to). Member "meta.json" holds the format tag,
# the flags and the counters as JSON; every other member is one array named by its place
# ("train_state/actor_params/params/Dense_0/kernel", "replay/obs", ...). Every name, shape and dtype
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
        hint = f" ({os.path.basename(old)} there is an earlier version's pickle; docs/reliability.md, 'Old .pkl files')"
        raise ConfigError(f"no such file: {path}" + (hint if os.path.isfile(old) else ""))
    with open(path, "rb") as f:
        if f.read(1) == b"\x80":  # pickle's PROTO opcode: a .pkl of an earlier version
            raise ConfigError(
                f"{path} is a pickle from an earlier version of {SCRIPT}.py; not loaded, "
                "since unpickling can run any code; convert a model.pkl you trust with the project's "
                "tools/convert_pkl.py (docs/reliability.md, 'Old .pkl files')"
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
        # a CartPole run at CleanRL's settings (docs/benchmarks.md, Speed).
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
    # On CPU, jax's asynchronous dispatch hands every call to another thread; for the small
    # per-step policy call that handoff costs more than the network.
    jax.config.update("jax_cpu_enable_async_dispatch", False)
    if args.eval_only:
        returns = run_eval_only(args)
        return {"eval_mean": float(returns.mean())}
    return train(args)


def cli(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = tyro.cli(Args, args=argv)
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
