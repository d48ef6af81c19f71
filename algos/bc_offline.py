"""Behaviour cloning from offline datasets, with prioritized replay of the data, in one file.

What it implements
  * Behaviour cloning (Pomerleau 1991; as the offline-RL baseline of Fu et al. 2020, "D4RL",
    arXiv:2004.07219, and Emmons et al. 2021, arXiv:2112.10751), with "x% BC" (train on the top
    x% of timesteps ordered by their episode's return, taken as whole trajectories, best first;
    Chen et al. 2021, "Decision Transformer", arXiv:2106.01345, section 5.3: top_fraction_mask).
  * Optional prioritized sampling of the dataset by per-example loss (for the nll, its misfit
    term; proportional PER, Schaul et al. 2016, arXiv:1511.05952, on cpprb) with
    importance-weighted loss.
  * The same learner machinery as the project's online scripts: a prefetch thread that samples
    and puts batches on the device, K SGD steps fused in one jitted `lax.scan`, priorities
    written back from another thread. Each of the K minibatches of a call is its own stratified
    draw over the whole dataset (not a slice of one K*B draw: see PrioritizedDataset.sample; a
    permutation of one K*B draw would cost less but keep one draw's strata instead of the
    paper's per-minibatch ones: docs/sampling.md). With --num-devices N the
    SGD steps run data parallel on N local devices (replicated parameters, each batch split,
    gradients averaged; see learner_shardings).

Losses (per example i; the batch loss is (1/B) sum_i w_i * l_i, w_i = 1 without --prioritized)
  discrete actions:          l_i = -log softmax(f(s_i))[a_i]                      (cross-entropy)
  continuous, --loss mse:    l_i = sum_j (tanh(f(s_i))_j - a~_ij)^2,  a~ = action scaled to [-1, 1]
  continuous, --loss nll:    l_i = -log pi(a~_i|s_i),  pi = tanh(N(mu(s), sigma(s))):
                             log pi(a~) = log N(atanh(a~); mu, sigma) - sum_j log(1 - a~_j^2)
  with s normalised by the dataset's mean and std (saved with the model, used at evaluation).
  Priorities p_i = l_i + eps for cross-entropy and mse. The nll of a density goes negative once
  sigma is small (a density above 1), and a negative priority would turn cpprb's sums into NaN,
  so its priority is its data-fit term alone,
  p_i = (1/2) sum_j ((atanh(a~_ij) - mu_ij) / sigma_ij)^2 + eps >= 0: half the squared distance
  of the data's action from the policy's mean in standard deviations, without the log-normaliser
  and the tanh Jacobian, which do not measure the fit. P(i) = p_i^alpha / sum p^alpha,
  w_i = (N P(i))^-beta / max_j w_j with the max over the minibatch (--per-weight-norm batch) or
  the whole dataset (buffer).
  Evaluation acts deterministically: argmax, tanh(f(s)) or tanh(mu(s)), mapped to the bounds.
  Normalised score = 100 * (R - ref_min) / (ref_max - ref_min).

Datasets (--dataset, repeatable: their union is used)
  * D4RL's flat HDF5 layout: observations, actions, rewards, next_observations, terminals,
    timeouts, and attributes under metadata/ (env_id, ref_min_score, ref_max_score, ...);
  * a Minari dataset folder (minari >= 0.5, hdf5 storage, as its DataCollector writes it):
    data/main_data.hdf5 with one group per episode holding T+1 observations, T actions,
    rewards, terminations, truncations, and data/metadata.json (the env id from its
    eval_env_spec or env_spec, ref_min_score, ref_max_score); not Dict, Tuple or JPEG images;
  * .npz files with the D4RL keys (metadata as "metadata/<name>" entries).
  Trajectories end at terminals, at timeouts and at the end of each file or Minari episode.
  algos/dqn_prioritized.py and algos/sac.py write the D4RL format with --save-dataset; data/
  ships three small files made that way (docs/offline.md has the commands).

Map of this file
  Part 1, the algorithm: Args (the flags), Policy, PrioritizedDataset, the learner
  (per_example_loss, make_update), acting (make_act) and train(), the loop. Part 2, the
  machinery, which a reader may skip: flag checks, dataset readers (D4RL HDF5, Minari, .npz),
  envs, the prefetch and priority threads, devices, Run (run folder, resume, counters, logging,
  evaluations, checkpoints), evaluation, files, the command line.

Run
  python algos/bc_offline.py                                   # data/pendulum-sac-expert.hdf5
  python algos/bc_offline.py --dataset data/cartpole-dqn-expert.hdf5
  python algos/bc_offline.py --dataset a.hdf5 --dataset b.npz --top-fraction 0.1
  python algos/bc_offline.py --num-devices -1 --batch-size 1024   # SGD over every local GPU
  python algos/bc_offline.py --eval-only --load runs/<run>/model.npz
  python algos/bc_offline.py --capture-video --track           # eval videos, Weights & Biases (optional)

Outputs (runs/<env_id>__bc_offline__<seed>__<unix_time>/)
  args.json, eval.csv (step, mean, std, episodes, normalized_score) where step counts SGD
  updates, tensorboard events (losses/bc_loss, eval/episodic_return(_std), eval/normalized_score,
  replay/beta, replay/priority_max, perf/updates_per_second, perf/learner_wait_fraction),
  checkpoint.npz (atomic; every --checkpoint-every updates and --checkpoint-minutes;
  --keep-checkpoints K keeps the K - 1 before it as checkpoint-<update>.npz) and model.npz
  (parameters and observation statistics): arrays and JSON, read without pickle; curve.png
  (eval returns and training loss, with matplotlib), videos/ (--capture-video), wandb/ (--track).
  Console: one refreshing progress line on a terminal, a plain line every --log-every otherwise.
"""

from __future__ import annotations

import os

# Read by jax when it initialises its backend, so it must be set before `import jax`: without it
# a GPU run would grab 75% of the device memory up front.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import csv
import dataclasses
import functools
import hashlib
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
from dataclasses import dataclass, field
from typing import Annotated, Any, Callable, List, Literal, NamedTuple, Optional, Tuple

import cpprb
import flax.linen as nn
import gymnasium as gym
import h5py
import jax
import jax.numpy as jnp
import numpy as np
import optax
import tyro

SCRIPT = "bc_offline"
CHECKPOINT_FORMAT = f"{SCRIPT}/2"  # 2: .npz and JSON (1 was a pickle)
LOG_STD_MIN, LOG_STD_MAX = -5.0, 2.0
ACTION_EDGE = 1.0 - 1e-5  # dataset actions at the bounds would have atanh = inf
DEFAULT_DATASET = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data", "pendulum-sac-expert.hdf5"
)


# =============================================================================================
# PART 1: THE ALGORITHM
# Flags, policy, the prioritized dataset, loss and update, acting, and the loop.
# =============================================================================================


@dataclass
class Args:
    # Algorithm
    dataset: Annotated[List[str], tyro.conf.UseAppendAction] = field(default_factory=list)
    """D4RL-layout .hdf5, Minari folder or .npz; repeat the flag to train on the union
    (default: data/pendulum-sac-expert.hdf5)"""
    env_id: Optional[str] = None
    """env to evaluate in; default: the dataset's metadata"""
    seed: int = 1
    """seed of the network, the sampling and the eval env"""
    total_updates: int = 20_000
    """SGD steps"""
    loss: str = "mse"
    """continuous actions: 'mse' (deterministic tanh policy) or 'nll' (tanh-Gaussian likelihood);
    discrete actions always use cross-entropy"""
    hidden_sizes: Tuple[int, ...] = (256, 256)
    """widths of the policy's hidden layers"""
    learning_rate: float = 1e-3
    """Adam's learning rate (decayed linearly to 0 over training)"""
    batch_size: int = 256
    """examples per SGD step"""
    top_fraction: float = 1.0
    """train on the top fraction of timesteps by their episode's return, as whole trajectories
    (1.0: all; 0.1: "10% BC" of Decision Transformer)"""
    normalize_obs: bool = True
    """standardise observations with the dataset's mean and std"""
    # Replay (sampling of the dataset)
    prioritized: bool = False
    """sample examples in proportion to their loss (the nll: its misfit term; IS-weighted); off
    by default: on the shipped datasets it matched uniform sampling or trailed it (docs/benchmarks.md, Ablations)"""
    per_alpha: float = 0.6
    """priority exponent alpha"""
    per_beta0: float = 0.4
    """initial importance-sampling exponent beta, annealed linearly to 1"""
    per_eps: float = 1e-3
    """added to every priority"""
    per_weight_norm: Literal["batch", "buffer"] = "batch"
    """divide the IS weights by their largest value in the minibatch (Acme, Dopamine) or in the
    whole dataset (cpprb's rule)"""
    # Learner machinery
    updates_per_call: int = 50
    """SGD steps fused in one jitted call (lax.scan)"""
    prefetch_size: int = 2
    """batches of updates_per_call x batch_size the prefetch thread keeps ready on the device"""
    num_devices: int = 1
    """local devices the learner uses (-1: all): each SGD step's batch is split across them, the
    parameters are replicated and the gradients averaged (data parallel; see learner_shardings)"""
    # Run and output
    eval_every: int = 5_000
    """SGD steps between evaluations"""
    eval_episodes: int = 10
    """episodes per evaluation (run in parallel)"""
    ref_min_score: Optional[float] = None
    """return of a random policy, for the normalised score; default: the dataset's metadata"""
    ref_max_score: Optional[float] = None
    """return of an expert, for the normalised score; default: the dataset's metadata"""
    checkpoint_every: int = 10_000
    """SGD steps between checkpoints (0: none by steps; --checkpoint-minutes still applies)"""
    checkpoint_minutes: float = 30.0
    """also checkpoint when this many minutes have passed since the last one (0: only by steps)"""
    keep_checkpoints: int = 1
    """complete checkpoints kept: checkpoint.npz (the newest) and the K - 1 before it as
    checkpoint-<step>.npz; older ones are removed only once a newer one is complete"""
    log_every: int = 1_000
    """SGD steps between tensorboard scalars and console lines"""
    run_dir: Optional[str] = None
    """output folder; default runs/<env_id>__bc_offline__<seed>__<unix_time>"""
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
    here override it; a larger --total-updates re-stretches the lr and beta schedules)"""
    eval_only: bool = False
    """evaluate the policy in --load and exit"""
    load: Optional[str] = None
    """model.npz or checkpoint.npz (or a run folder) to evaluate with --eval-only"""


# ---------------------------------------------------------------------------------------------
# Policy network
# ---------------------------------------------------------------------------------------------


class Policy(nn.Module):
    """MLP on normalised observations: logits (discrete), or (mean, log_std) in pre-tanh space."""

    out_dim: int
    hidden_sizes: Tuple[int, ...]
    gaussian: bool  # also output a log-std head (--loss nll)

    @nn.compact
    def __call__(self, obs: jax.Array):
        x = obs
        for width in self.hidden_sizes:
            x = nn.relu(nn.Dense(width)(x))
        out = nn.Dense(self.out_dim)(x)
        if not self.gaussian:
            return out, None
        return out, jnp.clip(nn.Dense(self.out_dim)(x), LOG_STD_MIN, LOG_STD_MAX)


# ---------------------------------------------------------------------------------------------
# The prioritized dataset
# ---------------------------------------------------------------------------------------------


class PrioritizedDataset:
    """Proportional prioritized sampling (Schaul et al. 2016) of a fixed dataset, on cpprb.
    P(i) = p_i^alpha / sum_j p_j^alpha (one stratified draw of B per minibatch, in sample),
    w_i = (N P(i))^-beta / max_{j in minibatch} w_j (sample), p_i = the example's loss term
    + eps after learning (update_priorities). cpprb keeps the sum tree, adds eps and raises to
    alpha. The (normalised) dataset sits in cpprb's PrioritizedReplayBuffer, shared by three threads:
    one lock serialises sampling (prefetch thread) and priority updates (writer thread). The
    dataset is written once and never overwritten, so unlike the online scripts no slot can go
    stale between a sample and its priority update. priority[] mirrors what went into cpprb,
    which cannot read priorities back, so checkpoints can save them.
    """

    def __init__(self, obs: np.ndarray, actions: np.ndarray, alpha: float, eps: float, weight_norm: str = "batch"):
        n, self.weight_norm = len(obs), weight_norm
        spec = {
            "obs": {"shape": obs.shape[1], "dtype": np.float32},
            "action": {"shape": actions.shape[1] if actions.ndim == 2 else 1, "dtype": actions.dtype},
        }
        self.buffer = cpprb.PrioritizedReplayBuffer(n, spec, alpha=alpha, eps=eps)
        self.buffer.add(obs=obs, action=actions)  # one call: all rows, at priority 1
        self.priority = np.ones(n, np.float64)
        self.discrete = actions.ndim == 1
        self.lock = threading.Lock()
        self.beta = 0.4  # set by the main loop; read by whoever samples

    def sample(self, batch_size: int, num_batches: int = 1) -> Tuple[dict, np.ndarray]:
        """num_batches minibatches of batch_size rows, each a stratified sample of the whole
        dataset, flat: minibatch k is rows [k B, (k+1) B). Returns (batch with IS 'weights',
        row indexes) at the current beta."""
        # PER's stratified sampling is per minibatch: "to sample a minibatch of size k, the range
        # [0, p_total] is divided equally into k ranges" (Schaul et al. 2016, B.2.1). cpprb
        # stratifies the draws of one call, so a single call of K*B rows cut into K minibatches
        # would give minibatch k only the k-th 1/K of the priority mass: a few consecutive rows
        # of the file. One call per minibatch, all under one lock (one beta, one tree).
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
        if self.discrete:
            batch["action"] = batch["action"].reshape(-1)
        weights = batch["weights"].reshape(num_batches, batch_size).astype(np.float32)
        if self.weight_norm == "batch":  # w_i / max_{j in minibatch} w_j (cpprb's rule: the dataset's)
            weights = weights / weights.max(axis=1, keepdims=True)
        batch["weights"] = weights.reshape(-1)
        return batch, indexes

    def update_priorities(self, indexes: np.ndarray, priorities: np.ndarray) -> None:
        # One negative or non-finite priority turns every sum in cpprb's tree into NaN, after which
        # each draw returns row 0 with NaN weights: refuse it before it gets there.
        if not np.all(np.isfinite(priorities) & (priorities >= 0)):
            raise ValueError("priorities must be finite and >= 0")
        with self.lock:
            self.buffer.update_priorities(indexes, priorities)
            self.priority[indexes] = priorities

    def max_priority(self) -> float:
        with self.lock:
            return float(self.buffer.get_max_priority())

    def load_priorities(self, priority: np.ndarray, max_priority: float) -> None:
        with self.lock:
            self.buffer.update_priorities(np.arange(len(priority)), priority)
            # cpprb only ever raises its max: raise it on slot 0, then restore slot 0.
            self.buffer.update_priorities(np.array([0]), np.array([max_priority]))
            self.buffer.update_priorities(np.array([0]), priority[:1])
            self.priority[:] = priority


# ---------------------------------------------------------------------------------------------
# Learner
# ---------------------------------------------------------------------------------------------


class ObsStats(NamedTuple):
    mean: np.ndarray
    std: np.ndarray


def obs_stats(observations: np.ndarray, normalize: bool) -> ObsStats:
    if not normalize:
        return ObsStats(np.zeros(observations.shape[1], np.float32), np.ones(observations.shape[1], np.float32))
    # The floor keeps constant features (std 0) from blowing up to inf.
    return ObsStats(observations.mean(0).astype(np.float32), np.maximum(observations.std(0), 1e-3).astype(np.float32))


class TrainState(NamedTuple):
    params: Any
    opt_state: Any
    sgd_steps: jax.Array


def make_optimizer(args: Args) -> optax.GradientTransformation:
    return optax.adam(optax.linear_schedule(args.learning_rate, 0.0, args.total_updates))


def per_example_loss(policy: Policy, mode: str, params, obs, action):
    """(l_i, p_i - eps) of the docstring for each example; `action` is an int (discrete) or in
    [-1, 1]. The priority is the loss itself except for the nll (see the docstring)."""
    out, log_std = policy.apply(params, obs)
    if mode == "discrete":
        loss = -jnp.take_along_axis(jax.nn.log_softmax(out), action[:, None], axis=1)[:, 0]
        return loss, loss
    if mode == "mse":
        loss = jnp.sum((jnp.tanh(out) - action) ** 2, axis=-1)
        return loss, loss
    # nll: log-density of the squashed Gaussian at the dataset's action.
    a = jnp.clip(action, -ACTION_EDGE, ACTION_EDGE)
    u = jnp.arctanh(a)
    misfit = 0.5 * jnp.sum(((u - out) / jnp.exp(log_std)) ** 2, axis=-1)
    log_normaliser = jnp.sum(log_std, axis=-1) + 0.5 * out.shape[-1] * jnp.log(2.0 * jnp.pi)
    return misfit + log_normaliser + jnp.sum(jnp.log(1.0 - a**2), axis=-1), misfit


def make_update(policy: Policy, mode: str, optimizer, stats: ObsStats, shardings: Shardings):
    """jit(state, batches[K, B, ...]) -> (state, metrics, priorities[K, B]): K SGD steps, with the
    state on shardings.replicated and the batches split by shardings.batch (learner_shardings)."""
    mean, std = jnp.asarray(stats.mean), jnp.asarray(stats.std)

    def loss_fn(params, batch):
        losses, priorities = per_example_loss(policy, mode, params, (batch["obs"] - mean) / std, batch["action"])
        return jnp.mean(batch["weights"] * losses), priorities

    def sgd_step(state: TrainState, batch: dict):
        (loss, priorities), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params, batch)
        updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        # A step whose new parameters are not finite reports NaN priorities, so the priority
        # writer stops the run here rather than one call later (after a checkpoint, maybe).
        priorities = jnp.where(jnp.isfinite(optax.global_norm(params)), priorities, jnp.nan)
        return TrainState(params, opt_state, state.sgd_steps + 1), (loss, priorities)

    def update(state: TrainState, batches: dict):
        state, (loss, priorities) = jax.lax.scan(sgd_step, state, batches)
        return state, {"losses/bc_loss": loss.mean()}, priorities

    return jax.jit(
        update,
        donate_argnums=0,
        in_shardings=(shardings.replicated, shardings.batch),
        out_shardings=(shardings.replicated, shardings.replicated, shardings.batch),
    )


# ---------------------------------------------------------------------------------------------
# Acting (evaluation)
# ---------------------------------------------------------------------------------------------


def deterministic_action(policy: Policy, mode: str, params, obs):
    out, _ = policy.apply(params, obs)
    return jnp.argmax(out, axis=-1) if mode == "discrete" else jnp.tanh(out)


def make_act(policy: Policy, mode: str):
    """jit(params, obs, mean, std) -> deterministic action (index, or in [-1, 1])."""
    return jax.jit(lambda params, obs, mean, std: deterministic_action(policy, mode, params, (obs - mean) / std))


def linear_schedule(start: float, end: float, duration: float, t: float) -> float:
    """start -> end linearly over `duration`, then end."""
    return end + (start - end) * max(0.0, 1.0 - t / duration)


# ---------------------------------------------------------------------------------------------
# Training loop
# ---------------------------------------------------------------------------------------------


def train(args: Args) -> dict:
    """Train with checked flags (main() checks them and merges a --resume run's own). Returns
    {run_dir, updates, eval_mean, score}, or {..., signal} when a signal stopped it."""
    # The learner's devices (one by default): parameters replicated, each batch split across them.
    shardings = learner_shardings(args)
    data = load_training_data(args)
    stats = obs_stats(data.dataset.observations, args.normalize_obs)
    policy = Policy(data.out_dim, args.hidden_sizes, data.mode == "nll")
    optimizer = make_optimizer(args)
    params = policy.init(jax.random.PRNGKey(args.seed), jnp.zeros((1, data.dataset.observations.shape[1])))
    state = TrainState(params, optimizer.init(params), jnp.zeros((), jnp.int32))
    replay = PrioritizedDataset(
        data.dataset.observations,
        data.dataset.actions,
        args.per_alpha if args.prioritized else 0.0,
        args.per_eps,
        args.per_weight_norm,
    )
    update = make_update(policy, data.mode, optimizer, stats, shardings)
    act = make_act(policy, data.mode)
    print(f"{len(data.dataset.rewards)} examples from {len(args.dataset)} file(s), env {data.env_id}, loss {data.mode}")
    # The run folder, a --resume checkpoint, logging, the prefetch and priority threads, signals,
    # evaluations and checkpoints: Part 2. The loop below is the algorithm.
    run = Run(args, data, stats, replay, act, shardings)
    state = run.restore(state)
    with run:
        while run.updates < args.total_updates and not run.stopped:
            # LEARN: K SGD steps per jitted call on minibatches the prefetch thread samples (by
            # loss with --prioritized, IS-weighted); the priorities go back on another thread.
            replay.beta = linear_schedule(args.per_beta0, 1.0, args.total_updates, run.updates)
            batches, indexes = run.next_batches()
            state, metrics, priorities = update(state, batches)
            run.learned(state, metrics, indexes, priorities)

            run.evaluate_if_due()
            run.log_if_due()
            run.checkpoint_if_due(state)
    return run.finish(state)


# =============================================================================================
# PART 2: THE MACHINERY
# What makes the loop above a dependable program: a reader learning the algorithm can stop
# here. Flag checks, dataset readers, envs, threads, devices, the run (folder, resume,
# logging, evaluation, checkpoints), files, and the command line.
# =============================================================================================


# ---------------------------------------------------------------------------------------------
# Errors and flag checks
# ---------------------------------------------------------------------------------------------


class ConfigError(Exception):
    """Bad input from the user: reported as one line, without a traceback."""


class RunFailed(Exception):
    """The run cannot go on (a checkpoint that cannot be written, divergence): one line, exit 1."""


class Diverged(RunFailed):
    """The learner produced a non-finite loss or parameters: one line, naming the SGD step."""


def check_args(args: Args, packages: bool = True) -> None:
    """One ConfigError for the first bad flag. packages=False skips the optional packages of
    --capture-video and --track: flags read from a file need them only where this process acts on
    them (a model's flags for --eval-only do not; a resumed run's merged flags are checked with)."""
    positive = (
        "total_updates",
        "batch_size",
        "updates_per_call",
        "prefetch_size",
        "eval_every",
        "eval_episodes",
        "log_every",
        "learning_rate",
        "per_eps",
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
    if args.loss not in ("mse", "nll"):
        raise ConfigError(f"--loss must be 'mse' or 'nll', got {args.loss!r}")
    if not 0.0 < args.top_fraction <= 1.0:
        raise ConfigError(f"--top-fraction must be in (0, 1], got {args.top_fraction}")
    if not 0.0 <= args.per_beta0 <= 1.0:
        raise ConfigError(f"--per-beta0 must be in [0, 1], got {args.per_beta0}")
    if args.per_alpha < 0 or args.checkpoint_every < 0:
        raise ConfigError("--per-alpha and --checkpoint-every must be >= 0")
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
# Datasets: D4RL-layout HDF5, Minari folders, .npz
# ---------------------------------------------------------------------------------------------

REQUIRED = ("observations", "actions", "rewards", "terminals", "timeouts")


class Dataset(NamedTuple):
    observations: np.ndarray  # [N, obs_dim] float32
    actions: np.ndarray  # [N] int64 (discrete) or [N, action_dim] float32
    rewards: np.ndarray  # [N] float32
    terminals: np.ndarray  # [N] bool: the episode ended in a terminal state
    timeouts: np.ndarray  # [N] bool: the episode was cut off (or the trajectory ends here)
    metadata: dict


def _clean_metadata(items) -> dict:
    """HDF5/npz scalars (numpy 0-d arrays, numpy scalars, bytes) as plain Python values."""
    out = {}
    for key, value in items:
        if isinstance(value, (np.ndarray, np.generic)) and np.ndim(value) == 0:
            value = value.item()
        out[key] = value.decode() if isinstance(value, bytes) else value
    return out


def _from_flat(arrays: dict, metadata: dict, path: str) -> Dataset:
    missing = [k for k in REQUIRED if k not in arrays]
    if missing:
        raise ConfigError(f"{path}: missing key(s) {', '.join(missing)}")
    n = len(arrays["observations"])
    lengths = {k: len(arrays[k]) for k in REQUIRED}
    if any(v != n for v in lengths.values()):
        raise ConfigError(f"{path}: arrays of different lengths {lengths}")
    if n == 0:
        raise ConfigError(f"{path}: the dataset is empty")
    arrays = {k: np.asarray(arrays[k]) for k in REQUIRED}
    for key, values in arrays.items():
        if values.dtype.kind not in "biuf":  # strings or references would fail further on, unnamed
            raise ConfigError(f"{path}: {key} are not numbers (dtype {values.dtype})")
    for key in ("rewards", "terminals", "timeouts"):
        if arrays[key].size != n:
            raise ConfigError(f"{path}: {key} of shape {arrays[key].shape}, expected ({n},)")
    actions = arrays["actions"]
    discrete = np.issubdtype(actions.dtype, np.integer) or (actions.ndim == 1 and metadata.get("discrete_actions"))
    terminals = arrays["terminals"].astype(bool).reshape(n)
    timeouts = arrays["timeouts"].astype(bool).reshape(n)  # astype copies: the file's array is not written
    if not (terminals[-1] or timeouts[-1]):
        # A file's last row ends its last trajectory even when the writer flagged nothing there
        # (a D4RL file may stop mid-episode). Left open, the next --dataset file's first episode
        # would continue it, and --top-fraction would rank the two by their summed return. A
        # timeout, not a terminal: the episode was cut off, it did not reach a terminal state.
        timeouts[-1] = True
    return Dataset(
        arrays["observations"].astype(np.float32).reshape(n, -1),
        actions.astype(np.int64) if discrete else actions.astype(np.float32).reshape(n, -1),
        arrays["rewards"].astype(np.float32).reshape(n),
        terminals,
        timeouts,
        metadata,
    )


def read_d4rl_hdf5(path: str) -> Dataset:
    with h5py.File(path, "r") as f:
        arrays = {k: f[k][()] for k in REQUIRED if k in f and isinstance(f[k], h5py.Dataset)}
        group = f["metadata"] if "metadata" in f else None
        metadata = (
            {}
            if group is None
            else _clean_metadata(
                [*group.attrs.items(), *((k, v[()]) for k, v in group.items() if isinstance(v, h5py.Dataset))]
            )
        )
    return _from_flat(arrays, metadata, path)


def read_npz(path: str) -> Dataset:
    with np.load(path, allow_pickle=False) as z:
        arrays = {k: z[k] for k in REQUIRED if k in z.files}
        metadata = _clean_metadata((k[len("metadata/") :], z[k]) for k in z.files if k.startswith("metadata/"))
    return _from_flat(arrays, metadata, path)


def _json_object(value) -> dict:
    """minari nests env specs and spaces as JSON strings inside its JSON: the decoded object,
    or {} when it is missing or not an object (only the env id depends on it; --env-id can
    give that)."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return {}
    return value if isinstance(value, dict) else {}


MINARI_KEYS = ("observations", "actions", "rewards", "terminations", "truncations")


# Spaces whose samples minari stores as one numeric array per episode, which BC's MLP can take
# flattened. Dict and Tuple spaces are nested HDF5 groups, Text is strings: refused by name.
MINARI_OBS_SPACES = ("Box", "Discrete", "MultiBinary", "MultiDiscrete")


MINARI_ACTION_SPACES = ("Box", "Discrete")


def _minari_metadata(meta_path: str) -> dict:
    """metadata.json's scalar entries (ref_min_score, ref_max_score, total_episodes, ...) and
    the env id, after refusing storage formats and spaces this reader cannot use."""
    if not os.path.isfile(meta_path):
        return {}  # minari needs it; BC takes only the env id and the ref scores from it
    try:
        with open(meta_path, encoding="utf-8") as f:
            raw = json.load(f)
    except ValueError:  # json's decode errors and UnicodeDecodeError both are ValueErrors
        raise ConfigError(f"{meta_path}: not valid JSON") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{meta_path}: not a JSON object")
    if raw.get("data_format", "hdf5") != "hdf5":
        raise ConfigError(f"{meta_path}: data_format {raw['data_format']!r}; only minari's 'hdf5' storage is read here")
    for key, allowed in (("observation_space", MINARI_OBS_SPACES), ("action_space", MINARI_ACTION_SPACES)):
        kind = _json_object(raw.get(key)).get("type")
        if kind is not None and kind not in allowed:
            raise ConfigError(
                f"{meta_path}: the {key} is a {kind} space; BC here reads {', '.join(allowed)} "
                f"(flatten it with a gymnasium wrapper before collecting)"
            )
    metadata = {k: v for k, v in raw.items() if isinstance(v, (str, int, float, bool))}
    # minari evaluates on eval_env_spec when the dataset has one (its reference scores were
    # measured there) and on env_spec otherwise; both are a gymnasium EnvSpec as a JSON string.
    for key in ("eval_env_spec", "env_spec"):
        env_id = _json_object(raw.get(key)).get("id")
        if isinstance(env_id, str) and env_id:
            metadata["env_id"] = env_id
            break
    return metadata


def _minari_episode(ep: h5py.Group, where: str) -> Tuple[np.ndarray, ...]:
    """One episode's arrays, shapes and dtypes checked before use: T+1 observations, then T
    actions, rewards, terminations and truncations."""
    missing = [k for k in MINARI_KEYS if k not in ep]
    if missing:
        raise ConfigError(f"{where} is missing {', '.join(missing)}")
    for key in MINARI_KEYS:
        if key in ("observations", "actions") and isinstance(ep[key], h5py.Group):
            # how minari stores the samples of a Dict or Tuple space
            raise ConfigError(
                f"{where}: {key} are an HDF5 group, i.e. a Dict or Tuple space; "
                f"BC here reads flat Box and Discrete spaces"
            )
        if not isinstance(ep[key], h5py.Dataset):
            raise ConfigError(f"{where}: {key} is not an array")
    # Dtypes before reading: a JPEG-encoded image (minari's default for uint8 image spaces) is
    # a variable-length byte string and text a string, neither an array of numbers.
    for key in MINARI_KEYS:
        if ep[key].dtype.kind not in "biuf":
            raise ConfigError(
                f"{where}: {key} are not numbers (dtype {ep[key].dtype}; JPEG-encoded images and text are not read)"
            )
    if ep["actions"].ndim == 0 or ep["observations"].ndim == 0:
        raise ConfigError(f"{where}: observations and actions must be arrays with a time axis")
    T = ep["actions"].shape[0]
    if ep["observations"].shape[0] != T + 1:
        raise ConfigError(f"{where}: {ep['observations'].shape[0]} observations for {T} actions (needs T+1)")
    for key in ("rewards", "terminations", "truncations"):
        if ep[key].shape != (T,):
            raise ConfigError(f"{where}: {key} of shape {ep[key].shape}, expected {(T,)}")
    obs, actions, rewards = ep["observations"][()], ep["actions"][()], ep["rewards"][()]
    flags = []
    for key in ("terminations", "truncations"):
        values = ep[key][()]
        if not np.isin(values, (0, 1)).all():
            raise ConfigError(f"{where}: {key} are not booleans")
        flags.append(values.astype(bool))
    return obs, actions, rewards, flags[0], flags[1]


def read_minari(folder: str) -> Dataset:
    """A Minari dataset folder (minari >= 0.5 with its hdf5 storage, as DataCollector writes it):
    <folder>/data/ holds main_data.hdf5, one group episode_<id> per episode, and metadata.json
    (env_spec, ref_min_score, ref_max_score, ...). The data/ folder itself may be given too."""
    data_dir = os.path.join(folder, "data")
    if not os.path.isdir(data_dir) and os.path.isfile(os.path.join(folder, "main_data.hdf5")):
        data_dir = folder
    metadata = _minari_metadata(os.path.join(data_dir, "metadata.json"))
    path = os.path.join(data_dir, "main_data.hdf5")
    if not os.path.isfile(path):
        raise ConfigError(f"{folder}: not a Minari dataset folder (no data/main_data.hdf5)")
    parts = {k: [] for k in REQUIRED}
    with h5py.File(path, "r") as f:
        names = list(f.keys())
        for name in names:
            is_episode = name.startswith("episode_") and name[len("episode_") :].isdigit()
            if not (is_episode and isinstance(f[name], h5py.Group)):
                raise ConfigError(f"{path}: {name!r} is not an episode group (episode_<id>)")
        if not names:
            raise ConfigError(f"{path}: no episodes")
        names.sort(key=lambda name: int(name[len("episode_") :]))  # in id order, not episode_10 < episode_2
        first = None
        for name in names:
            where = f"{path}: {name}"
            obs, actions, rewards, terminals, timeouts = _minari_episode(f[name], where)
            # Episodes must agree before they are concatenated: numpy would fail on other widths
            # without naming the episode, and would silently turn integer actions into floats.
            if first is None:
                first = (name, obs.shape[1:], actions.dtype, actions.shape[1:])
            elif obs.shape[1:] != first[1]:
                raise ConfigError(f"{where}: observations of shape {obs.shape[1:]}, {first[0]}'s are {first[1]}")
            elif (
                np.issubdtype(actions.dtype, np.integer) != np.issubdtype(first[2], np.integer)
                or actions.shape[1:] != first[3]
            ):
                raise ConfigError(
                    f"{where}: actions {actions.dtype} of shape {actions.shape[1:]}, "
                    f"{first[0]}'s are {first[2]} of shape {first[3]}"
                )
            if len(actions) and not (terminals[-1] or timeouts[-1]):
                timeouts[-1] = True  # a stored episode ends here whatever its flags say
            parts["observations"].append(obs[:-1])
            parts["actions"].append(actions)
            parts["rewards"].append(rewards)
            parts["terminals"].append(terminals)
            parts["timeouts"].append(timeouts)
    steps = sum(len(r) for r in parts["rewards"])
    for key, found, what in (("total_episodes", len(names), "episodes"), ("total_steps", steps, "steps")):
        claimed = metadata.get(key)
        if isinstance(claimed, int) and not isinstance(claimed, bool) and claimed != found:
            raise ConfigError(f"{folder}: metadata.json says {claimed} {what}, main_data.hdf5 holds {found}")
    return _from_flat({k: np.concatenate(v) for k, v in parts.items()}, metadata, folder)


def read_dataset(path: str) -> Dataset:
    """Any supported format, checked: a bad file raises a ConfigError naming it."""
    if not os.path.exists(path):
        raise ConfigError(f"{path}: no such file or folder")
    try:
        if os.path.isdir(path):
            ds = read_minari(path)
        elif path.endswith(".npz"):
            ds = read_npz(path)
        else:
            ds = read_d4rl_hdf5(path)
    except ConfigError:
        raise
    except Exception as e:
        raise ConfigError(f"{path}: unreadable dataset ({type(e).__name__}: {e})") from None
    for name in ("observations", "actions", "rewards"):
        values = getattr(ds, name)
        if np.issubdtype(values.dtype, np.floating) and not np.all(np.isfinite(values)):
            raise ConfigError(f"{path}: {name} contain NaN or inf")
    for key in ("ref_min_score", "ref_max_score"):  # used in arithmetic at every evaluation
        value = ds.metadata.get(key)
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, (int, float)) or not np.isfinite(value)
        ):
            raise ConfigError(f"{path}: metadata {key} must be a number, got {value!r}")
    env_id = ds.metadata.get("env_id")
    if env_id is not None and not (isinstance(env_id, str) and env_id):
        raise ConfigError(f"{path}: metadata env_id must be a non-empty string, got {env_id!r}")
    if env_id and ":" in env_id:  # gymnasium imports the module named before ':' when making the env
        raise ConfigError(f"{path}: env id {env_id!r} names a module to import; not taken from a file")
    return ds


def concatenate(datasets: List[Dataset], paths: List[str]) -> Dataset:
    first = datasets[0]
    for ds, path in zip(datasets[1:], paths[1:]):
        if (
            ds.observations.shape[1:] != first.observations.shape[1:]
            or ds.actions.shape[1:] != first.actions.shape[1:]
            or ds.actions.dtype != first.actions.dtype
        ):
            raise ConfigError(f"{path}: observations/actions do not match those of {paths[0]}")
        env_ids = {first.metadata.get("env_id"), ds.metadata.get("env_id")} - {None}
        if len(env_ids) > 1:
            raise ConfigError(
                f"{path}: env {ds.metadata.get('env_id')} differs from {first.metadata.get('env_id')} of {paths[0]}"
            )
    metadata = {}
    for ds in reversed(datasets):  # the first file's values win
        metadata.update(ds.metadata)
    return Dataset(*(np.concatenate([getattr(ds, k) for ds in datasets]) for k in Dataset._fields[:-1]), metadata)


def trajectory_bounds(terminals: np.ndarray, timeouts: np.ndarray) -> np.ndarray:
    """[start, end) of each trajectory: one ends after every terminal or timeout, and an
    unfinished tail counts as one more."""
    ends = np.flatnonzero(terminals | timeouts) + 1
    if len(ends) == 0 or ends[-1] != len(terminals):
        ends = np.append(ends, len(terminals))
    starts = np.concatenate([[0], ends[:-1]])
    return np.stack([starts, ends], axis=1)


def top_fraction_mask(ds: Dataset, fraction: float) -> np.ndarray:
    """Rows of "x% BC": the top `fraction` of the dataset's timesteps ordered by their episode's
    undiscounted return (Chen et al. 2021, section 5.3), selected as the paper's code does:
    whole trajectories, best return first, while their total length stays within
    floor(fraction * N) rows; the best trajectory is always kept, and the selection stops at
    the first trajectory that does not fit (a shorter, worse one is not tried). Ties: the
    earlier trajectory first."""
    bounds = trajectory_bounds(ds.terminals, ds.timeouts)
    returns = np.add.reduceat(ds.rewards.astype(np.float64), bounds[:, 0])
    order = np.argsort(-returns, kind="stable")
    budget = int(fraction * len(ds.rewards) + 1e-6)  # the epsilon: 0.29 * 100 is 28.999999999999996
    covered = np.cumsum(bounds[order, 1] - bounds[order, 0])
    keep = max(1, int(np.sum(covered <= budget)))  # covered only grows, so this counts a prefix
    best = order[:keep]
    mask = np.zeros(len(ds.rewards), bool)
    for start, end in bounds[best]:
        mask[start:end] = True
    return mask


class TrainingData(NamedTuple):
    dataset: Dataset  # after --top-fraction, continuous actions mapped to [-1, 1]
    env_id: str
    mode: str  # "discrete", "mse" or "nll"
    out_dim: int  # number of actions (discrete) or action dimensions
    ref_min: Optional[float]
    ref_max: Optional[float]
    digest: str  # fingerprint of the training data, checked on --resume


def load_training_data(args: Args) -> TrainingData:
    datasets = [read_dataset(p) for p in args.dataset]
    ds = concatenate(datasets, args.dataset)
    env_id = args.env_id or ds.metadata.get("env_id")
    if not env_id:
        raise ConfigError(f"{args.dataset[0]}: no env_id in the metadata; give --env-id")
    envs = make_env(env_id, 1)
    try:
        for one, path in zip(datasets, args.dataset):
            check_dataset_matches_env(one, envs, path)
        space = envs.single_action_space
        discrete = isinstance(space, gym.spaces.Discrete)
    finally:
        envs.close()
    if args.top_fraction < 1.0:
        mask = top_fraction_mask(ds, args.top_fraction)
        ds = Dataset(*(getattr(ds, k)[mask] for k in Dataset._fields[:-1]), ds.metadata)
    if not discrete:  # the policy works in [-1, 1]; map the dataset's actions there once
        ds = ds._replace(actions=from_env_action(ds.actions, space.low, space.high).astype(np.float32))
    ref_min = args.ref_min_score if args.ref_min_score is not None else ds.metadata.get("ref_min_score")
    ref_max = args.ref_max_score if args.ref_max_score is not None else ds.metadata.get("ref_max_score")
    digest = hashlib.sha1(ds.observations.tobytes() + ds.actions.tobytes()).hexdigest()
    return TrainingData(
        ds,
        env_id,
        "discrete" if discrete else args.loss,
        int(space.n) if discrete else space.shape[0],
        ref_min,
        ref_max,
        digest,
    )


# ---------------------------------------------------------------------------------------------
# Environment
# ---------------------------------------------------------------------------------------------


def make_env(env_id: str, num_envs: int, video: Optional[Tuple[str, str]] = None) -> gym.vector.VectorEnv:
    """A synchronous vector env for evaluation, with the autoreset mode set explicitly; with
    video = (folder, prefix), sub-env 0 films its first episode (see film_first_episode)."""
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
    space = envs.single_action_space
    if not (
        isinstance(space, gym.spaces.Discrete)
        or (isinstance(space, gym.spaces.Box) and np.all(np.isfinite(space.low)) and np.all(np.isfinite(space.high)))
    ):
        envs.close()
        raise ConfigError(f"{env_id} has action space {space}; BC here handles Discrete and bounded Box actions")
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


def check_dataset_matches_env(ds: Dataset, envs: gym.vector.VectorEnv, where: str) -> None:
    obs_shape = envs.single_observation_space.shape
    if int(np.prod(obs_shape)) != ds.observations.shape[1]:
        raise ConfigError(f"{where}: observations have {ds.observations.shape[1]} features, the env {obs_shape}")
    space = envs.single_action_space
    if isinstance(space, gym.spaces.Discrete):
        if ds.actions.ndim != 1 or not np.issubdtype(ds.actions.dtype, np.integer):
            raise ConfigError(
                f"{where}: the env has discrete actions but the dataset's actions are "
                f"{ds.actions.dtype} of shape {ds.actions.shape[1:]}"
            )
        if ds.actions.min() < 0 or ds.actions.max() >= space.n:
            raise ConfigError(f"{where}: actions outside 0..{space.n - 1}")
    else:
        if ds.actions.ndim != 2 or ds.actions.shape[1:] != space.shape:
            raise ConfigError(f"{where}: actions of shape {ds.actions.shape[1:]} do not match the env's {space.shape}")
        tolerance = 1e-4 * (space.high - space.low)
        if np.any(ds.actions < space.low - tolerance) or np.any(ds.actions > space.high + tolerance):
            raise ConfigError(f"{where}: actions outside the env's bounds [{space.low}, {space.high}]")


def to_env_action(action: np.ndarray, low: np.ndarray, high: np.ndarray) -> np.ndarray:
    """[-1, 1] -> [low, high], affine per dimension; clipped against float rounding."""
    return np.clip(low + (action + 1.0) * 0.5 * (high - low), low, high)


def from_env_action(env_action: np.ndarray, low: np.ndarray, high: np.ndarray) -> np.ndarray:
    """[low, high] -> [-1, 1], the inverse of to_env_action."""
    return np.clip(2.0 * (env_action - low) / (high - low) - 1.0, -1.0, 1.0)


# ---------------------------------------------------------------------------------------------
# Replay plumbing
# ---------------------------------------------------------------------------------------------


def sample_batches(replay, batch_size: int, num_batches: int, sharding: Optional[jax.sharding.Sharding] = None):
    """What the learner gets for one call: (batches[K, B, ...] on the device(s), row indexes[K * B]).
    Runs on the prefetch thread, so the device transfer is off the learner's path too; with
    several devices each gets its own slice of B here (Shardings.batch)."""
    batch, indexes = replay.sample(batch_size, num_batches)
    batch = {k: v.reshape((num_batches, batch_size) + v.shape[1:]) for k, v in batch.items()}
    return jax.device_put(batch, sharding), indexes


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
    """Writes the priorities of the sampled examples back on a background thread, and stops the
    run on a non-finite one (with uniform sampling too: it only checks then).

    Reading the priorities waits for the learner's computation, so doing it here keeps that wait
    (and the lock) off the acting loop. flush() blocks until everything submitted is written.
    """

    def __init__(self, replay: PrioritizedDataset, write: bool = True):
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
                indexes, priorities, first_step = item
                priorities = np.asarray(priorities, np.float64)  # [K, B]: waits for the learner
                finite = np.isfinite(priorities).all(axis=1)
                if not finite.all():
                    raise Diverged(
                        f"the learner diverged: non-finite loss or parameters at SGD step "
                        f"{first_step + int(np.argmin(finite)) + 1}; try a lower --learning-rate"
                    )
                if self._write:
                    self._replay.update_priorities(indexes, priorities.reshape(-1))
            except BaseException as e:
                self._error = self._error or e  # the first one is the one to report
            finally:
                self._queue.task_done()

    def submit(self, indexes: np.ndarray, priorities: jax.Array, first_step: int) -> None:
        """Queue the priorities[K, B] of the K SGD steps after SGD step first_step."""
        self._raise()
        self._queue.put((indexes, priorities, first_step))

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
    checkpoint, the update counter, the prefetch and priority-writer threads, the devices,
    logging and the progress line, evaluations, checkpoints, and Ctrl-C / SIGTERM (`with run:`
    stops the threads however the loop ends)."""

    def __init__(
        self, args: Args, data: TrainingData, stats: ObsStats, replay: PrioritizedDataset, act, shardings: Shardings
    ):
        self.args, self.data, self.stats, self.replay, self.act = args, data, stats, replay, act
        self.shardings = shardings
        self.prefetcher: Optional[Prefetcher] = None
        self.stop = StopRequest()
        self.metrics: dict = {}
        self.last_eval = "-"

    @property
    def stopped(self) -> bool:
        return self.stop.signum is not None

    def restore(self, state: TrainState) -> TrainState:
        """The state of the --resume checkpoint (with the dataset's priorities), or the fresh one
        given; then the run folder, the logger and the counters. The state goes on the learner's
        devices."""
        args, data = self.args, self.data
        if args.resume:
            ckpt = os.path.join(args.resume, "checkpoint.npz")
            meta, arrays = load_npz(ckpt, "checkpoint")
            if meta.get("digest") != data.digest:
                raise ConfigError(f"--resume {args.resume}: the dataset differs from the one this run trained on")
            state = restore_tree(state, arrays, "train_state/", ckpt)
            priority = check_array(arrays, "priority", self.replay.priority.shape, np.float64, ckpt)
            max_priority = float(check_array(arrays, "max_priority", (), np.float64, ckpt))
            if not (
                np.isfinite(priority).all() and (priority >= 0).all() and np.isfinite(max_priority) and max_priority > 0
            ):
                raise ConfigError(f"{ckpt}: priorities out of range")
            self.replay.load_priorities(priority, max_priority)
            saved_total = meta["args"].get("total_updates") if isinstance(meta.get("args"), dict) else None
            note = (
                f"; the lr and beta schedules now run to --total-updates {args.total_updates}, not {saved_total}"
                if saved_total not in (None, args.total_updates)
                else ""
            )
            print(f"resumed {args.resume} at update {int(state.sgd_steps)}{note}")
        state = jax.device_put(state, self.shardings.replicated)  # a checkpoint holds one copy, whatever N wrote it
        self.act_params = local_copy(state.params)

        self.run_dir = args.run_dir or os.path.join(
            "runs", f"{data.env_id.replace('/', '-')}__{SCRIPT}__{args.seed}__{int(time.time())}"
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
        self.updates = self.before = int(state.sgd_steps)
        updates = self.updates
        self.logger = Logger(
            self.run_dir, (updates if updates < args.total_updates else updates - 1) if args.resume else None, args
        )
        self.meta = {
            "format": CHECKPOINT_FORMAT,
            "script": SCRIPT,
            "args": dataclasses.asdict(args),
            "env_id": data.env_id,
            "mode": data.mode,
            "out_dim": data.out_dim,
            "ref_min": data.ref_min,
            "ref_max": data.ref_max,
        }
        self.stats_arrays = {"obs_mean": self.stats.mean, "obs_std": self.stats.std}
        self.saved = {"step": updates if args.resume else None, "time": time.monotonic()}  # the newest checkpoint
        self.window = {"time": time.perf_counter(), "updates": updates, "wait": 0.0, "learn": 0.0}
        self.console = Console(args.total_updates, updates, "updates")
        self.writer = PriorityWriter(self.replay, write=args.prioritized)  # with alpha = 0 a write changes nothing
        return state

    def next_batches(self):
        """(batches[K, B, ...] on the devices, row indexes) from the prefetch thread, which starts at
        the first call (so its first draws see the beta train() set). The last call, when K does
        not divide --total-updates, samples its shorter batch here (compiled once more)."""
        args = self.args
        steps = self.steps = min(args.updates_per_call, args.total_updates - self.updates)
        if self.prefetcher is None:
            self.prefetcher = Prefetcher(
                functools.partial(
                    sample_batches, self.replay, args.batch_size, args.updates_per_call, self.shardings.batch
                ),
                args.prefetch_size,
            )
        self.t0 = time.perf_counter()
        if steps == args.updates_per_call:
            batches = self.prefetcher.get()
        else:
            batches = sample_batches(self.replay, args.batch_size, steps, self.shardings.batch)
        self.window["wait"] += time.perf_counter() - self.t0
        return batches

    def learned(self, state: TrainState, metrics: dict, indexes, priorities) -> None:
        """After an update call: queue its priorities for the writer thread, count its updates,
        take the evaluation copy of the new parameters."""
        self.writer.submit(indexes, priorities, self.updates)
        self.window["learn"] += time.perf_counter() - self.t0
        self.before, self.updates = self.updates, self.updates + self.steps
        self.metrics = metrics
        self.act_params = local_copy(state.params)

    def crossed(self, every: int) -> bool:
        """Whether the last update call passed a multiple of `every`."""
        return bool(every) and self.updates // every > self.before // every

    def evaluate(self, prefix: str) -> Tuple[np.ndarray, float]:
        video = (os.path.join(self.run_dir, "videos"), prefix) if self.args.capture_video else None
        returns = evaluate(
            self.act,
            self.act_params,
            self.stats,
            self.data.env_id,
            self.args.eval_episodes,
            self.args.seed + 10_000,
            video,
        )
        score = normalized_score(returns, self.data.ref_min, self.data.ref_max)
        self.logger.eval(self.updates, returns, score, video)
        self.last_eval = f"{returns.mean():.1f} (score {score:.1f})"
        return returns, score

    def evaluate_if_due(self) -> None:
        if self.crossed(self.args.eval_every) and self.updates < self.args.total_updates:  # the final one: finish()
            self.evaluate(f"eval-update-{self.updates}")

    def log_if_due(self) -> None:
        if not self.crossed(self.args.log_every):
            return
        now, window, updates = time.perf_counter(), self.window, self.updates
        scalars = {
            "perf/updates_per_second": (updates - window["updates"]) / (now - window["time"]),
            "perf/learner_wait_fraction": window["wait"] / window["learn"],
            "replay/beta": self.replay.beta,
            "replay/priority_max": self.replay.max_priority(),
            **{k: float(v) for k, v in self.metrics.items()},
        }
        self.logger.scalars(updates, scalars)
        self.logger.flush()
        fields = f"loss {scalars['losses/bc_loss']:.4f}  eval {self.last_eval}"
        rate = scalars["perf/updates_per_second"]
        self.console.update(updates, rate, fields, f"update {updates:>7d}  updates/s {rate:7.0f}  {fields}")
        window.update(time=now, updates=updates, wait=0.0, learn=0.0)

    def checkpoint(self, state: TrainState) -> None:
        self.writer.flush()
        save_checkpoint(
            self.run_dir,
            {**self.meta, "kind": "checkpoint", "digest": self.data.digest},
            {
                **tree_arrays("train_state/", state),
                **self.stats_arrays,
                "priority": self.replay.priority.copy(),
                "max_priority": np.asarray(self.replay.max_priority(), np.float64),
            },
            self.updates,
            self.saved["step"],
            self.args.keep_checkpoints,
        )
        self.saved.update(step=self.updates, time=time.monotonic())

    def checkpoint_if_due(self, state: TrainState) -> None:
        minutes = self.args.checkpoint_minutes
        if self.crossed(self.args.checkpoint_every) or (
            minutes and time.monotonic() - self.saved["time"] >= 60 * minutes
        ):
            self.checkpoint(state)

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

    def finish(self, state: TrainState) -> dict:
        """The last checkpoint; then, unless a signal stopped the run, model.npz, the final
        evaluation and curve.png."""
        self.checkpoint(state)
        run_dir, updates = self.run_dir, self.updates
        if self.stopped:
            self.logger.close()
            print(
                f"stopped by signal {self.stop.signum} at update {updates}; continue with --resume {run_dir}",
                flush=True,
            )
            return {"run_dir": run_dir, "updates": updates, "signal": self.stop.signum}
        save_npz_atomic(
            os.path.join(run_dir, "model.npz"),
            {**self.meta, "kind": "model"},
            {**tree_arrays("params/", state.params), **self.stats_arrays},
        )
        returns, score = self.evaluate(f"final-update-{updates}")
        self.logger.close()
        write_curve(run_dir)
        print(
            f"final eval after {updates} updates: {returns.mean():.2f} +- {returns.std():.2f}, "
            f"normalised score {score:.1f}; run dir {run_dir}",
            flush=True,
        )
        return {"run_dir": run_dir, "updates": updates, "eval_mean": float(returns.mean()), "score": score}


# ---------------------------------------------------------------------------------------------
# Evaluation
# ---------------------------------------------------------------------------------------------


def evaluate(
    act, params, stats: ObsStats, env_id: str, episodes: int, seed: int, video: Optional[Tuple[str, str]] = None
) -> np.ndarray:
    """Returns of `episodes` deterministic episodes run as parallel envs (each contributes its
    first episode), with the same seeds every time; with video = (folder, prefix) the first
    episode is filmed to video_file(video)."""
    envs = make_env(env_id, episodes, video)
    try:
        space = envs.single_action_space
        discrete = isinstance(space, gym.spaces.Discrete)
        obs, _ = envs.reset(seed=seed)
        envs.action_space.seed(seed)
        returns, running = np.zeros(episodes), np.ones(episodes, bool)
        while running.any():
            action = np.asarray(act(params, obs.reshape(episodes, -1).astype(np.float32), stats.mean, stats.std))
            obs, reward, terminated, truncated, _ = envs.step(
                action if discrete else to_env_action(action, space.low, space.high)
            )
            returns += reward * running
            running &= ~(terminated | truncated)
        return returns
    finally:
        envs.close()


def normalized_score(returns: np.ndarray, ref_min: Optional[float], ref_max: Optional[float]) -> float:
    if ref_min is None or ref_max is None or ref_max == ref_min:
        return float("nan")
    return float(100.0 * (returns.mean() - ref_min) / (ref_max - ref_min))


def model_from_file(path: str) -> Tuple[dict, Policy, Any, ObsStats]:
    """(meta, policy, params, obs stats) of a model.npz or checkpoint.npz, every part checked."""
    kind = "checkpoint" if os.path.basename(path).startswith("checkpoint") else "model"
    meta, arrays = load_npz(path, kind)
    saved = args_from_json(meta.get("args"), path)
    env_id, mode, out_dim = meta.get("env_id"), meta.get("mode"), meta.get("out_dim")
    if not (
        isinstance(env_id, str)
        and ":" not in env_id
        and mode in ("discrete", "mse", "nll")
        and type(out_dim) is int
        and out_dim > 0
        and all(meta.get(k) is None or type(meta.get(k)) in (int, float) for k in ("ref_min", "ref_max"))
    ):
        raise ConfigError(f"{path}: env_id, mode, out_dim or reference scores in meta.json are not valid")
    mean = arrays.get("obs_mean")
    obs_dim = mean.shape[0] if isinstance(mean, np.ndarray) and mean.ndim == 1 else 0
    stats = ObsStats(
        check_array(arrays, "obs_mean", (obs_dim,), np.float32, path),
        check_array(arrays, "obs_std", (obs_dim,), np.float32, path),
    )
    policy = Policy(out_dim, saved.hidden_sizes, mode == "nll")
    template = policy.init(jax.random.PRNGKey(0), jnp.zeros((1, obs_dim)))
    prefix = "train_state/params/" if kind == "checkpoint" else "params/"
    params = restore_tree(template, arrays, prefix, path)
    return meta, policy, params, stats


def run_eval_only(args: Args) -> np.ndarray:
    path = args.load if not os.path.isdir(args.load) else os.path.join(args.load, "model.npz")
    meta, policy, params, stats = model_from_file(path)
    envs = make_env(meta["env_id"], 1)
    obs_shape, space = envs.single_observation_space.shape, envs.single_action_space
    envs.close()
    discrete = isinstance(space, gym.spaces.Discrete)
    if (
        int(np.prod(obs_shape)) != len(stats.mean)
        or (meta["mode"] == "discrete") != discrete
        or meta["out_dim"] != (int(space.n) if discrete else space.shape[0])
    ):
        raise ConfigError(
            f"{path}: the model maps {len(stats.mean)} features to {meta['out_dim']} actions; "
            f"{meta['env_id']} has observations {obs_shape} and actions {space}"
        )
    kind = "checkpoint" if os.path.basename(path).startswith("checkpoint") else "model"
    video = (os.path.join(os.path.dirname(path), "videos"), f"eval-{kind}") if args.capture_video else None
    returns = evaluate(
        make_act(policy, meta["mode"]), params, stats, meta["env_id"], args.eval_episodes, args.seed + 10_000, video
    )
    score = normalized_score(returns, meta.get("ref_min"), meta.get("ref_max"))
    print(
        f"eval {meta['env_id']}: {returns.mean():.2f} +- {returns.std():.2f} over {len(returns)} "
        f"episodes, normalised score {score:.1f}"
    )
    return returns


# ---------------------------------------------------------------------------------------------
# Checkpoint and model files
# ---------------------------------------------------------------------------------------------

# A checkpoint or a model is one .npz (a zip of .npy arrays) read with allow_pickle=False: a
# file someone shared can be refused, but loading it never runs code (pickle, which earlier
# versions used, runs whatever the file tells it to). Member "meta.json" holds the format tag,
# the flags and the counters as JSON; every other member is one array named by its place
# ("train_state/params/params/Dense_0/kernel", "obs_mean", ...). Every name, shape and dtype
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
        # file that flush() empties at each log tick, as the RL scripts do: there, EventFileWriter's
        # writer thread, taking its turns at the GIL for every episode's event, cost about 12% of a
        # CartPole run (docs/benchmarks.md, Speed).
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

    def eval(self, step: int, returns: np.ndarray, score: float, video: Optional[Tuple[str, str]] = None) -> None:
        self.scalars(
            step,
            {
                "eval/episodic_return": returns.mean(),
                "eval/episodic_return_std": returns.std(),
                "eval/normalized_score": score,
            },
        )
        new = not os.path.exists(self._eval_csv)
        with open(self._eval_csv, "a", newline="") as f:
            writer = csv.writer(f)
            if new:
                writer.writerow(["step", "mean", "std", "episodes", "normalized_score"])
            writer.writerow([step, f"{returns.mean():.4f}", f"{returns.std():.4f}", len(returns), f"{score:.2f}"])
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
    """The progress line. On a terminal, one line rewritten in place at every log tick: updates
    done / total, updates/s, the script's fields (last eval, loss) and the time left at the rate
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
    """RUN_DIR/curve.png (written atomically): the evaluation returns over SGD updates from eval.csv
    (mean, and a band of one std over the episodes) beside the training loss read back from the
    run's tensorboard events. None, quietly, without matplotlib (an optional package)."""
    try:
        import matplotlib  # noqa: F401  (first, so that a missing matplotlib is an ImportError here)
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        return None
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
    from tensorboard.util.tensor_util import make_ndarray

    train_tag, x_label = "losses/bc_loss", "SGD updates"
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
    right.set(title=f"training loss ({train_tag})", xlabel=x_label)
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
    # per-step policy call of the evaluation that handoff costs more than the network.
    jax.config.update("jax_cpu_enable_async_dispatch", False)
    if args.eval_only:
        returns = run_eval_only(args)
        return {"eval_mean": float(returns.mean())}
    if not args.dataset:
        args = dataclasses.replace(args, dataset=[DEFAULT_DATASET])
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
