"""Ape-X DQN: distributed prioritized experience replay on Ray, in one file.

What it implements
  * Ape-X (Horgan, Quan, Budden, Barth-Maron, Hessel, van Hasselt & Silver 2018, "Distributed
    Prioritized Experience Replay", arXiv:1803.00933): many actors, each with its own envs and its
    own epsilon, generate experience and compute its initial priorities themselves; one central
    prioritized replay holds it; one learner trains on it and the actors copy its parameters now
    and then. Acting and learning are decoupled: neither waits for the other.
  * The learner is algos/dqn_prioritized.py's: double DQN (van Hasselt et al. 2016,
    arXiv:1509.06461) with n-step returns, the IS-weighted Huber loss of proportional prioritized
    replay (Schaul et al. 2016, arXiv:1511.05952) in cpprb, a prefetch thread, K SGD steps fused
    per jitted call and priorities written back from another thread (as Acme's learners do,
    Hoffman et al. 2020, arXiv:2006.00979).
  * Ray (Moritz et al. 2018, arXiv:1712.05889) is the distributed engine: each actor is a Ray
    actor (a process, on any node of a cluster), experience and parameters travel through Ray's
    object store. No sockets or processes of our own.

The paper's design, and where it is here
  epsilon_i = eps^(1 + alpha * i / (N - 1)), eps = 0.4, alpha = 7, actor i of N   (Ape-X 4.1; actor_epsilon)
      (one actor: epsilon 0.4)
  actors compute initial priorities p = |delta| from their own n-step transitions with their own
      copy of the network (Ape-X 3, Algorithm 1 line 9): no max-priority insert   (Actor.collect)
  actors send transitions in chunks of B (Ape-X: B = 50)                        (--chunk-size)
  actors copy the learner's parameters every so many of their steps (Ape-X: every 400 frames,
      i.e. 100 agent steps)                                                      (--param-sync-every)
  the replay evicts the oldest first (FIFO; Ape-X removes the oldest in batches every 100 learning
      steps, cpprb's ring overwrites the oldest row by row: the same policy)     (PrioritizedReplay)
  the learner samples by priority, learns, and writes |delta| back (Algorithm 2)  (train, LEARN)

Update equations (the learner; one SGD step on B transitions i, each spanning k_i <= n steps)
  G_i      = sum_{j<k_i} gamma^j r_{t+j}
  d_i      = gamma^{k_i} * (1 - terminated_i)                  (truncation still bootstraps)
  y_i      = G_i + d_i * Q(s'_i, argmax_a Q(s'_i, a; theta); theta_target)
  delta_i  = y_i - Q(s_i, a_i; theta)
  L(theta) = (1/B) sum_i w_i * huber(delta_i)
  P(i)     = p_i^alpha / sum_j p_j^alpha,  p_i = |delta_i| + eps  (an actor's |delta| on insert)
  w_i      = (N P(i))^-beta / max_{j in minibatch} (N P(j))^-beta
  beta     linear from --per-beta0 to --per-beta1 over --total-timesteps (Ape-X: 0.4, constant)
  theta_target <- theta   every --target-network-frequency SGD steps.
  An actor computes the same delta_i with its copies of theta and theta_target, which may be a
  few updates old: that staleness is the paper's, too.

The replay ratio
  The paper's learner runs as fast as it can. On a laptop the learner and the actors share a few
  cores, so --train-frequency caps the learner at one SGD step per that many env steps received:
  when it runs ahead it waits for data; when it falls behind, the ratio falls and the actors do
  not wait (perf/replay_ratio reports what was reached). 0 removes the cap, as in the paper.

Where the replay lives
  In the learner's process: chunks arrive as the results of the actors' requests, the learner
  adds them between updates and samples from memory. A replay of its own (a Ray actor) would add a
  round trip through the object store to every sample; measured side by side: docs/apex.md.

Faults
  Actors are Ray actors that Ray restarts when they die (max_restarts), running the request that
  was in flight again on the new process (max_task_retries); the run goes on. What is lost is that
  actor's unsent chunk (at most --chunk-size transitions and the n-step tail of its episodes in
  progress). The learner checkpoints as the other scripts do (.npz and JSON, written atomically)
  and --resume continues a run; the actors start new episodes then.

Map of this file
  Part 1, the algorithm: Args, ATARI_PRESET, QNetwork, NStepAssembler, PrioritizedReplay, the
  learner (double_q_td, make_update), acting (make_act, actor_epsilon, Actor) and train(), the
  loop. Part 2, the machinery, which a reader may skip: flag checks, envs, Ray, the prefetch and
  priority threads, Run (folder, resume, actors, counters, logging, evaluation, checkpoints),
  files, the command line.

Run
  python algos/apex_dqn.py                               # local Ray, actors as the cores allow, CartPole-v1
  python algos/apex_dqn.py --num-actors 4 --seed 2
  python algos/apex_dqn.py --ray-address HEAD_IP:6379    # join a running Ray cluster instead
  python algos/apex_dqn.py --resume runs/<run>           # continue an interrupted run
  python algos/apex_dqn.py --env-id ALE/Pong-v5 --preset atari --ray-address HEAD_IP:6379 --num-actors 256
  python algos/apex_dqn.py --help                        # every flag

Outputs (runs/<env_id>__apex_dqn__<seed>__<unix_time>/)
  args.json, eval.csv (step, mean, std, episodes), actors.json (each actor's epsilon, process id
  and restarts), tensorboard events: charts/episodic_return, charts/episodic_length, charts/SPS
  (env steps/s over all actors), losses/td_loss, losses/q_values, eval/episodic_return(_std),
  replay/beta, replay/priority_max, replay/size, perf/updates_per_second,
  perf/learner_wait_fraction, perf/replay_ratio, apex/actor_restarts, apex/param_lag (learner SGD
  steps since the parameters a chunk was acted with); checkpoint.npz (latest, atomic) and
  model.npz (final parameters), arrays and JSON read without pickle; a plain console line every
  10 --log-every.
"""

from __future__ import annotations

import os

# Read by jax when it initialises its backend, so set before `import jax` (see dqn_prioritized.py).
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import collections
import concurrent.futures
import contextlib
import csv
import dataclasses
import functools
import itertools
import json
import math
import signal
import socket
import sys
import threading
import time
import warnings
from dataclasses import dataclass
from typing import Annotated, Any, Literal, NamedTuple, Optional, Tuple

import cpprb
import flax.linen as nn
import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pydantic
import rlax
import tyro
from pydantic import Field

SCRIPT = "apex_dqn"
FORMAT = f"{SCRIPT}/1"  # of checkpoint.npz and model.npz


# =============================================================================================
# PART 1: THE ALGORITHM
# Flags, network, n-step returns, prioritized replay, loss and update, actors, and the loop.
# =============================================================================================


# The ranges of the flags, held by pydantic to the command line and to a run folder's args.json alike.
Count = Annotated[int, Field(ge=1, lt=2**31)]
Envs = Annotated[int, Field(ge=1, le=1024)]
Positive = Annotated[float, Field(gt=0, le=1e30)]
Fraction = Annotated[float, Field(ge=0, le=1)]
Widths = Annotated[Tuple[Annotated[int, Field(ge=1, le=65_536)], ...], Field(min_length=1, max_length=16)]
Steps = Annotated[int, Field(ge=0, lt=2**31)]


@dataclass
class Args:
    # Algorithm
    env_id: str = "CartPole-v1"
    """gymnasium id with Discrete actions (vectors, uint8 images or MinAtar's bool planes, as in dqn_prioritized.py)"""
    preset: Optional[Literal["atari"]] = None
    """start from the Ape-X paper's Atari hyper-parameters (ATARI_PRESET); other flags still win"""
    seed: Annotated[int, Field(ge=0, lt=2**31)] = 1
    """seed of the learner's network, the actors' envs (seed + 10007 i) and the evaluation envs"""
    total_timesteps: Annotated[int, Field(ge=1, lt=2**40)] = 100_000
    """environment steps, summed over all actors"""
    hidden_sizes: Widths = (120, 84)
    """hidden layer widths (after the convolutions for images)"""
    dueling: bool = False
    """dueling heads, V(s) + A(s, a) - mean_a A(s, a) (Wang et al. 2016; Ape-X's network)"""
    optimizer: Literal["adam", "rmsprop"] = "adam"
    """Adam, or centred RMSProp (Ape-X's optimiser; --preset atari)"""
    learning_rate: Positive = 1e-3
    """the optimiser's step size"""
    adam_eps: Positive = 1e-8
    """Adam's epsilon"""
    rmsprop_decay: Annotated[float, Field(gt=0, lt=1)] = 0.95
    """RMSProp: decay of the running averages of the gradient and its square"""
    rmsprop_eps: Positive = 0.01
    """RMSProp: added to the root of the centred second moment"""
    anneal_lr: bool = True
    """decay the learning rate linearly to 0 over --total-timesteps (env steps received)"""
    max_grad_norm: Positive = 10.0
    """clip the global gradient norm to this"""
    batch_size: Count = 128
    """transitions per SGD step"""
    gamma: Annotated[float, Field(gt=0, le=1)] = 0.99
    """discount factor"""
    n_step: Annotated[int, Field(ge=1, le=1000)] = 3
    """rewards per return (Ape-X: 3)"""
    huber_delta: Positive = 1.0
    """Huber loss threshold"""
    clip_reward: Optional[Positive] = None
    """clip each reward to [-c, c] before the n-step sum; logged returns stay the env's"""
    terminal_on_life_loss: bool = True
    """envs with info["lives"] (ALE): a lost life ends the return for learning"""
    max_episode_frames: Count = 108_000
    """ALE only: emulator frames after which an episode is truncated (108k = 30 minutes)"""
    target_network_frequency: Count = 500
    """SGD steps between copies of the online network into the target network"""
    learning_starts: Steps = 1_000
    """replay rows before the learner starts"""
    train_frequency: Steps = 2
    """at most one SGD step per this many env steps received (the learner waits for data when it
    runs ahead); 0: no cap, the learner runs as fast as it can (the paper)"""
    # Ape-X actors
    num_actors: Annotated[int, Field(ge=-1, le=100_000)] = -1
    """actor processes; -1: one per core the learner leaves free, at least 2"""
    num_envs: Envs = 1
    """environments per actor"""
    actor_epsilon_base: Annotated[float, Field(gt=0, le=1)] = 0.4
    """eps of epsilon_i = eps^(1 + alpha i / (N - 1)) (Ape-X: 0.4)"""
    actor_epsilon_alpha: Annotated[float, Field(ge=0, le=1000)] = 7.0
    """alpha of epsilon_i = eps^(1 + alpha i / (N - 1)) (Ape-X: 7)"""
    chunk_size: Count = 50
    """transitions an actor gathers before it sends them, with their priorities (Ape-X: 50)"""
    param_sync_every: Count = 100
    """actor steps between copies of the learner's parameters (Ape-X: 400 frames = 100 steps)"""
    ray_address: Optional[Annotated[str, Field(min_length=1)]] = None
    """join this Ray cluster (e.g. HEAD_IP:6379, or 'auto') instead of starting a local Ray"""
    # Replay
    buffer_size: Count = 50_000
    """replay capacity in transitions; the oldest go first"""
    prioritized: bool = True
    """prioritized replay; --no-prioritized samples uniformly through the same code (alpha = 0)"""
    per_alpha: Fraction = 0.6
    """priority exponent alpha"""
    per_beta0: Fraction = 0.4
    """importance-sampling exponent beta at the start ..."""
    per_beta1: Fraction = 1.0
    """... and at the end of the run, linearly in between (Ape-X kept 0.4 throughout)"""
    per_eps: Positive = 1e-6
    """added to |TD| so that no transition has zero probability"""
    # Learner
    updates_per_call: Annotated[int, Field(ge=1, le=10_000)] = 32
    """SGD steps fused in one jitted call"""
    prefetch_size: Annotated[int, Field(ge=1, le=64)] = 2
    """calls' worth of batches the prefetch thread keeps ready on the device"""
    # Run and output
    eval_every: Count = 10_000
    """environment steps between evaluations (by the learner, greedy, on its own envs)"""
    eval_episodes: Envs = 10
    """episodes per evaluation, run as parallel envs"""
    eval_epsilon: Fraction = 0.0
    """epsilon of the evaluation policy"""
    checkpoint_every: Steps = 50_000
    """environment steps between checkpoints (0: none by steps)"""
    checkpoint_minutes: Annotated[float, Field(ge=0)] = 30.0
    """also checkpoint when this many minutes passed since the last one (0: never by time)"""
    checkpoint_replay: bool = True
    """include the replay buffer and its priorities in checkpoints"""
    log_every: Count = 1_000
    """environment steps between tensorboard scalars; the console line is every 10 of these"""
    run_dir: Optional[str] = None
    """output folder; default runs/<env_id>__apex_dqn__<seed>__<unix_time>"""
    resume: Optional[str] = None
    """run folder to continue: its flags, overridden by those typed here; writes there"""

    __pydantic_config__ = pydantic.ConfigDict(strict=True, allow_inf_nan=False)


# --preset atari: Ape-X DQN on Atari (Horgan et al. 2018, section 4.1 and appendix; the rest as
# in the DQN papers: 4 frames per step, reward clipping, 84x84x4 stacks). Meant for a cluster:
# the paper ran 360 actors on CPUs and one learner on a GPU.
ATARI_PRESET = dict(
    total_timesteps=5_700_000_000,  # 22.8B frames in 5 days (Ape-X, Figure 2), 4 frames a step
    num_actors=360,  # Ape-X 4.1
    buffer_size=2_000_000,  # replay capacity 2M (Ape-X, appendix)
    batch_size=512,  # Ape-X, appendix
    n_step=3,
    gamma=0.99,
    optimizer="rmsprop",  # centred RMSProp (Ape-X, appendix) ...
    learning_rate=0.00025 / 4,  # ... lr 0.00025 / 4 ...
    rmsprop_decay=0.95,  # ... decay 0.95 ...
    rmsprop_eps=1.5e-7,  # ... epsilon 1.5e-7, no momentum
    anneal_lr=False,
    max_grad_norm=40.0,  # gradient norms clipped to 40 (Ape-X, appendix)
    target_network_frequency=2_500,  # target network updated every 2500 training batches
    learning_starts=50_000,  # Ape-X does not say; Nature DQN's replay start size
    train_frequency=0,  # the learner runs free
    dueling=True,  # dueling network (Ape-X, appendix), with double Q-learning
    hidden_sizes=(512,),  # the dueling network's 512-unit streams
    per_alpha=0.6,  # Ape-X, appendix
    per_beta0=0.4,
    per_beta1=0.4,  # constant beta 0.4
    chunk_size=50,  # local buffer B = 50 (Ape-X 4.1)
    param_sync_every=100,  # parameters copied every 400 frames
    clip_reward=1.0,
    eval_epsilon=0.0,
    eval_every=10_000_000,
    eval_episodes=8,
    checkpoint_every=50_000_000,
    log_every=100_000,
)  # Ape-X's frames per step, no-op starts and 108k-frame episodes: dqn_prioritized.py's pipeline
PRESETS = {"atari": ATARI_PRESET}


# ---------------------------------------------------------------------------------------------
# Network
# ---------------------------------------------------------------------------------------------


class QNetwork(nn.Module):
    """Q(s, .): an MLP on vectors; the Nature DQN convolutions on stacked frames [B, 4, H, W];
    the MinAtar paper's convolution on bool planes [B, H, W, C] (planes=True). With dueling=True
    the last hidden layer feeds two streams, V and A (Wang et al. 2016, arXiv:1511.06581)."""

    num_actions: int
    hidden_sizes: Tuple[int, ...]
    planes: bool = False
    dueling: bool = False

    @nn.compact
    def __call__(self, obs: jax.Array) -> jax.Array:
        if self.planes:
            x = nn.relu(nn.Conv(16, (3, 3), (1, 1), padding="VALID")(obs.astype(jnp.float32)))
            x = x.reshape((x.shape[0], -1))
        elif obs.ndim == 4:
            x = jnp.transpose(obs, (0, 2, 3, 1)).astype(jnp.float32) / 255.0
            for features, kernel, stride in ((32, 8, 4), (64, 4, 2), (64, 3, 1)):
                x = nn.relu(nn.Conv(features, (kernel, kernel), (stride, stride), padding="VALID")(x))
            x = x.reshape((x.shape[0], -1))
        else:
            x = obs.astype(jnp.float32)
        if not self.dueling:
            for width in self.hidden_sizes:
                x = nn.relu(nn.Dense(width)(x))
            return nn.Dense(self.num_actions)(x)
        value, advantage = x, x  # each stream has its own hidden layers
        for width in self.hidden_sizes:
            value, advantage = nn.relu(nn.Dense(width)(value)), nn.relu(nn.Dense(width)(advantage))
        advantage = nn.Dense(self.num_actions)(advantage)
        return nn.Dense(1)(value) + advantage - advantage.mean(axis=-1, keepdims=True)


# ---------------------------------------------------------------------------------------------
# Replay: n-step assembly (in the actors) and the prioritized buffer (in the learner)
# ---------------------------------------------------------------------------------------------


class NStepAssembler:
    """Turns per-step transitions of num_envs parallel streams into n-step transitions (the same
    rules as dqn_prioritized.py's): the oldest pending step once n are pending; every pending
    step, each with its own k <= n rewards and the real final observation, when the episode ends;
    discount gamma^k, or 0 if the episode terminated (a truncation bootstraps)."""

    def __init__(self, n: int, gamma: float, num_envs: int, obs_shape, obs_dtype, clip_reward: Optional[float] = None):
        self.n, self.clip_reward = n, clip_reward
        self.powers = gamma ** np.arange(n + 1, dtype=np.float64)
        self.obs = np.zeros((n, num_envs) + tuple(obs_shape), obs_dtype)
        self.action = np.zeros((n, num_envs), np.int64)
        self.reward = np.zeros((n, num_envs), np.float32)
        self.pending = np.zeros(num_envs, np.int64)
        self.t = 0  # steps pushed so far; step s lives in ring slot s % n

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
        """Add one vector step (next_obs: the real final observation where done); returns the
        transitions it completes, as new arrays, or None."""
        if self.clip_reward is not None:
            reward = np.clip(reward, -self.clip_reward, self.clip_reward)
        slot = self.t % self.n
        self.obs[slot], self.action[slot], self.reward[slot] = obs, action, reward
        self.t += 1
        done = terminated | truncated
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
        return concat(parts) if parts else None


def concat(parts: list) -> dict:
    """Dicts of arrays joined key by key."""
    return {key: np.concatenate([p[key] for p in parts]) for key in parts[0]}


class PrioritizedReplay:
    """Proportional prioritized replay (Schaul et al. 2016) on cpprb's PrioritizedReplayBuffer,
    filled by the actors' chunks.

    The PER rules, and where they are:
      * new transitions enter with the actor's p = |delta| (Ape-X), not max_j p_j     (add)
      * P(i) = p_i^alpha / sum_j p_j^alpha, one stratified draw of B per minibatch (sample)
      * w_i = (N P(i))^-beta / max_{j in minibatch} w_j                            (sample)
      * after learning, p_i = |delta_i| + eps                                      (update_priorities)
    As in dqn_prioritized.py: one lock for the three threads that touch cpprb (the loop adds, the
    prefetch thread samples, the writer thread updates), and write_count[slot] so that a |TD|
    computed for an overwritten slot never lands on the transition that replaced it.
    """

    KEYS = ("obs", "action", "reward", "next_obs", "discount")

    def __init__(self, capacity: int, obs_shape, obs_dtype, alpha: float, eps: float):
        self.capacity, self.prioritized = capacity, alpha > 0
        self.shapes = {
            "obs": tuple(obs_shape),
            "next_obs": tuple(obs_shape),
            "action": (),
            "reward": (),
            "discount": (),
        }
        self.dtypes = {"obs": obs_dtype, "next_obs": obs_dtype, "action": np.int64}
        self.dtypes.update(reward=np.float32, discount=np.float32)
        spec = {k: {"shape": self.shapes[k] or 1, "dtype": self.dtypes[k]} for k in self.KEYS}  # cpprb: 1, not ()
        self.buffer = cpprb.PrioritizedReplayBuffer(capacity, spec, alpha=alpha, eps=eps)
        self.lock = threading.Lock()
        self.write_count = np.zeros(capacity, np.int64)
        self.priority = np.zeros(capacity, np.float64)
        self.beta = 0.4  # set by the loop; read by whoever samples

    def add(self, rows: dict, priorities: np.ndarray) -> None:
        """Insert a chunk at the priorities its actor computed (+ eps, by cpprb)."""
        priorities = np.asarray(priorities, np.float64)
        if not np.all(np.isfinite(priorities) & (priorities >= 0)):  # one NaN would poison cpprb's tree
            raise RunFailed("an actor sent non-finite priorities: its parameters diverged")
        with self.lock:
            slots = (self.buffer.get_next_index() + np.arange(len(priorities))) % self.capacity
            self.buffer.add(**{k: rows[k] for k in self.KEYS}, priorities=priorities)
            np.add.at(self.write_count, slots, 1)
            self.priority[slots] = priorities

    def sample(self, batch_size: int, num_batches: int) -> Tuple[dict, np.ndarray, np.ndarray]:
        """num_batches minibatches, each its own stratified draw over the whole buffer (PER's rule
        per minibatch; see dqn_prioritized.py), flat. Returns (batch with 'weights', slots, their
        write counts)."""
        beta = self.beta
        with self.lock:
            draws = []
            for _ in range(num_batches):
                draw = self.buffer.sample(batch_size, beta=beta)
                # cpprb returns indexes and weights in arrays that its next sample() overwrites.
                draw["indexes"], draw["weights"] = draw["indexes"].astype(np.int64), draw["weights"].copy()
                draws.append(draw)
            batch = concat(draws)
            indexes = batch.pop("indexes")
            stamps = self.write_count[indexes]
        batch["action"] = batch["action"].reshape(-1)
        for key in ("reward", "discount", "weights"):
            batch[key] = batch[key].reshape(-1).astype(np.float32)
        weights = batch["weights"].reshape(num_batches, batch_size)  # w_i / max_{j in minibatch} w_j
        batch["weights"] = (weights / weights.max(axis=1, keepdims=True)).reshape(-1)
        return batch, indexes, stamps

    def update_priorities(self, indexes: np.ndarray, stamps: np.ndarray, priorities: np.ndarray) -> int:
        """p_i = |delta_i| (+ eps) where the slot still holds the sampled transition; returns the
        rows kept."""
        with self.lock:
            fresh = self.write_count[indexes] == stamps
            if fresh.any():
                self.buffer.update_priorities(indexes[fresh], priorities[fresh])
                self.priority[indexes[fresh]] = priorities[fresh]
        return int(fresh.sum())

    def size(self) -> int:
        with self.lock:
            return int(self.buffer.get_stored_size())

    def max_priority(self) -> float:
        with self.lock:
            return float(self.buffer.get_max_priority())

    def state_dict(self) -> dict:
        """Flat arrays, named as in the checkpoint file."""
        with self.lock:
            stored = self.buffer.get_stored_size()
            rows = self.buffer.get_all_transitions() if stored else {}
            state = {
                f"replay/{k}": rows.get(k, np.zeros((0,) + (self.shapes[k] or (1,)), self.dtypes[k])) for k in self.KEYS
            }
            state["replay/priority"] = self.priority[:stored].copy()
            state["replay/next_index"] = np.asarray(self.buffer.get_next_index(), np.int64)
        return state

    def load_state_dict(self, arrays: dict, path: str) -> None:
        """Check every array against this replay's layout (the file may be hostile), then rebuild
        cpprb slot by slot, so that the rows, their priorities and the insert position match."""
        prio = arrays.get("replay/priority")
        stored = len(prio) if isinstance(prio, np.ndarray) and prio.ndim == 1 else -1
        if not 0 <= stored <= self.capacity:
            raise ConfigError(f"{path}: replay/priority is not a vector of at most --buffer-size {self.capacity} rows")
        checked_array(arrays, "replay/priority", (stored,), np.float64, path)
        k = int(checked_array(arrays, "replay/next_index", (), np.int64, path))
        if not (np.isfinite(prio).all() and (prio >= 0).all() and 0 <= k < self.capacity):
            raise ConfigError(f"{path}: the replay's priorities or insert position are out of range")
        if not (k == stored % self.capacity or stored == self.capacity):
            raise ConfigError(f"{path}: the replay's insert position does not match its rows")
        data = {
            key: checked_array(arrays, f"replay/{key}", (stored,) + (self.shapes[key] or (1,)), self.dtypes[key], path)
            for key in self.KEYS
        }
        with self.lock:
            self.buffer.clear()
            if stored:
                self.buffer.add(**data, priorities=prio)
                if stored == self.capacity and k:  # rewrite [0, k) so that the next insert goes to k
                    self.buffer.add(**{key: v[:k] for key, v in data.items()}, priorities=prio[:k])
                self.priority[:stored] = prio
            self.write_count[:] = 0


# ---------------------------------------------------------------------------------------------
# Learner
# ---------------------------------------------------------------------------------------------


class TrainState(NamedTuple):
    params: Any
    target_params: Any
    opt_state: Any
    sgd_steps: jax.Array


def make_optimizer(args: Args) -> optax.GradientTransformation:
    """The update's direction, without its step size: the learner's pace is not tied to the env
    steps (it runs free, or waits for data), so the learning rate, annealed over env steps as
    beta is, is an input of each update call (make_update) rather than a schedule of SGD steps."""
    if args.optimizer == "rmsprop":  # centred RMSProp, eps outside the root
        step = optax.scale_by_stddev(decay=args.rmsprop_decay, eps=args.rmsprop_eps, eps_in_sqrt=False)
    else:
        step = optax.scale_by_adam(eps=args.adam_eps)
    return optax.chain(optax.clip_by_global_norm(args.max_grad_norm), step)


def double_q_td(q_apply, params, target_params, batch: dict) -> Tuple[jax.Array, jax.Array]:
    """(delta_i, Q(s_i, .)): double-Q n-step TD errors. The learner's loss and the actors'
    initial priorities both come from here, so the two cannot disagree on what |delta| is."""
    q_tm1 = q_apply(params, batch["obs"])
    q_t_selector = q_apply(jax.lax.stop_gradient(params), batch["next_obs"])  # selects a*; no gradient
    q_t_value = q_apply(target_params, batch["next_obs"])  # evaluates it
    td = jax.vmap(rlax.double_q_learning)(
        q_tm1, batch["action"], batch["reward"], batch["discount"], q_t_value, q_t_selector
    )
    return td, q_tm1


def double_q_loss(q_apply, params, target_params, batch: dict, huber_delta: float):
    """IS-weighted Huber loss; returns (loss, (td, mean Q(s, a)))."""
    td, q_tm1 = double_q_td(q_apply, params, target_params, batch)
    loss = jnp.mean(batch["weights"] * rlax.huber_loss(td, huber_delta))
    return loss, (td, jnp.take_along_axis(q_tm1, batch["action"][:, None], axis=1).mean())


def make_update(q_apply, optimizer, args: Args, unroll: bool = False):
    """jit(state, batches[K, B, ...], lr) -> (state, metrics, |TD|[K, B]): K SGD steps in one call
    (a lax.scan, or unrolled for convolutions on CPU, which XLA runs slower inside a loop)."""

    def sgd_step(state: TrainState, batch: dict, lr):
        grad_fn = jax.value_and_grad(double_q_loss, argnums=1, has_aux=True)
        (loss, (td, q_mean)), grads = grad_fn(q_apply, state.params, state.target_params, batch, args.huber_delta)
        direction, opt_state = optimizer.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, jax.tree_util.tree_map(lambda d: -lr * d, direction))
        sgd_steps = state.sgd_steps + 1
        target_params = optax.periodic_update(params, state.target_params, sgd_steps, args.target_network_frequency)
        # Non-finite new parameters report NaN priorities: the priority writer stops the run.
        td = jnp.where(jnp.isfinite(optax.global_norm(params)), td, jnp.nan)
        return TrainState(params, target_params, opt_state, sgd_steps), (loss, q_mean, td)

    def update(state: TrainState, batches: dict, lr):
        if unroll:
            steps = []
            for k in range(batches["action"].shape[0]):
                state, out = sgd_step(state, jax.tree_util.tree_map(lambda x, k=k: x[k], batches), lr)
                steps.append(out)
            loss, q_mean, td = (jnp.stack(column) for column in zip(*steps))
        else:
            state, (loss, q_mean, td) = jax.lax.scan(lambda st, b: sgd_step(st, b, lr), state, batches)
        return state, {"losses/td_loss": loss.mean(), "losses/q_values": q_mean.mean()}, jnp.abs(td)

    return jax.jit(update, donate_argnums=0)


def init_train_state(network: QNetwork, optimizer, obs_shape, key) -> TrainState:
    params = network.init(key, jnp.zeros((1,) + tuple(obs_shape), jnp.float32))
    target_params = jax.tree_util.tree_map(jnp.copy, params)  # a copy: the update donates its state
    return TrainState(params, target_params, optimizer.init(params), jnp.zeros((), jnp.int32))


# ---------------------------------------------------------------------------------------------
# Acting: the actors
# ---------------------------------------------------------------------------------------------


def make_act(q_apply, num_actions: int):
    """jit(params, obs[N], epsilon, key, step) -> actions[N], epsilon-greedy (one uniform per env
    decides whether to explore and, rescaled, which action)."""

    def act(params, obs, epsilon, key, step):
        u = jax.random.uniform(jax.random.fold_in(key, step), (obs.shape[0],))
        greedy = jnp.argmax(q_apply(params, obs), axis=-1)
        random = jnp.minimum((u / epsilon * num_actions).astype(greedy.dtype), num_actions - 1)
        return jnp.where(u < epsilon, random, greedy)

    return jax.jit(act)


def actor_epsilon(i: int, num_actors: int, base: float = 0.4, alpha: float = 7.0) -> float:
    """Ape-X's exploration ladder: epsilon_i = base^(1 + alpha i / (N - 1)), from base (actor 0)
    down to base^(1 + alpha) (actor N - 1: 0.4^8 = 0.00066). One actor explores with base."""
    return base ** (1.0 + alpha * i / (num_actors - 1)) if num_actors > 1 else base


class Actor:
    """One Ape-X actor: its own vector env, its own epsilon, its own n-step assembly, and a copy
    of the learner's parameters. Ray runs it as an actor process (ray.remote(Actor), Part 2);
    tests call it directly.

    collect() steps the envs until a chunk of at least --chunk-size n-step transitions is ready,
    then computes their priorities |delta| with its copy of the online and target networks, and
    returns them with the episodes that ended. Its argument is a one-element list holding the
    learner's latest (version, (params, target_params)), or a Ray reference to it: inside a list,
    Ray does not fetch it, so an actor pays for the transfer only when its sync is due.
    """

    def __init__(self, args: Args, index: int, num_actors: int, seed: int):
        jax.config.update("jax_cpu_enable_async_dispatch", False)  # tiny calls: see dqn_prioritized.py
        if restarted_by_ray():  # a new process for one that died: not the same episodes and draws again
            seed = int(np.random.SeedSequence([seed, os.getpid()]).generate_state(1)[0] % 2**31)
        self.args = args
        self.epsilon = actor_epsilon(index, num_actors, args.actor_epsilon_base, args.actor_epsilon_alpha)
        self.envs = make_env(args.env_id, args.num_envs, args.max_episode_frames)
        space, num_actions = self.envs.single_observation_space, int(self.envs.single_action_space.n)
        network = QNetwork(num_actions, args.hidden_sizes, planes=is_planes(space), dueling=args.dueling)
        self.act = make_act(network.apply, num_actions)
        self.td = jax.jit(functools.partial(double_q_td, network.apply))
        self.nstep = NStepAssembler(args.n_step, args.gamma, args.num_envs, space.shape, space.dtype, args.clip_reward)
        # Rows per chunk, padded to one size so that the priority function compiles once: a step
        # can end every env's episode and emit n rows per env.
        self.padded = args.chunk_size - 1 + args.num_envs * args.n_step
        self.key = jax.random.PRNGKey(seed)
        self.obs = seed_envs(self.envs, seed)
        self.steps, self.since_sync, self.params, self.version = 0, math.inf, None, -1
        self.ep_return, self.ep_length = np.zeros(args.num_envs), np.zeros(args.num_envs, np.int64)
        self.lives = None

    def collect(self, latest: list) -> dict:
        args, steps_before = self.args, self.steps
        if self.since_sync >= args.param_sync_every:  # copy the learner's parameters
            params = latest[0]
            if not isinstance(params, tuple):  # a Ray reference: fetched only now
                import ray

                params = ray.get(params)
            self.version, self.params = params
            self.since_sync = 0
        online, target = self.params
        parts, rows, episodes = [], 0, []
        while rows < args.chunk_size:
            actions = np.asarray(self.act(online, self.obs, np.float32(self.epsilon), self.key, np.int32(self.steps)))
            next_obs, reward, terminated, truncated, info = self.envs.step(actions)
            done = terminated | truncated
            ends_return = terminated
            if args.terminal_on_life_loss and "lives" in info:  # ALE: a lost life ends the return
                lost, self.lives = lost_life(info, self.lives, done)
                ends_return = terminated | lost
            out = self.nstep.push(
                self.obs, actions, reward, real_next_obs(next_obs, done, info), ends_return, truncated
            )
            if out is not None:
                parts.append(out)
                rows += len(out["action"])
            self.ep_return += reward
            self.ep_length += 1
            for i in np.flatnonzero(done):
                episodes.append((float(self.ep_return[i]), int(self.ep_length[i])))
            self.ep_return[done], self.ep_length[done] = 0.0, 0
            self.obs = next_obs
            self.steps += 1
            self.since_sync += 1
        chunk = concat(parts)
        padded = {key: np.resize(v, (self.padded,) + v.shape[1:]) for key, v in chunk.items()}
        td, _ = self.td(online, target, padded)
        return {
            "transitions": chunk,
            "priorities": np.abs(np.asarray(td, np.float64))[:rows],
            "env_steps": (self.steps - steps_before) * args.num_envs,
            "episodes": episodes,
            "version": self.version,
            "epsilon": self.epsilon,
            "pid": os.getpid(),
        }


def linear_schedule(start: float, end: float, duration: float, t: float) -> float:
    """start -> end linearly over `duration`, then end."""
    return end + (start - end) * max(0.0, 1.0 - t / duration)


# ---------------------------------------------------------------------------------------------
# Training loop: the learner
# ---------------------------------------------------------------------------------------------


def train(args: Args) -> dict:
    """Train with Args as parse_args gives them (with --resume: the run's flags, merged there).
    Returns {run_dir, global_step, eval_mean, sgd_steps, actor_restarts}, or {..., signal}."""
    args = check_args(args)
    jax.config.update("jax_cpu_enable_async_dispatch", False)  # the tiny policy call costs less without it
    env_fn = functools.partial(make_env, args.env_id, max_episode_frames=args.max_episode_frames)
    probe = env_fn(1)
    num_actions, obs_space = int(probe.single_action_space.n), probe.single_observation_space
    probe.close()
    network = QNetwork(num_actions, args.hidden_sizes, planes=is_planes(obs_space), dueling=args.dueling)
    optimizer = make_optimizer(args)
    key, init_key = jax.random.split(jax.random.PRNGKey(args.seed))
    state = init_train_state(network, optimizer, obs_space.shape, init_key)
    replay = PrioritizedReplay(
        args.buffer_size, obs_space.shape, obs_space.dtype, args.per_alpha if args.prioritized else 0.0, args.per_eps
    )
    act = make_act(network.apply, num_actions)
    update = make_update(
        network.apply, optimizer, args, unroll=len(obs_space.shape) == 3 and jax.default_backend() == "cpu"
    )
    # Ray and the actors, the run folder, a --resume checkpoint, logging, the prefetch and priority
    # threads, evaluations and checkpoints: Part 2. The loop below is the learner.
    run = Run(args, env_fn, replay, act)
    state, key = run.restore(state, key)
    lr_end = 0.0 if args.anneal_lr else args.learning_rate
    with run:
        run.start_actors(state)
        while run.global_step < args.total_timesteps and not run.stopped:
            # STORE: every chunk that has arrived, at the priorities its actor computed; the actor
            # gets its next request (with the newest parameters) before its chunk is stored.
            for chunk in run.arrived_chunks(state):
                replay.add(chunk["transitions"], chunk["priorities"])

            # LEARN: K SGD steps per jitted call; batches from the prefetch thread, priorities back
            # on another thread.
            for _ in range(run.update_calls_due()):
                replay.beta = linear_schedule(args.per_beta0, args.per_beta1, args.total_timesteps, run.global_step)
                lr = linear_schedule(args.learning_rate, lr_end, args.total_timesteps, run.global_step)
                batches, indexes, stamps = run.next_batches()
                state, metrics, priorities = update(state, batches, np.float32(lr))
                run.learned(state, metrics, indexes, stamps, priorities)

            run.log_if_due()
            run.evaluate_if_due(state)
            run.checkpoint_if_due(state, key)
    return run.finish(state, key)


# =============================================================================================
# PART 2: THE MACHINERY
# What the algorithm needs to run, and nothing of the algorithm: a reader learning Ape-X can
# stop here. Flag checks, envs, Ray, threads, the run (folder, resume, actors, logging,
# evaluation, checkpoints), files, and the command line.
# =============================================================================================


# ---------------------------------------------------------------------------------------------
# Errors and flag checks
# ---------------------------------------------------------------------------------------------


class ConfigError(Exception):
    """Bad input from the user: reported as one line, without a traceback."""


class RunFailed(Exception):
    """The run cannot go on (a checkpoint that cannot be written, divergence, an actor that keeps
    failing): one line, exit 1."""


def check_args(args: Args) -> Args:
    """args_from_json's checks, for Args from the command line or from code."""
    return args_from_json(dataclasses.asdict(args))


# ---------------------------------------------------------------------------------------------
# Environments
# ---------------------------------------------------------------------------------------------

FRAME_STACK = 4  # frames per image observation (Nature DQN)


def is_planes(space: gym.Space) -> bool:
    """MinAtar's bool feature planes (H, W, C): told apart by the space, never by the env's name."""
    return isinstance(space, gym.spaces.Box) and space.dtype == np.bool_ and len(space.shape) == 3


def is_image(space: gym.Space) -> bool:
    """Grey (H, W) or RGB (H, W, 3) uint8 images."""
    return (
        isinstance(space, gym.spaces.Box)
        and space.dtype == np.uint8
        and (len(space.shape) == 2 or (len(space.shape) == 3 and space.shape[2] == 3))
    )


def image_pipeline(probe: gym.Env, max_episode_frames: int) -> Tuple[list, dict]:
    """(wrappers, env kwargs) giving 84x84 grey frames stacked by 4; ALE games get gymnasium's
    AtariPreprocessing (no-op starts, 4 frames per step with the max of the last two). The replay
    keeps the stacks as uint8 pixels (56 KB per transition: docs/apex.md)."""
    from gymnasium import wrappers

    stack = functools.partial(wrappers.FrameStackObservation, stack_size=FRAME_STACK)
    if hasattr(probe.unwrapped, "ale"):
        preprocess = functools.partial(wrappers.AtariPreprocessing, noop_max=30, frame_skip=4, screen_size=84)
        return [preprocess, stack], {"frameskip": 1, "max_num_frames_per_episode": max_episode_frames}
    grey = [wrappers.GrayscaleObservation] if len(probe.observation_space.shape) == 3 else []
    return grey + [functools.partial(wrappers.ResizeObservation, shape=(84, 84)), stack], {}


def make_env(env_id: str, num_envs: int, max_episode_frames: int = 108_000) -> gym.vector.VectorEnv:
    """A synchronous vector env in SAME_STEP autoreset mode (the step that ends an episode returns
    the next one's first observation, the real last one is in info["final_obs"]), checked for what
    DQN can handle."""
    try:
        import ale_py  # ALE ids are registered by importing ale_py (gymnasium 1.x has no plugins)

        gym.register_envs(ale_py)
    except ImportError:
        pass
    if env_id.startswith("MinAtar/") and env_id not in gym.registry:
        try:
            import minatar.gym
        except ImportError:
            raise ConfigError(f"{env_id} needs MinAtar: pip install minatar") from None
        minatar.gym.register_envs()
    try:
        probe = gym.make(env_id)
    except (gym.error.Error, ImportError, AttributeError) as e:  # 'module:Env' ids import a module
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
    return gym.make_vec(
        env_id,
        num_envs=num_envs,
        vectorization_mode="sync",
        wrappers=wrappers,
        vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP},
        **kwargs,
    )


def seed_envs(envs: gym.vector.VectorEnv, seed: int) -> np.ndarray:
    """Reset with seeds seed, seed+1, ... (one per sub-env) and seed the action space."""
    envs.action_space.seed(seed)
    obs, _ = envs.reset(seed=seed)
    return obs


def lost_life(info: dict, lives: Optional[np.ndarray], done: np.ndarray) -> Tuple[np.ndarray, Optional[np.ndarray]]:
    """(envs whose game lost a life this step without ending, the lives now)."""
    now = np.asarray(info["lives"])
    return (now < lives) & ~done if lives is not None else np.zeros_like(done), now


def real_next_obs(next_obs: np.ndarray, done: np.ndarray, info: dict) -> np.ndarray:
    """The observation each step really led to (info["final_obs"] where an episode ended)."""
    if not done.any():
        return next_obs
    real = next_obs.copy()
    for i in np.flatnonzero(done):
        real[i] = info["final_obs"][i]
    return real


def evaluate(act, params, env_fn, episodes: int, epsilon: float, seed: int) -> np.ndarray:
    """Returns of `episodes` whole episodes (the env's own rewards), run as parallel envs, the
    same seeds every time."""
    envs = env_fn(episodes)
    try:
        obs, key = seed_envs(envs, seed), jax.random.PRNGKey(seed)
        returns, running, t = np.zeros(episodes), np.ones(episodes, bool), 0
        while running.any():
            actions = np.asarray(act(params, obs, np.float32(epsilon), key, np.int32(t)))
            obs, reward, terminated, truncated, _ = envs.step(actions)
            returns += reward * running
            running &= ~(terminated | truncated)
            t += 1
        return returns
    finally:
        envs.close()


# ---------------------------------------------------------------------------------------------
# Ray
# ---------------------------------------------------------------------------------------------


def start_ray(args: Args) -> bool:
    """Join --ray-address, or start a local Ray on this machine only; True if this process started
    (and must stop) it. A Ray already initialised in this process (a notebook, a test) is used."""
    if args.ray_address is None and "ray" not in sys.modules:
        # Ray gives a node the address other machines reach it at, even a local instance, and binds
        # its servers there; with this variable, which Ray reads when it is first imported, the node
        # address is the loopback one and nothing listens beyond this machine (Ray's own switch for
        # laptops). So ray is imported inside the functions that use it, never at the top.
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    import ray

    if ray.is_initialized():
        return False
    if args.ray_address is not None:
        reachable(args.ray_address)
        try:
            ray.init(address=args.ray_address, include_dashboard=False, configure_logging=False)
        except Exception as e:  # Ray raises several kinds (ConnectionError, ValueError, ...)
            reason = first_line(e)
            if "Failed to connect" in reason and os.environ.get("RAY_AUTH_MODE") != "token":
                reason += "; a cluster with token authentication (Ray's default) also needs RAY_AUTH_MODE=token"
            raise ConfigError(f"--ray-address {args.ray_address}: cannot join a Ray cluster there ({reason})") from None
        cpus = ray.cluster_resources().get("CPU", 0)
        if cpus < resolved_actors(args):  # each actor asks for one: the rest would wait for ever
            ray.shutdown()
            raise ConfigError(f"--num-actors {resolved_actors(args)}, but the cluster has {cpus:g} CPUs")
        return False
    try:
        # Ray starts its servers with fork + exec, about which Python warns once jax has threads;
        # the exec follows at once, so no thread state is inherited.
        warnings.filterwarnings("ignore", message="os.fork", category=RuntimeWarning)
        ray.init(
            address="local",  # a new Ray, even where RAY_ADDRESS names another
            # Every actor must be scheduled even beyond the cores (an oversubscribed laptop run).
            num_cpus=max(os.cpu_count() or 1, resolved_actors(args) + 1),
            include_dashboard=False,
            configure_logging=False,
        )
    except Exception as e:
        raise RunFailed(f"could not start a local Ray ({first_line(e)})") from None
    return True


def node_address() -> str:
    import ray

    return ray.util.get_node_ip_address()


def restarted_by_ray() -> bool:
    """Whether this process is a Ray actor that Ray started again after its process died."""
    import ray

    if not ray.is_initialized():
        return False
    with warnings.catch_warnings():  # Ray 2.60 warns about its own deprecated actor_id inside this
        warnings.simplefilter("ignore")
        return ray.get_runtime_context().was_current_actor_reconstructed


def reachable(address: str, timeout: float = 10.0) -> None:
    """A ConfigError unless something accepts connections at HOST:PORT: Ray itself retries an
    address that does not answer for minutes before it gives up."""
    host, _, port = address.rpartition(":")
    if address == "auto" or address.startswith("ray://") or not port.isdigit():
        return  # 'auto' reads a local file, Ray Client has its own timeout; ray.init reports these
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except OSError as e:
        raise ConfigError(f"--ray-address {address}: no Ray there ({e.strerror or e})") from None


def resolved_actors(args: Args) -> int:
    """--num-actors, with -1 as one actor per core the learner leaves free, at least 2 (so that
    the epsilon ladder has two rungs)."""
    if args.num_actors != -1:
        return args.num_actors
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(2, cores - 1)


def remote_actor_class():
    """Actor as a Ray actor class: restarted by Ray whenever its process dies (max_restarts=-1), and
    the request in flight then runs again on the new process (max_task_retries=-1), so the learner
    keeps no bookkeeping of its own. Actors act on the CPU (JAX_PLATFORMS=cpu): the learner keeps
    the accelerator."""
    import ray

    if __name__ != "__main__":
        # Imported as a module (tests, a user's code): send the code to the workers by value, as
        # Ray does for a script, so that they need not find this file on their path.
        ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    env = {"JAX_PLATFORMS": "cpu"}
    return ray.remote(num_cpus=1, max_restarts=-1, max_task_retries=-1, runtime_env={"env_vars": env})(Actor)


ACTOR_COMEBACK_S = 120  # seconds an actor may send nothing (down, or never placed) before the run ends


def first_line(error: BaseException) -> str:
    """The first line of an error's message (of its cause, for an error Ray passes on)."""
    text = str(getattr(error, "cause", None) or error).strip()
    return text.splitlines()[0] if text else type(error).__name__


# ---------------------------------------------------------------------------------------------
# Prefetch and priority write-back threads
# ---------------------------------------------------------------------------------------------


def sample_batches(replay: PrioritizedReplay, args: Args):
    """On the prefetch thread: (batches[K, B, ...] on the device, slot indexes, write counts)."""
    batch, indexes, stamps = replay.sample(args.batch_size, args.updates_per_call)
    batch = {k: v.reshape((args.updates_per_call, args.batch_size) + v.shape[1:]) for k, v in batch.items()}
    return jax.device_put(batch), indexes, stamps


def write_priorities(replay: PrioritizedReplay, indexes, stamps, priorities, first_step: int):
    """On the writer thread (reading |TD| waits for the learner): stop on divergence, else write back."""
    priorities = np.asarray(priorities, np.float64)
    finite = np.isfinite(priorities).all(axis=1)
    if not finite.all():
        step = first_step + int(np.argmin(finite)) + 1
        raise RunFailed(f"the learner diverged: non-finite TD error at SGD step {step}; a lower --learning-rate?")
    if replay.prioritized:  # with alpha = 0 a write changes nothing
        replay.update_priorities(indexes, stamps, priorities.reshape(-1))


def next_multiple(step: int, every: int) -> Optional[int]:
    """The first multiple of `every` after `step`; None (never) when every is 0."""
    return (step // every + 1) * every if every else None


# ---------------------------------------------------------------------------------------------
# The run: Ray and the actors, folder, resume, counters, logging, evaluations, checkpoints
# ---------------------------------------------------------------------------------------------


class Run:
    """Everything train() needs besides the algorithm: Ray and the actors (their requests, their
    restarts), the run folder, a --resume checkpoint, the counters, the prefetch and priority
    threads, logging, evaluations, checkpoints, and Ctrl-C / SIGTERM (`with run:` stops the
    threads, the actors and a Ray it started however the loop ends)."""

    def __init__(self, args: Args, env_fn, replay: PrioritizedReplay, act):
        self.args, self.env_fn, self.replay, self.act = args, env_fn, replay, act
        self.global_step = self.episodes = self.restarts = 0
        self.sgd_base, self.learn_from = 0, args.learning_starts
        self.sampler = concurrent.futures.ThreadPoolExecutor(1, "prefetch")  # samples ahead, puts batches on the device
        self.writer = concurrent.futures.ThreadPoolExecutor(1, "priority-writer")
        self.ahead, self.writes = collections.deque(), collections.deque()
        self.stop = StopRequest()
        self.metrics: dict = {}
        self.last_eval: Optional[str] = None
        self.actors: list = []
        self.pending: dict = {}  # request (a Ray reference) -> actor index
        self.own_ray = False

    @property
    def stopped(self) -> bool:
        return self.stop.signum is not None

    def restore(self, state: TrainState, key):
        """(state, key) of the --resume checkpoint, or the fresh ones given; then the run folder,
        the logger and the counters."""
        args = self.args
        if args.resume:
            ckpt = os.path.join(args.resume, "checkpoint.npz")
            meta, arrays = load_npz(ckpt)
            state = restore_tree(state, arrays, "train_state/", ckpt)
            key = jnp.asarray(checked_array(arrays, "key", (2,), np.uint32, ckpt))
            self.global_step, self.episodes = meta.get("global_step"), meta.get("episodes")
            counts = (self.global_step, self.episodes)
            require(all(type(v) is int and 0 <= v < 2**40 for v in counts), f"{ckpt}: bad counters in meta.json")
            if any(name.startswith("replay/") for name in arrays):
                self.replay.load_state_dict(arrays, ckpt)
            rows = self.replay.size()
            if rows < args.learning_starts:  # learning waits for new rows, and does not catch up after
                self.sgd_base, self.learn_from = int(state.sgd_steps), self.global_step + args.learning_starts - rows
            print(f"resumed {args.resume} at step {self.global_step} ({int(state.sgd_steps)} SGD steps, {rows} rows)")
        self.sgd_done = int(state.sgd_steps)
        self.run_dir = args.run_dir or os.path.join(
            "runs", f"{args.env_id.replace('/', '-')}__{SCRIPT}__{args.seed}__{int(time.time())}"
        )
        try:
            os.makedirs(self.run_dir, exist_ok=True)
        except OSError as e:
            raise ConfigError(f"cannot make the run folder {self.run_dir} ({e.strerror or e})") from None
        for name in os.listdir(self.run_dir):  # a write that a kill cut short
            if ".tmp." in name:
                os.remove(os.path.join(self.run_dir, name))
        write_atomic(
            os.path.join(self.run_dir, "args.json"),
            lambda f: f.write(json.dumps({"script": SCRIPT, "args": dataclasses.asdict(args)}, indent=2).encode()),
        )
        step = self.global_step
        self.logger = Logger(self.run_dir, (step if step < args.total_timesteps else step - 1) if args.resume else None)
        self.meta = {"format": FORMAT, "script": SCRIPT, "args": dataclasses.asdict(args)}
        self.saved_time = time.monotonic()
        self.window = {"time": time.perf_counter(), "step": step, "sgd": self.sgd_done, "wait": 0.0, "learn": 0.0}
        self.next_eval, self.next_log = next_multiple(step, args.eval_every), next_multiple(step, args.log_every)
        self.next_ckpt = next_multiple(step, args.checkpoint_every)
        self.lag = []
        return state, key

    # -- the actors ------------------------------------------------------------------------------

    def start_actors(self, state: TrainState) -> None:
        """Start the actors (Ray was started by `with run:`) and send each its first request. The
        seeds move with the step, so that a resumed run does not replay the episodes it began with."""
        args = self.args
        n = resolved_actors(args)
        remote = remote_actor_class()
        seed = args.seed + self.global_step
        self.actors = [remote.remote(args, i, n, seed + 10_007 * i) for i in range(n)]
        now = time.monotonic()
        # epsilon and pid as each actor reports them with its chunks
        self.info = [dict(epsilon=None, pid=None, restarts=0, heard=now) for _ in range(n)]
        self.publish(state)
        for i in range(n):
            self.request(i)
        where = f"local, {node_address()}" if self.own_ray else args.ray_address or "already running"
        print(f"{n} actors on Ray ({where})", flush=True)

    def publish(self, state: TrainState) -> None:
        """Put the newest parameters in Ray's object store for the requests sent from now on (an
        actor fetches them only when its sync is due). Once per round of actor syncs
        (--param-sync-every steps of every actor), not per update: each request in flight holds
        the copy it was sent with, so publishing more often would keep up to one copy per actor."""
        import ray

        self.published = [ray.put((self.sgd_done, jax.device_get((state.params, state.target_params))))]
        self.published_step = self.global_step

    def request(self, i: int) -> None:
        self.pending[self.actors[i].collect.remote(self.published)] = i

    def arrived_chunks(self, state: TrainState) -> list:
        """The chunks that have arrived, each actor sent its next request first. When there is
        nothing to learn yet, waits (up to 0.1 s) for one, instead of spinning."""
        import ray

        args = self.args
        if self.global_step - self.published_step >= args.param_sync_every * args.num_envs * len(self.actors):
            self.publish(state)
        now, ready = time.monotonic(), []
        if self.pending:
            ready, _ = ray.wait(list(self.pending), num_returns=1, timeout=0.0 if self.update_calls_due() else 0.1)
        else:
            time.sleep(0.1)
        if ready:  # and whatever else is ready by now
            ready, _ = ray.wait(list(self.pending), num_returns=len(self.pending), timeout=0)
        chunks = []
        for ref in ready:
            i = self.pending.pop(ref)
            try:
                chunk = ray.get(ref)
            except ray.exceptions.RayActorError as e:  # not a restart (Ray retries those): it cannot run
                raise RunFailed(f"actor {i} cannot run: {first_line(e)}") from None
            except ray.exceptions.RayTaskError as e:  # an exception inside collect(): a bug, not a fault
                raise RunFailed(f"actor {i} failed: {first_line(e)}") from None
            except ray.exceptions.RayError as e:  # Ray itself: a lost object, a node gone, out of memory
                raise RunFailed(f"Ray failed while getting actor {i}'s chunk: {first_line(e)}") from None
            self.request(i)
            self.actor_up(i, chunk)
            self.count(chunk)
            chunks.append(chunk)
        for i, entry in enumerate(self.info):
            if now - entry["heard"] > ACTOR_COMEBACK_S:  # down, or never placed (a cluster short of CPUs)
                raise RunFailed(f"actor {i} has sent nothing for {ACTOR_COMEBACK_S} s; see Ray's logs")
        return chunks

    def actor_up(self, i: int, chunk: dict) -> None:
        """A chunk from actor i: a process id not seen before (after the first) is a restart."""
        entry = self.info[i]
        entry["heard"] = time.monotonic()
        if entry["pid"] != chunk["pid"]:
            if entry["pid"] is not None:
                entry["restarts"] += 1
                self.restarts += 1
                print(
                    f"actor {i} is back (process {chunk['pid']}): Ray restarted it, its unsent chunk is lost",
                    flush=True,
                )
            entry.update(pid=chunk["pid"], epsilon=chunk["epsilon"])
            self.write_actors()

    def count(self, chunk: dict) -> None:
        self.global_step += chunk["env_steps"]
        self.lag.append(self.sgd_done - chunk["version"])
        for ret, length in chunk["episodes"]:
            self.episodes += 1
            self.logger.scalars(self.global_step, {"charts/episodic_return": ret, "charts/episodic_length": length})

    def write_actors(self) -> None:
        """RUN_DIR/actors.json: each actor's epsilon (as the actor reports it), process id and
        restarts, rewritten when one changes."""
        actors = [{"actor": i, **{k: e[k] for k in ("epsilon", "pid", "restarts")}} for i, e in enumerate(self.info)]
        write_atomic(
            os.path.join(self.run_dir, "actors.json"), lambda f: f.write(json.dumps(actors, indent=1).encode())
        )

    # -- the learner -----------------------------------------------------------------------------

    def update_calls_due(self) -> int:
        """Jitted update calls due now: one SGD step per --train-frequency env steps received once
        the replay holds --learning-starts rows (with 0, one call whenever the replay is ready)."""
        args = self.args
        if self.replay.size() < args.learning_starts or self.global_step < self.learn_from:
            return 0
        if args.train_frequency == 0:
            return 1
        sgd_due = self.sgd_base + (self.global_step - self.learn_from) // args.train_frequency
        return max(0, sgd_due - self.sgd_done) // args.updates_per_call

    def next_batches(self):
        """(batches, slot indexes, write counts) from the prefetch thread, prefetch_size calls ahead."""
        while len(self.ahead) <= self.args.prefetch_size:
            self.ahead.append(self.sampler.submit(sample_batches, self.replay, self.args))
        self.t0 = time.perf_counter()
        batches = self.ahead.popleft().result()
        self.window["wait"] += time.perf_counter() - self.t0
        return batches

    def learned(self, state: TrainState, metrics: dict, indexes, stamps, priorities) -> None:
        self.writes.append(
            self.writer.submit(write_priorities, self.replay, indexes, stamps, priorities, self.sgd_done)
        )
        while self.writes and self.writes[0].done():
            self.writes.popleft().result()  # raises the writer's error, e.g. divergence
        self.window["learn"] += time.perf_counter() - self.t0
        self.sgd_done += self.args.updates_per_call
        self.metrics = metrics

    # -- logging, evaluation, checkpoints ---------------------------------------------------------

    def log_if_due(self) -> None:
        args, step = self.args, self.global_step
        if step < self.next_log:
            return
        self.next_log = next_multiple(step, args.log_every)
        now = time.perf_counter()
        window, elapsed = self.window, now - self.window["time"]
        sgd = self.sgd_done - window["sgd"]
        scalars = {
            "charts/SPS": (step - window["step"]) / elapsed,
            "replay/beta": self.replay.beta,
            "replay/priority_max": self.replay.max_priority(),
            "replay/size": self.replay.size(),
            "perf/updates_per_second": sgd / elapsed,
            "perf/replay_ratio": sgd * args.batch_size / max(step - window["step"], 1),
            "apex/actor_restarts": self.restarts,
        }
        if self.lag:
            scalars["apex/param_lag"] = float(np.mean(self.lag))
        if window["learn"] > 0:
            scalars["perf/learner_wait_fraction"] = window["wait"] / window["learn"]
        scalars.update({k: float(v) for k, v in self.metrics.items()})
        self.logger.scalars(step, scalars)
        self.logger.flush()
        if step % (10 * args.log_every) < step - window["step"] or step >= args.total_timesteps:
            print(
                f"step {step:>8d}  SPS {scalars['charts/SPS']:6.0f}"
                f"  updates/s {scalars['perf/updates_per_second']:6.0f}"
                f"  loss {scalars.get('losses/td_loss', float('nan')):.4f}  episodes {self.episodes}"
                f"  restarts {self.restarts}  eval {self.last_eval or '-'}",
                flush=True,
            )
        window.update(time=now, step=step, sgd=self.sgd_done, wait=0.0, learn=0.0)
        self.lag = []

    def evaluate(self, state: TrainState) -> np.ndarray:
        args = self.args
        returns = evaluate(
            self.act, state.params, self.env_fn, args.eval_episodes, args.eval_epsilon, args.seed + 10_000
        )
        self.logger.eval(self.global_step, returns)
        self.last_eval = f"{returns.mean():.1f}"
        return returns

    def evaluate_if_due(self, state: TrainState) -> None:
        if self.next_eval <= self.global_step < self.args.total_timesteps:  # the final one comes in finish()
            self.next_eval = next_multiple(self.global_step, self.args.eval_every)
            self.evaluate(state)

    def checkpoint(self, state: TrainState, key) -> None:
        while self.writes:
            self.writes.popleft().result()  # the priorities of every update so far are in the replay
        arrays = {**tree_arrays("train_state/", state), "key": np.asarray(key)}
        if self.args.checkpoint_replay:
            arrays.update(self.replay.state_dict())
        meta = {**self.meta, "kind": "checkpoint", "global_step": self.global_step, "episodes": self.episodes}
        save_npz(os.path.join(self.run_dir, "checkpoint.npz"), meta, arrays)
        self.saved_time = time.monotonic()

    def checkpoint_if_due(self, state: TrainState, key) -> None:
        args = self.args
        if (self.next_ckpt is not None and self.global_step >= self.next_ckpt) or (
            args.checkpoint_minutes and time.monotonic() - self.saved_time >= 60 * args.checkpoint_minutes
        ):
            self.next_ckpt = next_multiple(self.global_step, args.checkpoint_every)
            self.checkpoint(state, key)

    def __enter__(self):
        try:
            # Ray first: ray.init sets a SIGTERM handler of its own (which exits at once), ours
            # must come after it so that a SIGTERM still ends the run with a checkpoint.
            self.own_ray = start_ray(self.args)
            self.stop.__enter__()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc):
        self.stop.__exit__(*exc)
        self.close()
        if exc[0] is not None:  # finish() will not run: write out the events since the last tick
            self.logger.close()

    def close(self) -> None:
        """Stop the threads and the actors, and a Ray this run started."""
        self.sampler.shutdown(cancel_futures=True)
        self.writer.shutdown()
        if self.actors or self.own_ray:
            import ray

            for actor in self.actors:
                ray.kill(actor, no_restart=True)
            self.actors, self.pending = [], {}
            if self.own_ray:
                ray.shutdown()
                self.own_ray = False

    def finish(self, state: TrainState, key) -> dict:
        """The last checkpoint; then, unless a signal stopped the run, model.npz and the final
        evaluation."""
        self.checkpoint(state, key)
        run_dir, step = self.run_dir, self.global_step
        summary = {"run_dir": run_dir, "global_step": step, "actor_restarts": self.restarts}
        if self.stopped:
            self.logger.close()
            print(f"stopped by signal {self.stop.signum} at step {step}; continue with --resume {run_dir}", flush=True)
            return {**summary, "signal": self.stop.signum}
        save_npz(
            os.path.join(run_dir, "model.npz"), {**self.meta, "kind": "model"}, tree_arrays("params/", state.params)
        )
        returns = self.evaluate(state)
        self.logger.close()
        print(f"final eval at step {step}: {returns.mean():.2f} +- {returns.std():.2f}; run dir {run_dir}", flush=True)
        return {**summary, "eval_mean": float(returns.mean()), "sgd_steps": int(state.sgd_steps)}


# ---------------------------------------------------------------------------------------------
# Checkpoint and model files
# ---------------------------------------------------------------------------------------------

# checkpoint.npz and model.npz are .npz files read with allow_pickle=False, so loading one runs no
# code. Member meta.json holds the format, the counters and the flags; every other member is one
# array named by its place, checked for name, shape, dtype and range before any of it is used.


def write_atomic(path: str, write) -> None:
    """write(file) into a new temp file beside `path`, fsync, rename: a crash, kill or full disk
    leaves the previous file whole, and the rename replaces a symlink instead of writing through it."""
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


def load_npz(path: str, kind: str = "checkpoint") -> Tuple[dict, dict]:
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
    require(
        not extra, f"{path}: unexpected array {extra[0] if extra else ''} (other --hidden-sizes, --dueling or env?)"
    )
    return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(template), [jnp.asarray(x) for x in leaves])


def args_from_json(saved, where: str = "") -> Args:
    """Flags from JSON (a run folder's, maybe hostile, or the command line's): each of its type and in
    its range, and the checks between flags, or one ConfigError naming the first bad flag."""
    try:
        args = pydantic.TypeAdapter(Args).validate_json(json.dumps(saved, default=json_value))
    except pydantic.ValidationError as e:
        error = e.errors()[0]
        flag = "--" + str(error["loc"][0]).replace("_", "-") if error["loc"] else "the flags"
        message = f"{flag} {error['msg'].removeprefix('Input ')}, got {error.get('input')!r}"
        raise ConfigError(f"{where}: {message}" if where else message) from None
    between = (
        (args.batch_size <= args.buffer_size, f"--batch-size {args.batch_size} exceeds --buffer-size"),
        (args.learning_starts >= args.batch_size, "--learning-starts must be at least --batch-size"),
        (args.num_actors != 0, "--num-actors must be positive or -1 (as the cores allow)"),
        (
            ":" not in args.env_id or not where,
            f"env id {args.env_id!r} names a module to import; not taken from a file",
        ),
    )
    for ok, message in between:
        if not ok:
            raise ConfigError(f"{where}: {message}" if where else message)
    return args


def json_value(value):
    """numpy scalars and paths in Args built in Python: as JSON has them."""
    return value.item() if isinstance(value, np.generic) else str(value)


# ---------------------------------------------------------------------------------------------
# Logging
# ---------------------------------------------------------------------------------------------


EVENT_FILES = itertools.count()  # tells apart the event files of one process and second


class Logger:
    """Tensorboard scalars through tensorboard's own record writer, and eval.csv."""

    def __init__(self, run_dir: str, keep_until: Optional[int] = None):
        from tensorboard.compat.proto import event_pb2, summary_pb2
        from tensorboard.summary.writer.record_writer import RecordWriter

        self._event, self._summary = event_pb2.Event, summary_pb2.Summary
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
            # Rows logged after the checkpoint belong to steps about to be done again.
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

    def eval(self, step: int, returns: np.ndarray) -> None:
        self.scalars(step, {"eval/episodic_return": returns.mean(), "eval/episodic_return_std": returns.std()})
        new = not os.path.exists(self._eval_csv)
        with open(self._eval_csv, "a", newline="") as f:
            writer = csv.writer(f)
            if new:
                writer.writerow(["step", "mean", "std", "episodes"])
            writer.writerow([step, f"{returns.mean():.4f}", f"{returns.std():.4f}", len(returns)])

    def flush(self) -> None:
        self._file.flush()

    def close(self) -> None:
        self._file.close()


# ---------------------------------------------------------------------------------------------
# Command line, resume and signals
# ---------------------------------------------------------------------------------------------


class StopRequest:
    """SIGINT/SIGTERM set a flag that the loop checks, so the last checkpoint is taken from a
    consistent state; a second signal interrupts at once."""

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


def parse_args(argv=None) -> Args:
    """tyro's parse; --preset swaps in the preset's defaults, --resume the run's own flags, and any
    flag typed here wins over both. Where to write comes from here only."""
    argv = sys.argv[1:] if argv is None else list(argv)
    preset = None
    for i, token in enumerate(argv):  # the last one wins, as in tyro
        preset = token[9:] if token.startswith("--preset=") else argv[i + 1] if token == "--preset" else preset
    typed = tyro.cli(Args, args=argv, default=Args(preset=preset, **PRESETS[preset]) if preset in PRESETS else Args())
    if typed.resume is None:
        return typed
    path = os.path.join(typed.resume, "args.json")
    require(os.path.isfile(path), f"--resume {typed.resume}: no args.json there (not a run folder of {SCRIPT}.py)")
    try:
        with open(path, "rb") as f:
            saved = json.loads(f.read())
    except (ValueError, RecursionError):
        raise ConfigError(f"{path} is not JSON") from None
    require(
        isinstance(saved, dict) and saved.get("script") == SCRIPT, f"--resume {typed.resume}: not a run of {SCRIPT}.py"
    )
    saved = args_from_json(saved.get("args"), path)
    require(preset in (None, saved.preset), f"--resume {typed.resume}: --preset cannot change on resume")
    args = tyro.cli(Args, args=argv, default=saved)
    return dataclasses.replace(args, resume=typed.resume, run_dir=typed.resume)


def require(ok, message: str) -> None:
    if not ok:
        raise ConfigError(message)


def cli(argv=None) -> int:
    try:
        result = train(parse_args(argv))
    except (ConfigError, RunFailed) as e:
        print(f"{SCRIPT}.py: error: {e}", file=sys.stderr)
        return 2 if isinstance(e, ConfigError) else 1
    return 128 + result["signal"] if "signal" in result else 0


if __name__ == "__main__":
    sys.exit(cli())
