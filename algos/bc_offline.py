"""Behaviour cloning from offline datasets, with prioritized sampling of the data, in one file.

Implements behaviour cloning (Pomerleau 1991; the offline-RL baseline of D4RL, Fu et al. 2020, arXiv:2004.07219, and
of Emmons et al. 2021, arXiv:2112.10751), "x% BC" (the top x% of timesteps, as whole trajectories by their return:
Chen et al. 2021, arXiv:2106.01345, 5.3), and optional proportional prioritized sampling by loss (Schaul et al. 2016,
arXiv:1511.05952) on cpprb with IS-weighted losses, from D4RL's HDF5, Minari folders or .npz (--dataset, repeatable:
the union). The learner is Acme's (Hoffman et al. 2020, arXiv:2006.00979): a thread samples batches onto the device, K
SGD steps run in one jitted call, another writes the priorities back; --num-devices N splits batches.

Loss per example i, on s normalised by the dataset's mean and std (batch loss: (1/B) sum_i w_i l_i):
  discrete actions:        l_i = -log softmax(f(s_i))[a_i]                                 (cross-entropy)
  continuous, --loss mse:  l_i = sum_j (tanh(f(s_i))_j - a~_ij)^2        a~: the action scaled to [-1, 1]
  continuous, --loss nll:  l_i = -log pi(a~_i|s_i), pi = tanh(N(mu, sigma)):
                           log pi(a~) = log N(atanh(a~); mu, sigma) - sum_j log(1 - a~_j^2)
  p_i = l_i + eps; for the nll, which goes negative once sigma is small, its misfit term only,
  p_i = (1/2) sum_j ((atanh(a~_ij) - mu_ij) / sigma_ij)^2 + eps >= 0.
  With --prioritized P(i) = p_i^alpha / sum_j p_j^alpha, w_i = (N P(i))^-beta / max_j w_j over the minibatch,
  else w_i = 1; beta: --per-beta0 -> 1. Evaluation acts deterministically (argmax, tanh(f(s)), tanh(mu(s)));
  normalised score = 100 (R - ref_min) / (ref_max - ref_min).

Run (outputs: runs/<env_id>__bc_offline__<seed>__<time>/, arrays and JSON, no pickle; docs/offline.md)
  python algos/bc_offline.py                                  # data/pendulum-sac-expert.hdf5
  python algos/bc_offline.py --dataset data/cartpole-dqn-expert.hdf5 --top-fraction 0.1
  python algos/bc_offline.py --dataset a.hdf5 --dataset minari-folder --prioritized --loss nll
  python algos/bc_offline.py --resume runs/<run>               # continue from its checkpoint
  python tools/bc_evaluate.py runs/<run>         # tools/: evaluate a saved model, plot a run
"""

import os

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # read when jax starts: no 75% GPU grab

import collections
import concurrent.futures
import contextlib
import dataclasses
import functools
import hashlib
import json
import re
import signal
import sys
import threading
import time
import warnings
from dataclasses import dataclass, field
from typing import Annotated, List, Literal, Optional, Tuple

import cpprb
import flax.linen as nn
import gymnasium as gym
import h5py
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pydantic
import tqdm
import tyro
from pydantic import Field

SCRIPT = "bc_offline"
FORMAT = f"{SCRIPT}/2"  # of checkpoint.npz and model.npz
LOG_STD_MIN, LOG_STD_MAX = -5.0, 2.0
ACTION_EDGE = 1.0 - 1e-5  # dataset actions at the bounds would have atanh = inf
SHIPPED = os.path.join("data", "pendulum-sac-expert.hdf5")
DEFAULT_DATASET = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), SHIPPED)

# The ranges of the flags, held by pydantic to the command line and to a run folder's args.json alike.
Count = Annotated[int, Field(ge=1, lt=2**31)]
Positive = Annotated[float, Field(gt=0)]
Fraction = Annotated[float, Field(ge=0, le=1)]
Widths = Annotated[Tuple[Annotated[int, Field(ge=1, le=65_536)], ...], Field(min_length=1, max_length=16)]
Score = Optional[Annotated[float, Field(ge=-1e12, le=1e12)]]


@dataclass
class Args:
    # Algorithm
    dataset: Annotated[List[str], tyro.conf.UseAppendAction] = field(default_factory=list)
    """D4RL-layout .hdf5, Minari folder or .npz; repeat for the union (default: data/pendulum-sac-expert.hdf5)"""
    env_id: Optional[str] = None
    """env to evaluate in (default: the dataset's metadata)"""
    seed: Annotated[int, Field(ge=0, lt=2**31 - 10_000)] = 1
    """seed of the network, the sampling and the evaluation envs"""
    total_updates: Count = 20_000
    """SGD steps"""
    loss: Literal["mse", "nll"] = "mse"
    """continuous actions: deterministic tanh policy (mse) or tanh-Gaussian likelihood (nll); discrete: cross-entropy"""
    hidden_sizes: Widths = (256, 256)
    """hidden layer widths"""
    learning_rate: Positive = 1e-3
    """Adam's step size, decayed linearly to 0"""
    batch_size: Count = 256
    """examples per SGD step"""
    top_fraction: Annotated[float, Field(gt=0, le=1)] = 1.0
    """train on the top fraction of timesteps by their episode's return, as whole trajectories (0.1: "10% BC")"""
    normalize_obs: bool = True
    """standardise observations with the dataset's mean and std"""
    # Sampling of the dataset
    prioritized: bool = False
    """sample in proportion to the loss (IS-weighted); off by default: docs/benchmarks.md, Ablations"""
    per_alpha: Fraction = 0.6
    """priority exponent alpha"""
    per_beta0: Fraction = 0.4
    """initial importance-sampling exponent, annealed linearly to 1"""
    per_eps: Positive = 1e-3
    """added to every priority"""
    # Learner
    updates_per_call: Annotated[int, Field(ge=1, le=10_000)] = 50
    """SGD steps fused in one jitted call"""
    prefetch_size: Annotated[int, Field(ge=1, le=64)] = 2
    """calls' worth of batches the prefetch thread keeps ready on the device"""
    num_devices: Annotated[int, Field(ge=-1, le=65_536)] = 1
    """local devices the learner splits each batch over (-1: all)"""
    # Run and output
    eval_every: Count = 5_000
    """SGD steps between evaluations"""
    eval_episodes: Annotated[int, Field(ge=1, le=1024)] = 10
    """episodes per evaluation, run as parallel envs"""
    ref_min_score: Score = None
    """return of a random policy, for the normalised score (default: the dataset's metadata)"""
    ref_max_score: Score = None
    """return of an expert, for the normalised score (default: the dataset's metadata)"""
    checkpoint_every: Annotated[int, Field(ge=0, lt=2**31)] = 10_000
    """SGD steps between checkpoints (0: none by steps)"""
    log_every: Count = 1_000
    """SGD steps between tensorboard scalars"""
    run_dir: Optional[Annotated[str, Field(min_length=1)]] = None
    """output folder (default runs/<env_id>__bc_offline__<seed>__<unix time>); must be new or empty"""
    resume: Optional[Annotated[str, Field(min_length=1)]] = None
    """run folder to continue with its flags; those typed here win (--total-updates re-stretches the schedules)"""
    capture_video: bool = False
    """film the first episode of each evaluation into RUN_DIR/videos (needs moviepy)"""
    track: bool = False
    """stream the scalars and the evaluations' films to Weights & Biases while the run runs (needs wandb)"""
    wandb_project_name: str = "cleanRL"
    """the W&B project of --track"""
    wandb_entity: Optional[str] = None
    """the W&B team or user of --track (default: the logged-in user)"""

    __pydantic_config__ = pydantic.ConfigDict(strict=True, allow_inf_nan=False, extra="forbid")  # no flag ignored


class ConfigError(Exception):
    """Bad input (flags, files, datasets, envs): one line on stderr and exit 2."""


class RunFailed(Exception):
    """The run cannot go on (divergence, a full disk): one line and exit 1."""


# ------------------------------------------------------------------------------------------ NETWORK


class Policy(nn.Module):
    """MLP on normalised observations: logits (discrete), or (mean, log_std) in pre-tanh space."""

    out_dim: int
    hidden_sizes: Tuple[int, ...]
    gaussian: bool  # a log-std head too (--loss nll)

    @nn.compact
    def __call__(self, x):
        for width in self.hidden_sizes:
            x = nn.relu(nn.Dense(width)(x))
        out = nn.Dense(self.out_dim)(x)
        if not self.gaussian:
            return out, None
        return out, jnp.clip(nn.Dense(self.out_dim)(x), LOG_STD_MIN, LOG_STD_MAX)


# ------------------------------------------------------------------------------------------ DATASET


class PrioritizedDataset:
    """Proportional PER (Schaul et al. 2016) on cpprb (sum tree, eps, alpha), one lock (cpprb is not thread-safe); no
    row is overwritten (none goes stale); priority[] mirrors cpprb's for checkpoints. Alpha 0: numpy draws uniformly."""

    def __init__(self, obs, actions, alpha: float, eps: float, seed: int = 0):
        n, self.discrete = len(obs), actions.ndim == 1
        self.uniform, self.obs, self.actions, self.rng = alpha == 0, obs, actions, np.random.default_rng(seed)
        spec = {"obs": {"shape": obs.shape[1], "dtype": np.float32}}
        spec["action"] = {"shape": 1 if self.discrete else actions.shape[1], "dtype": actions.dtype}
        self.buffer = cpprb.PrioritizedReplayBuffer(n, spec, alpha=alpha, eps=eps)
        self.buffer.add(obs=obs, action=actions)  # all rows at priority 1
        self.priority, self.max_priority = np.ones(n, np.float64), 1.0  # cpprb's max, which only rises
        self.lock = threading.Lock()

    def sample(self, batch_size: int, num_batches: int = 1, beta: float = 1.0):
        """(K minibatches of B rows flat with IS 'weights', row indexes)."""
        if self.uniform:
            indexes = self.rng.integers(0, len(self.obs), batch_size * num_batches)
            ones = np.ones(len(indexes), np.float32)
            return {"obs": self.obs[indexes], "action": self.actions[indexes], "weights": ones}, indexes
        # PER stratifies each minibatch over the whole priority mass (Schaul et al. 2016, B.2.1): one row from each
        # 1/B. One draw of K*B takes one from each 1/(K*B); the K in each 1/B are dealt out to the K minibatches.
        k, b = num_batches, batch_size
        deal = self.rng.permuted(np.arange(k * b).reshape(b, k), axis=1).T.reshape(-1)  # [K, B]: row of the draw
        with self.lock:  # indexing copies: cpprb reuses its arrays
            draw = self.buffer.sample(k * b, beta=beta)  # one beta for the K minibatches
            batch = {key: value[deal] for key, value in draw.items()}
        if self.discrete:
            batch["action"] = batch["action"].reshape(-1)
        weights = batch["weights"].reshape(k, b).astype(np.float32)
        batch["weights"] = (weights / weights.max(axis=1, keepdims=True)).reshape(-1)  # per minibatch, as Acme
        return batch, batch.pop("indexes").astype(np.int64)

    def update_priorities(self, indexes, priorities) -> None:
        if not np.all(np.isfinite(priorities) & (priorities >= 0)):  # one NaN poisons every sum in the tree
            raise ValueError("priorities must be finite and >= 0")
        with self.lock:
            self.buffer.update_priorities(indexes, priorities)
            self.priority[indexes] = priorities
            self.max_priority = max(self.max_priority, float(np.max(priorities)))

    def state_dict(self) -> dict:
        with self.lock:
            return {"priority": self.priority.copy(), "max_priority": np.asarray(self.max_priority, np.float64)}

    def load_state_dict(self, arrays: dict, path: str) -> None:
        priority = checked_array(arrays, "priority", self.priority.shape, np.float64, path)
        top = float(checked_array(arrays, "max_priority", (), np.float64, path))
        require(0 < top <= 1e30 and np.all((priority >= 0) & (priority <= top)), f"{path}: priorities out of range")
        with self.lock:
            self.buffer.update_priorities(np.arange(len(priority)), priority)
            self.priority[:], self.max_priority = priority, top


# ------------------------------------------------------------------------------------------ LEARNER


ObsStats = collections.namedtuple("ObsStats", "mean std")  # float32 [obs_dim] each
TrainState = collections.namedtuple("TrainState", "params opt_state sgd_steps")
Shardings = collections.namedtuple("Shardings", "replicated split")  # the state on every device; batches split


def obs_stats(observations: np.ndarray, normalize: bool) -> ObsStats:
    if not normalize:
        return ObsStats(np.zeros(observations.shape[1], np.float32), np.ones(observations.shape[1], np.float32))
    # The floor keeps constant features (std 0) finite.
    return ObsStats(observations.mean(0).astype(np.float32), np.maximum(observations.std(0), 1e-3).astype(np.float32))


def make_optimizer(args: Args) -> optax.GradientTransformation:
    return optax.adam(optax.linear_schedule(args.learning_rate, 0.0, args.total_updates))


def per_example_loss(policy: Policy, mode: str, params, obs, action):
    """(l_i, p_i - eps) of the docstring; `action` is an index (discrete) or in [-1, 1]."""
    out, log_std = policy.apply(params, obs)
    if mode == "discrete":
        loss = -jnp.take_along_axis(jax.nn.log_softmax(out), action[:, None], axis=1)[:, 0]
        return loss, loss
    if mode == "mse":
        loss = jnp.sum((jnp.tanh(out) - action) ** 2, axis=-1)
        return loss, loss
    a = jnp.clip(action, -ACTION_EDGE, ACTION_EDGE)
    misfit = 0.5 * jnp.sum(((jnp.arctanh(a) - out) / jnp.exp(log_std)) ** 2, axis=-1)
    log_normaliser = jnp.sum(log_std, axis=-1) + 0.5 * out.shape[-1] * jnp.log(2.0 * jnp.pi)
    return misfit + log_normaliser + jnp.sum(jnp.log(1.0 - a**2), axis=-1), misfit


def make_update(policy: Policy, mode: str, optimizer, stats: ObsStats, shardings: Shardings):
    """jit(state, batches[K, B, ...]) -> (state, metrics, priorities[K, B]): K SGD steps in a lax.scan."""
    mean, std = jnp.asarray(stats.mean), jnp.asarray(stats.std)

    def loss_fn(params, batch):
        losses, priorities = per_example_loss(policy, mode, params, (batch["obs"] - mean) / std, batch["action"])
        return jnp.mean(batch["weights"] * losses), priorities

    def sgd_step(state: TrainState, batch: dict):
        (loss, priorities), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params, batch)
        updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        priorities = jnp.where(jnp.isfinite(optax.tree.norm(params)), priorities, jnp.nan)  # stops the run
        return TrainState(params, opt_state, state.sgd_steps + 1), (loss, priorities)

    def update(state: TrainState, batches: dict):
        state, (loss, priorities) = jax.lax.scan(sgd_step, state, batches)
        return state, {"losses/bc_loss": loss.mean()}, priorities

    whole, split = shardings
    return jax.jit(update, donate_argnums=0, in_shardings=(whole, split), out_shardings=(whole, whole, split))


def learner_shardings(args: Args) -> Shardings:
    """Data parallel over --num-devices: jit partitions the update by these shardings (docs/multidevice.md)."""
    devices = jax.local_devices()
    n = len(devices) if args.num_devices == -1 else args.num_devices
    names = ", ".join(map(str, devices))
    require(n <= len(devices), f"--num-devices {n}, but this machine has {len(devices)}: {names}")
    require(args.batch_size % n == 0, f"--batch-size {args.batch_size} does not split evenly over {n} devices")
    mesh = jax.sharding.Mesh(np.array(devices[:n]), ("devices",))
    spec = jax.sharding.PartitionSpec
    return Shardings(jax.sharding.NamedSharding(mesh, spec()), jax.sharding.NamedSharding(mesh, spec(None, "devices")))


class Learner:
    """Acme's learner, as DQN's and SAC's: it owns the train state (on the learner's devices), beta's schedule, a
    prefetch thread that samples K minibatches ahead and puts them on the device(s), and a writer thread that writes
    each call's losses back as priorities. step() runs one jitted call of K SGD steps (a run's last may be shorter)."""

    def __init__(self, args: Args, policy: Policy, mode: str, stats: ObsStats, dataset: PrioritizedDataset):
        self.args, self.dataset, self.shardings = args, dataset, learner_shardings(args)
        optimizer, dummy = make_optimizer(args), jnp.zeros((1, dataset.obs.shape[1]))
        # Refused before allocating: what the RAM or the device's memory (where it reports it) cannot hold.
        shapes = jax.eval_shape(policy.init, jax.random.PRNGKey(args.seed), dummy)
        row = dataset.obs[0].size + dataset.actions[0].size + 1  # floats of a row in a batch, its weight included
        batches = (args.prefetch_size + 1) * args.updates_per_call * args.batch_size * row
        nbytes = 4 * (5 * sum(x.size for x in jax.tree_util.tree_leaves(shapes)) + batches)  # float32; 5 params' worth
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        limit = min(ram, (jax.local_devices()[0].memory_stats() or {}).get("bytes_limit", ram))
        what = f"the network, its copies and the batches in flight: {nbytes / 2**30:,.1f} GiB"
        require(nbytes < limit, f"{what}, more than the {limit / 2**30:,.1f} GiB here")
        params = policy.init(jax.random.PRNGKey(args.seed), dummy)
        state = TrainState(params, optimizer.init(params), jnp.zeros((), jnp.int32))
        self.state = jax.device_put(state, self.shardings.replicated)
        self.update = make_update(policy, mode, optimizer, stats, self.shardings)
        self.sampler = concurrent.futures.ThreadPoolExecutor(1, "prefetch")
        self.writer = concurrent.futures.ThreadPoolExecutor(1, "priority-writer")
        self.batches, self.writes = collections.deque(), collections.deque()  # futures, oldest first
        self.metrics, self.wait_seconds, self.learn_seconds, self.sgd_steps = {}, 0.0, 0.0, 0

    def step(self) -> None:
        """One call of K SGD steps on batches sampled ahead (the last call of a run: the steps left, sampled here)."""
        steps, beta = min(self.args.updates_per_call, self.args.total_updates - self.sgd_steps), self.beta()
        start = time.perf_counter()
        if steps == self.args.updates_per_call:
            while len(self.batches) <= self.args.prefetch_size:  # prefetch_size calls ahead while this one learns
                self.batches.append(self.sampler.submit(self.sample, beta))
            batches, indexes = self.batches.popleft().result()
        else:  # compiled once more, for the shorter call
            batches, indexes = self.sample(beta, steps)
        self.wait_seconds += time.perf_counter() - start
        self.state, self.metrics, priorities = self.update(self.state, batches)
        self.writes.append(self.writer.submit(self.write_priorities, indexes, priorities, self.sgd_steps))
        while self.writes and self.writes[0].done():
            self.writes.popleft().result()  # raises the writer's error, e.g. divergence
        self.sgd_steps += steps
        self.learn_seconds += time.perf_counter() - start

    def beta(self) -> float:  # from --per-beta0 to 1 over --total-updates
        return linear_schedule(self.args.per_beta0, 1.0, self.args.total_updates, self.sgd_steps)

    def sample(self, beta: float, num_batches: Optional[int] = None):
        """On the prefetch thread: (batches [K, B, ...] on the device(s), row indexes)."""
        k, b = num_batches or self.args.updates_per_call, self.args.batch_size
        batch, indexes = self.dataset.sample(b, k, beta)
        batch = {key: v.reshape((k, b) + v.shape[1:]) for key, v in batch.items()}
        return jax.device_put(batch, self.shardings.split), indexes

    def write_priorities(self, indexes, priorities, first_step: int) -> None:
        """On the writer thread (reading the priorities waits for the call): stop on divergence, else write back."""
        priorities = np.asarray(priorities, np.float64)
        finite = np.isfinite(priorities).all(axis=1)
        if not finite.all():
            step = first_step + int(np.argmin(finite)) + 1
            raise RunFailed(f"learner diverged: loss or params not finite at SGD step {step}; lower --learning-rate?")
        if self.args.prioritized:  # with alpha = 0 a write changes nothing
            self.dataset.update_priorities(indexes, priorities.reshape(-1))

    def scalars(self) -> dict:  # what it logs: the last call's loss, beta and the largest priority
        scalars = {k: float(v) for k, v in self.metrics.items()}
        return {**scalars, "replay/beta": self.beta(), "replay/priority_max": self.dataset.max_priority}

    def state_dict(self) -> dict:
        """The train state and the priorities, once those of every call so far are in the dataset."""
        while self.writes:
            self.writes.popleft().result()
        return {**tree_arrays("train_state/", self.state), **self.dataset.state_dict()}

    def load_state_dict(self, arrays: dict, path: str) -> None:
        """A checkpoint's checked train state (one copy, whatever number of devices wrote it) and priorities."""
        state = restore_tree(self.state, arrays, "train_state/", path)
        self.sgd_steps = int(state.sgd_steps)
        require(0 <= self.sgd_steps < 2**31, f"{path}: train_state/sgd_steps is out of range")
        self.state = jax.device_put(state, self.shardings.replicated)
        self.dataset.load_state_dict(arrays, path)

    def close(self) -> None:
        self.sampler.shutdown(cancel_futures=True)
        self.writer.shutdown()


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


def make_act(policy: Policy, mode: str):
    """jit(params, obs, mean, std) -> deterministic actions (indexes, or in [-1, 1])."""

    def act(params, obs, mean, std):
        out, _ = policy.apply(params, (obs - mean) / std)
        return jnp.argmax(out, axis=-1) if mode == "discrete" else jnp.tanh(out)

    return jax.jit(act)


# ----------------------------------------------------------------------------------------- DATASETS
# Every reader checks what it takes and names the file in one ConfigError; a file's env id names no module.

REQUIRED = ("observations", "actions", "rewards", "terminals", "timeouts")
MINARI_KEYS = ("observations", "actions", "rewards", "terminations", "truncations")
OBS_SPACES = ("Box", "Discrete", "MultiBinary", "MultiDiscrete")  # what the policy takes, flattened
MINARI_SPACES = {"observation_space": OBS_SPACES, "action_space": ("Box", "Discrete")}

# observations [N, obs_dim] float32, actions [N] int64 or [N, act_dim] float32, rewards float32, terminals/timeouts bool
Dataset = collections.namedtuple("Dataset", "observations actions rewards terminals timeouts metadata")


def from_flat(arrays: dict, metadata: dict, path: str) -> Dataset:
    """The Dataset of D4RL's arrays, checked; metadata's HDF5 and npz scalars (0-d arrays, bytes) as Python's."""
    metadata = {k: v.item() if hasattr(v, "item") and np.ndim(v) == 0 else v for k, v in metadata.items()}
    metadata = {k: v.decode() if isinstance(v, bytes) else v for k, v in metadata.items()}
    missing = [k for k in REQUIRED if k not in arrays]
    require(not missing, f"{path}: missing key(s) {', '.join(missing)}")
    n = len(arrays["observations"])
    lengths = {k: len(v) for k, v in arrays.items()}
    require(all(v == n for v in lengths.values()), f"{path}: arrays of different lengths {lengths}")
    require(n > 0, f"{path}: the dataset is empty")
    kinds = {k: v.dtype.kind for k, v in arrays.items()}
    require(all(kind in "biuf" for kind in kinds.values()), f"{path}: arrays that are not numbers {kinds}")
    actions = arrays["actions"]
    discrete = np.issubdtype(actions.dtype, np.integer) or (actions.ndim == 1 and metadata.get("discrete_actions"))
    actions = actions.astype(np.int64) if discrete else actions.astype(np.float32).reshape(n, -1)
    rewards, terminals, timeouts = (arrays[k].reshape(n) for k in REQUIRED[2:])
    terminals, timeouts = terminals.astype(bool), timeouts.astype(bool)
    timeouts[-1] |= not terminals[-1]  # a file's last row ends its trajectory: the next file's does not continue it
    obs = arrays["observations"].astype(np.float32).reshape(n, -1)
    return Dataset(obs, actions, rewards.astype(np.float32), terminals, timeouts, metadata)


def read_d4rl_hdf5(path: str) -> Dataset:
    with h5py.File(path, "r") as f:
        arrays = {k: f[k][()] for k in REQUIRED if isinstance(f.get(k), h5py.Dataset)}
        meta = dict(f["metadata"].attrs) if "metadata" in f else {}
        meta.update({k: v[()] for k, v in f.get("metadata", {}).items() if isinstance(v, h5py.Dataset)})
    return from_flat(arrays, meta, path)


def read_npz(path: str) -> Dataset:
    with np.load(path, allow_pickle=False) as z:
        arrays = {k: z[k] for k in REQUIRED if k in z.files}
        metadata = {k.removeprefix("metadata/"): z[k] for k in z.files if k.startswith("metadata/")}
    return from_flat(arrays, metadata, path)


def json_object(value) -> dict:
    """minari nests env specs and spaces as JSON strings in its JSON: the object, or {}."""
    with contextlib.suppress(ValueError, TypeError):
        value = json.loads(value) if isinstance(value, str) else value
    return value if isinstance(value, dict) else {}


def minari_metadata(meta_path: str) -> dict:
    """metadata.json's scalars and env id (eval_env_spec's, else env_spec's), refusing what BC cannot read."""
    if not os.path.isfile(meta_path):
        return {}
    try:
        with open(meta_path, encoding="utf-8") as f:
            raw = json.load(f)
    except ValueError:  # a decode error or not UTF-8
        raise ConfigError(f"{meta_path}: not valid JSON") from None
    require(isinstance(raw, dict), f"{meta_path}: not a JSON object")
    fmt = raw.get("data_format", "hdf5")
    require(fmt == "hdf5", f"{meta_path}: data_format {fmt!r}; only minari's 'hdf5' storage is read here")
    for key, allowed in MINARI_SPACES.items():
        kind = json_object(raw.get(key)).get("type")
        reads = f"BC reads {', '.join(allowed)} (flatten it with a gymnasium wrapper before collecting)"
        require(kind in (None, *allowed), f"{meta_path}: the {key} is a {kind} space; {reads}")
    metadata = {k: v for k, v in raw.items() if isinstance(v, (str, int, float, bool))}
    ids = [json_object(raw.get(k)).get("id") for k in ("eval_env_spec", "env_spec")]
    ids = [i for i in ids if isinstance(i, str) and i]
    return {**metadata, "env_id": ids[0]} if ids else metadata


def minari_episode(ep, where: str):
    """(T observations, actions, rewards, terminations, truncations) of an episode of T+1 observations."""
    missing = [k for k in MINARI_KEYS if k not in ep]
    require(not missing, f"{where} is missing {', '.join(missing)}")
    dict_space = "an HDF5 group, i.e. a Dict or Tuple space; BC reads flat Box and Discrete spaces"
    for key in MINARI_KEYS:
        require(key in MINARI_KEYS[2:] or not isinstance(ep[key], h5py.Group), f"{where}: {key} are {dict_space}")
        require(isinstance(ep[key], h5py.Dataset), f"{where}: {key} is not an array")
        dtype = ep[key].dtype  # checked before reading: JPEG images and text are byte strings
        require(dtype.kind in "biuf", f"{where}: {key} are not numbers (dtype {dtype}; JPEG and text are not read)")
    require(ep["actions"].ndim and ep["observations"].ndim, f"{where}: observations and actions need a time axis")
    steps, count = ep["actions"].shape[0], ep["observations"].shape[0]
    require(count == steps + 1, f"{where}: {count} observations for {steps} actions (needs T+1)")
    for key in MINARI_KEYS[2:]:
        require(ep[key].shape == (steps,), f"{where}: {key} of shape {ep[key].shape}, expected {(steps,)}")
        require(key == "rewards" or np.isin(ep[key][()], (0, 1)).all(), f"{where}: {key} are not booleans")
    ends = [ep[key][()].astype(bool) for key in MINARI_KEYS[3:]]
    return ep["observations"][:-1], ep["actions"][()], ep["rewards"][()], *ends


def read_minari(folder: str) -> Dataset:
    """A Minari folder (or its data/) as minari >= 0.5 writes it: main_data.hdf5 (episode_<id>), metadata.json."""
    data_dir = folder if os.path.isfile(f"{folder}/main_data.hdf5") else os.path.join(folder, "data")
    metadata = minari_metadata(os.path.join(data_dir, "metadata.json"))
    path = os.path.join(data_dir, "main_data.hdf5")
    require(os.path.isfile(path), f"{folder}: not a Minari dataset folder (no data/main_data.hdf5)")
    with h5py.File(path, "r") as f:
        for name in f:
            episode = isinstance(f[name], h5py.Group) and re.fullmatch(r"episode_\d{1,12}", name)
            require(episode, f"{path}: {name!r} is not an episode group (episode_<id>)")
        require(len(f), f"{path}: no episodes")
        names = sorted(f, key=lambda name: int(name[8:]))  # id order: episode_2 before episode_10
        parts = [minari_episode(f[name], f"{path}: {name}") for name in names]
    obs0, actions0 = parts[0][:2]
    kind0 = (np.issubdtype(actions0.dtype, np.integer), actions0.shape[1:])
    for name, (obs, actions, _, terminations, truncations) in zip(names, parts):  # each against the first
        where, shape, first = f"{path}: {name}", obs.shape[1:], f"{names[0]}'s are"
        require(shape == obs0.shape[1:], f"{where}: observations of shape {shape}, {first} {obs0.shape[1:]}")
        kind = (np.issubdtype(actions.dtype, np.integer), actions.shape[1:])
        theirs = f"{first} {actions0.dtype} of shape {actions0.shape[1:]}"
        require(kind == kind0, f"{where}: actions {actions.dtype} of shape {actions.shape[1:]}, {theirs}")
        truncations[-1:] |= ~terminations[-1:]  # a stored episode ends here whatever its flags say
    for what, found in (("episodes", len(parts)), ("steps", sum(len(p[2]) for p in parts))):
        claimed = metadata.get(f"total_{what}")
        ok = type(claimed) is not int or claimed == found
        require(ok, f"{folder}: metadata.json says {claimed} {what}, main_data.hdf5 holds {found}")
    return from_flat({k: np.concatenate(c) for k, c in zip(REQUIRED, zip(*parts))}, metadata, folder)


def read_dataset(path: str) -> Dataset:
    """Any supported format, checked: a bad file raises a ConfigError naming it."""
    require(os.path.exists(path), f"{path}: no such file or folder")
    reader = read_minari if os.path.isdir(path) else read_npz if path.endswith(".npz") else read_d4rl_hdf5
    try:
        ds = reader(path)
    except ConfigError:
        raise
    except Exception as e:
        raise ConfigError(f"{path}: unreadable dataset ({type(e).__name__}: {first_line(e)})") from None
    for name in ("observations", "actions", "rewards"):
        require(np.isfinite(getattr(ds, name)).all(), f"{path}: {name} contain NaN or inf")
    for key in ("ref_min_score", "ref_max_score"):
        value = ds.metadata.get(key)
        number = type(value) in (int, float) and abs(value) <= 1e12
        require(value is None or number, f"{path}: metadata {key} must be a number, got {value!r}")
    env_id = ds.metadata.get("env_id", "")  # "": load_training_data asks for --env-id
    require(isinstance(env_id, str), f"{path}: metadata env_id must be a string")
    require(":" not in env_id, f"{path}: env id {env_id!r} names a module to import; not taken from a file")
    return ds


def trajectory_bounds(terminals: np.ndarray, timeouts: np.ndarray) -> np.ndarray:
    """[start, end) of each trajectory: one ends after every terminal or timeout; an open tail is one more."""
    ends = np.union1d(np.flatnonzero(terminals | timeouts) + 1, [len(terminals)])
    return np.stack([np.concatenate([[0], ends[:-1]]), ends], axis=1)


def top_fraction_mask(ds: Dataset, fraction: float) -> np.ndarray:
    """Rows of "x% BC" (Chen et al. 2021, 5.3), as its code selects them: whole trajectories, best return first
    (ties: the earlier), while they fit in floor(fraction N) rows; the best always; stop at the first that does not."""
    bounds = trajectory_bounds(ds.terminals, ds.timeouts)
    returns = np.add.reduceat(ds.rewards.astype(np.float64), bounds[:, 0])
    order = np.argsort(-returns, kind="stable")
    budget = int(fraction * len(ds.rewards) + 1e-6)  # 0.29 * 100 is 28.999999999999996
    lengths = bounds[:, 1] - bounds[:, 0]
    chosen = order[: max(1, int(np.sum(np.cumsum(lengths[order]) <= budget)))]
    return np.isin(np.repeat(np.arange(len(bounds)), lengths), chosen)  # each row's trajectory


# dataset: after --top-fraction, actions as the policy's; mode: the loss ("discrete", "mse", "nll"); digest: on --resume
TrainingData = collections.namedtuple("TrainingData", "dataset env_id mode out_dim ref_min ref_max digest")


def load_training_data(args: Args) -> TrainingData:
    datasets = [read_dataset(p) for p in args.dataset]
    metadata = {k: v for one in reversed(datasets) for k, v in one.metadata.items()}  # the first file's values win
    env_id = args.env_id or metadata.get("env_id")
    require(env_id, f"{args.dataset[0]}: no env_id in the metadata; give --env-id")
    with contextlib.closing(make_env(env_id, 1)) as envs:
        space, obs_shape = envs.single_action_space, envs.single_observation_space.shape
    discrete = isinstance(space, gym.spaces.Discrete)
    if not discrete:  # a Box of any shape, flat: the loaders keep actions [N, dims]
        low, high = space.low.reshape(-1), space.high.reshape(-1)
    for one, path in zip(datasets, args.dataset):  # each file against the env, so the files against each other
        ids = (datasets[0].metadata.get("env_id"), one.metadata.get("env_id"))
        require(None in ids or ids[0] == ids[1], f"{path}: env {ids[1]} differs from {ids[0]} of {args.dataset[0]}")
        features, acts = one.observations.shape[1], one.actions
        require(features == np.prod(obs_shape), f"{path}: observations have {features} features, the env {obs_shape}")
        if discrete:
            ok = acts.ndim == 1 and np.issubdtype(acts.dtype, np.integer)
            require(ok, f"{path}: {acts.dtype} actions of shape {acts.shape[1:]} do not match the env's discrete ones")
            first, last = int(space.start), int(space.start + space.n - 1)  # as the env takes them
            require(first <= acts.min() and acts.max() <= last, f"{path}: actions outside the env's {first}..{last}")
        else:
            shape = f"actions of shape {acts.shape[1:]} do not match the env's {space.shape}"
            require(acts.shape[1:] == low.shape, f"{path}: {shape}")
            slack = 1e-4 * (high - low)
            inside = np.all((acts >= low - slack) & (acts <= high + slack))
            require(inside, f"{path}: actions outside the env's bounds [{space.low}, {space.high}]")
    ds = Dataset(*(np.concatenate([getattr(one, k) for one in datasets]) for k in Dataset._fields[:-1]), metadata)
    if args.top_fraction < 1.0:  # a copy of the kept rows
        mask = top_fraction_mask(ds, args.top_fraction)
        ds = Dataset(*(getattr(ds, k)[mask] for k in Dataset._fields[:-1]), metadata)
    if discrete:  # the policy's classes are 0..n-1: Discrete(n, start=s) takes s + class
        ds = ds._replace(actions=ds.actions.astype(np.int64) - int(space.start)) if space.start else ds
    else:  # the policy works in [-1, 1]: map the dataset's actions there once
        scaled = np.clip(2.0 * (ds.actions - low) / (high - low) - 1.0, -1.0, 1.0)
        ds = ds._replace(actions=scaled.astype(np.float32))
    ref_min = ds.metadata.get("ref_min_score") if args.ref_min_score is None else args.ref_min_score
    ref_max = ds.metadata.get("ref_max_score") if args.ref_max_score is None else args.ref_max_score
    digest = hashlib.sha1(ds.observations.tobytes() + ds.actions.tobytes()).hexdigest()
    out_dim = int(space.n) if discrete else int(np.prod(space.shape))
    return TrainingData(ds, env_id, "discrete" if discrete else args.loss, out_dim, ref_min, ref_max, digest)


# ------------------------------------------------------------------------------------- ENVIRONMENTS


def make_env(env_id: str, num_envs: int, video: Optional[Tuple[str, str]] = None) -> gym.vector.VectorEnv:
    """Synchronous evaluation envs (SAME_STEP autoreset); with video = (folder, prefix) sub-env 0 films episode 0."""
    kwargs = {} if video is None else {"render_mode": "rgb_array"}
    if video is not None and sys.platform.startswith("linux") and not os.environ.get("DISPLAY"):  # headless
        os.environ.setdefault("MUJOCO_GL", "egl")
        os.environ.setdefault("SDL_VIDEODRIVER", "dummy")

    def sub_env(index: int) -> gym.Env:
        env = gym.make(env_id, **kwargs)
        if video is None or index > 0:
            return env
        with warnings.catch_warnings():  # videos/ holds the earlier evaluations' files, which stay
            warnings.filterwarnings("ignore", message=".*Overwriting existing videos")
            return gym.wrappers.RecordVideo(env, video[0], lambda episode: episode == 0, name_prefix=video[1])

    try:
        fns = [functools.partial(sub_env, i) for i in range(num_envs)]
        envs = gym.vector.SyncVectorEnv(fns, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    except ImportError as e:
        raise ConfigError(f"cannot make env {env_id!r}: {first_line(e)} (pip install -r requirements.txt)") from None
    except (gym.error.Error, AttributeError, ValueError) as e:
        raise ConfigError(f"cannot make env {env_id!r}: {first_line(e)}") from None
    space, obs_space = envs.single_action_space, envs.single_observation_space
    bounded = isinstance(space, gym.spaces.Box) and np.isfinite(space.low).all() and np.isfinite(space.high).all()
    if not (isinstance(space, gym.spaces.Discrete) or bounded):
        envs.close()
        raise ConfigError(f"{env_id} has action space {space}; BC takes Discrete and bounded Box actions")
    if type(obs_space).__name__ not in OBS_SPACES:
        envs.close()
        flat = "wrap it in gymnasium.wrappers.FlattenObservation (a vector env: wrappers.vector.FlattenObservation)"
        hint = flat if obs_space.is_np_flattenable else "write a gymnasium.ObservationWrapper that returns a Box vector"
        raise ConfigError(f"{env_id} has observations {obs_space}; the policy takes arrays: {hint}")
    return envs


def evaluate(act, params, stats: ObsStats, env_fn, episodes: int, seed: int, video=None, stop=None):
    """Returns of deterministic episodes on parallel envs, the same seeds every time; None if a signal cuts it."""
    with contextlib.closing(env_fn(episodes, video=video)) as envs:
        space = envs.single_action_space
        obs, _ = envs.reset(seed=seed)
        returns, running = np.zeros(episodes), np.ones(episodes, bool)
        while running.any():
            if stop:
                return None
            action = np.asarray(act(params, obs.reshape(episodes, -1).astype(np.float32), stats.mean, stats.std))
            if isinstance(space, gym.spaces.Box):  # [-1, 1] -> [low, high], in the Box's shape
                action = action.reshape((episodes,) + space.shape)
                action = np.clip(space.low + (action + 1.0) * 0.5 * (space.high - space.low), space.low, space.high)
            else:  # class i -> Discrete(n, start)'s start + i
                action = action + int(space.start)
            obs, reward, terminated, truncated, _ = envs.step(action)
            returns += reward * running
            running &= ~(terminated | truncated)
        return returns


def normalized_score(returns: np.ndarray, ref_min: Optional[float], ref_max: Optional[float]) -> float:
    if ref_min is None or ref_max is None or ref_max == ref_min:
        return float("nan")
    return float(100.0 * (returns.mean() - ref_min) / (ref_max - ref_min))


# -------------------------------------------------------------------------------------------- FILES


def require(ok, message: str) -> None:
    if not ok:
        raise ConfigError(message)


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
    """Flags from JSON (a run folder's, maybe hostile), each checked, or one ConfigError naming the first bad one."""
    at = f"{where}: " if where else ""
    text = json.dumps(saved, default=lambda v: v.item() if isinstance(v, np.generic) else str(v))  # numpy, paths
    try:
        args = pydantic.TypeAdapter(Args).validate_json(text)
    except pydantic.ValidationError as e:
        error = e.errors()[0]
        flag = "--" + str(error["loc"][0]).replace("_", "-") if error["loc"] else "the flags"
        raise ConfigError(f"{at}{flag} {error['msg'].removeprefix('Input ')}, got {error.get('input')!r}") from None
    require(args.num_devices != 0, f"{at}--num-devices must be positive or -1")
    require(":" not in (args.env_id or "") or not where, f"{where}: env id {args.env_id!r} imports a module")
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


class Logger:
    """Tensorboard events (a file flushed at each log tick), eval.csv, and with --track the same scalars to W&B."""

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
        self.csv, rows = os.path.join(run_dir, "eval.csv"), ["step,mean,std,episodes,normalized_score\n"]
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

    def eval(self, step: int, returns: np.ndarray, score: float) -> None:
        mean, std = returns.mean(), returns.std()
        tags = {"eval/episodic_return": mean, "eval/episodic_return_std": std, "eval/normalized_score": score}
        self.scalars(step, tags)
        with open(self.csv, "a") as f:
            f.write(f"{step},{mean:.4f},{std:.4f},{len(returns)},{score:.2f}\n")

    def close(self, failed: bool = False) -> None:
        try:
            self.file.close()
        finally:
            if self.wandb is not None:
                self.wandb.finish(exit_code=int(failed))  # a run that failed shows so in W&B


def open_run_dir(args: Args, env_id: str) -> str:
    """A new or empty folder, or a resumed run's own (its temp files removed); holding no symlink to write through."""
    default = f"runs/{env_id.replace('/', '-')}__{SCRIPT}__{args.seed}__{int(time.time())}"
    run_dir = args.resume or args.run_dir or default
    try:
        os.makedirs(run_dir, exist_ok=True)
    except OSError as e:  # a file there too
        raise ConfigError(f"--run-dir {run_dir}: cannot be made ({e.strerror})") from None
    require(args.resume or not os.listdir(run_dir), f"--run-dir {run_dir} is not empty: give a new folder, or --resume")
    for folder, subfolders, files in os.walk(run_dir):
        for name in subfolders + files:
            require(not os.path.islink(os.path.join(folder, name)), f"{run_dir} holds a symlink: not written")
    for name in (n for n in os.listdir(run_dir) if ".tmp." in n):  # writes a kill cut short (a fresh run: none)
        os.remove(os.path.join(run_dir, name))
    return run_dir


# -------------------------------------------------------------------------------------------- TRAIN


def train(args: Args) -> dict:
    """Train on --dataset with Args as parse_args gives them, evaluating in its env; returns a summary dict."""
    if not args.dataset:  # the shipped file, found beside this script in the repo
        where = f"no --dataset given, and {SHIPPED} is not beside this script"
        require(os.path.isfile(DEFAULT_DATASET), f"{where}: give --dataset PATH (D4RL .hdf5, Minari folder, .npz)")
        args = dataclasses.replace(args, dataset=[DEFAULT_DATASET])
    args = check_args(args)
    data = load_training_data(args)
    examples, env_fn = data.dataset, functools.partial(make_env, data.env_id)
    stats = obs_stats(examples.observations, args.normalize_obs)
    policy = Policy(data.out_dim, args.hidden_sizes, data.mode == "nll")
    act = make_act(policy, data.mode)
    alpha = args.per_alpha if args.prioritized else 0.0
    dataset = PrioritizedDataset(examples.observations, examples.actions, alpha, args.per_eps, args.seed)
    print(f"{len(examples.rewards)} examples from {len(args.dataset)} file(s), env {data.env_id}, loss {data.mode}")
    with contextlib.ExitStack() as cleanup:  # closes what was opened, in reverse, however the run ends
        signals = Signals(cleanup)  # first: a Ctrl-C while JAX compiles at the start stops the run too
        async_dispatch = jax.config.read("jax_cpu_enable_async_dispatch")
        jax.config.update("jax_cpu_enable_async_dispatch", False)  # the small policy call costs less without it
        cleanup.callback(jax.config.update, "jax_cpu_enable_async_dispatch", async_dispatch)  # as found, after
        learner = Learner(args, policy, data.mode, stats, dataset)
        cleanup.callback(learner.close)
        run_dir, cut_short = open_run_dir(args, data.env_id), False  # cut_short: an evaluation a signal cut short
        if args.resume:
            cut_short = load_checkpoint(run_dir, learner, data.digest, args.total_updates)
        step = learner.sgd_steps
        dataset.rng = np.random.default_rng((args.seed, step))  # a resume draws on, not the first rows again
        # On resume eval.csv keeps the rows up to the checkpoint; a finished run's final one is redone.
        logger = Logger(run_dir, args, (step if step < args.total_updates else step - 1) if args.resume else None)
        cleanup.push(lambda kind, *_: logger.close(failed=kind not in (None, KeyboardInterrupt)))
        saved = json.dumps({"script": SCRIPT, "args": dataclasses.asdict(args)}, indent=2).encode()
        write_atomic(os.path.join(run_dir, "args.json"), lambda f: f.write(saved))
        bar = cleanup.enter_context(tqdm.tqdm(total=args.total_updates, initial=step, unit="update", disable=None))
        last_eval, saved_step, stopped = "-", step if args.resume else None, signals.stopped
        if args.resume:
            signals.resume = f"--resume {run_dir} continues from update {step}"
        tick = dict(time=time.perf_counter(), step=step, wait=0.0, learn=0.0)  # the learner's counters at a log
        meta = {"format": FORMAT, "script": SCRIPT, "args": dataclasses.asdict(args), "env_id": data.env_id}
        meta.update(mode=data.mode, out_dim=data.out_dim, ref_min=data.ref_min, ref_max=data.ref_max)
        stats_arrays = {"obs_mean": stats.mean, "obs_std": stats.std}

        def checkpoint():
            nonlocal saved_step
            signals.check()  # before a write a second Ctrl-C was to cut short
            counters = {"kind": "checkpoint", "global_step": step, "digest": data.digest, "cut_short": cut_short}
            save_npz(f"{run_dir}/checkpoint.npz", {**meta, **counters}, {**learner.state_dict(), **stats_arrays})
            saved_step, signals.resume = step, f"--resume {run_dir} continues from update {step}"

        def evaluation(prefix: str):
            nonlocal last_eval, cut_short
            video = (os.path.join(run_dir, "videos"), f"{prefix}-update-{step}") if args.capture_video else None
            params = actor_copy(learner.state.params, actor_device("cpu", jax.local_devices()))
            returns = evaluate(act, params, stats, env_fn, args.eval_episodes, args.seed + 10_000, video, stopped)
            if returns is not None:
                score = normalized_score(returns, data.ref_min, data.ref_max)
                logger.eval(step, returns, score)
                wandb_film(logger.wandb, video, step)
                last_eval = f"{returns.mean():.1f} (score {score:.1f})"
            cut_short = returns is None and prefix == "eval"  # the checkpoint says so: a resume redoes it
            return returns

        if cut_short:  # the evaluation a signal cut short
            evaluation("eval")
        while step < args.total_updates and not stopped:
            # LEARN: K SGD steps per call on the prefetch thread's minibatches; priorities go back on the writer's.
            learner.step()
            before, step = step, learner.sgd_steps

            if step // args.log_every > before // args.log_every:
                last = tick
                tick = dict(time=time.perf_counter(), step=step, wait=learner.wait_seconds, learn=learner.learn_seconds)
                rate = (step - last["step"]) / (tick["time"] - last["time"])
                wait = (tick["wait"] - last["wait"]) / (tick["learn"] - last["learn"])
                scalars = {"perf/updates_per_second": rate, "perf/learner_wait_fraction": wait, **learner.scalars()}
                logger.scalars(step, scalars)
                logger.file.flush()
                line = f"updates/s {rate:7.0f}  loss {float(learner.metrics['losses/bc_loss']):.4f}  eval {last_eval}"
                bar.update(step - bar.n)
                bar.set_postfix_str(line, refresh=False)
                if bar.disable:
                    print(f"update {step:>7d}  {line}", flush=True)
            if step // args.eval_every > before // args.eval_every and step < args.total_updates:
                evaluation("eval")  # the final evaluation comes after the loop
            if args.checkpoint_every and step // args.checkpoint_every > before // args.checkpoint_every:
                checkpoint()
        signals.check()
        if saved_step != step:
            checkpoint()
        bar.update(step - bar.n)  # the steps after the last log tick
        bar.close()  # before anything else prints
        if not stopped:
            arrays = {**tree_arrays("params/", learner.state.params), **stats_arrays}
            save_npz(f"{run_dir}/model.npz", {**meta, "kind": "model"}, arrays)
            returns = evaluation("final")
        if stopped:  # also during the final evaluation, which the checkpoint before it makes safe
            print(f"stopped by signal {stopped[0]} at update {step}; continue with --resume {run_dir}", flush=True)
            return {"run_dir": run_dir, "updates": step, "signal": stopped[0]}
        score = normalized_score(returns, data.ref_min, data.ref_max)
        final = f"final eval after {step} updates: {returns.mean():.2f} +- {returns.std():.2f}"
        print(f"{final}, normalised score {score:.1f}; run dir {run_dir}", flush=True)
        return {"run_dir": run_dir, "updates": step, "eval_mean": float(returns.mean()), "score": score}


def load_checkpoint(run_dir: str, learner: Learner, digest: str, total: int) -> bool:
    """Loads RUN_DIR/checkpoint.npz's train state and priorities into `learner`; whether an evaluation was cut short."""
    path = os.path.join(run_dir, "checkpoint.npz")
    meta, arrays = load_npz(path, "checkpoint")
    require(meta.get("digest") == digest, f"--resume {run_dir}: the dataset differs from the one this run trained on")
    learner.load_state_dict(arrays, path)
    was = meta["args"].get("total_updates") if isinstance(meta.get("args"), dict) else None
    note = f"; the lr and beta schedules now run to --total-updates {total}, not {was}"
    print(f"resumed {run_dir} at update {learner.sgd_steps}{note if was not in (None, total) else ''}")
    return meta.get("cut_short", meta.get("eval_missed")) is True  # eval_missed: f6a5972's name


# ---------------------------------------------------------------------------------------------- CLI


def parse_args(argv=None) -> Args:
    """tyro's parse; --resume takes the run's flags, those typed here win, and where to write or send is typed."""
    argv = sys.argv[1:] if argv is None else list(argv)
    typed = tyro.cli(Args, args=argv)
    if typed.resume is None:
        return typed
    path = os.path.join(typed.resume, "args.json")
    require(os.path.isfile(path), f"--resume {typed.resume}: no args.json there (not a run folder of {SCRIPT}.py)")
    try:
        with open(path, "rb") as f:
            saved = json.loads(f.read())
    except (ValueError, RecursionError):
        raise ConfigError(f"{path} is not JSON") from None
    ours = isinstance(saved, dict) and saved.get("script") == SCRIPT
    require(ours, f"--resume {typed.resume}: not a run of {SCRIPT}.py")
    args = tyro.cli(Args, args=argv, default=args_from_json(saved.get("args"), path))
    dataset = typed.dataset or args.dataset  # typed files replace the run's (tyro would append)
    sent = dict(track=typed.track, wandb_project_name=typed.wandb_project_name, wandb_entity=typed.wandb_entity)
    return dataclasses.replace(args, resume=typed.resume, run_dir=typed.resume, dataset=dataset, **sent)  # W&B: typed


def cli(argv=None) -> int:
    try:
        result = train(parse_args(argv))
    except (ConfigError, RunFailed) as e:
        code, message = (2 if isinstance(e, ConfigError) else 1), " ".join(str(e).split())  # arrays print over lines
    except jax.errors.JaxRuntimeError as e:  # an out-of-memory the checks before allocating did not foresee
        if "RESOURCE_EXHAUSTED" not in str(e):
            raise
        code, message = 1, f"out of device memory: {first_line(e)}"
    except (MemoryError, OSError) as e:  # a folder that cannot be made, a full disk at a log tick, ...
        code, message = 1, str(e) or "out of memory (a smaller dataset or --hidden-sizes?)"
    else:
        return 128 + result["signal"] if "signal" in result else 0
    print(f"{SCRIPT}.py: error: {message}", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(cli())
