"""Ape-X DQN: distributed prioritized experience replay on Ray, in one file.

Ape-X (Horgan, Quan, Budden, Barth-Maron, Hessel, van Hasselt & Silver 2018, arXiv:1803.00933): actors, each with its
own envs and epsilon, act with a copy of the learner's parameters and send n-step transitions with the initial
priorities they computed; the learner trains on one prioritized replay, neither waiting for the other. The learner is
dqn_prioritized.py's: double DQN (van Hasselt et al. 2016, arXiv:1509.06461), n-step returns, proportional PER (Schaul
et al. 2016, arXiv:1511.05952) on cpprb, and Acme's prefetch and priority threads around K SGD steps per jitted call
(Hoffman et al. 2020, arXiv:2006.00979). Each actor is a Ray actor (Moritz et al. 2018, arXiv:1712.05889), restarted
by Ray when its process dies.

Update, on a minibatch of B transitions i, each spanning k_i <= n env steps:
  G_i     = sum_{j<k_i} gamma^j r_{t+j}            d_i = gamma^k_i (1 - terminated_i)  (truncation bootstraps)
  y_i     = G_i + d_i Q(s'_i, argmax_a Q(s'_i, a; theta); theta_target)             (double Q)
  delta_i = y_i - Q(s_i, a_i; theta)               L = (1/B) sum_i w_i huber(delta_i)
  P(i)    = p_i^alpha / sum_j p_j^alpha            p_i = |delta_i| + eps, new ones: the actor's |delta_i|
  w_i     = (N P(i))^-beta / max_{j in minibatch} (N P(j))^-beta     beta: --per-beta0 -> --per-beta1
  epsilon_i = 0.4^(1 + 7 i / (N - 1)) for actor i of N (Ape-X 4.1); chunks of --chunk-size (B = 50)
  transitions; parameters copied every --param-sync-every actor steps (400 frames = 100 steps).

Run (docs/apex.md; the run folder: docs/runs.md)
  python algos/apex_dqn.py --num-actors 4 --seed 2       # a local Ray (default: one actor per free core), CartPole-v1
  python algos/apex_dqn.py --resume runs/<run>           # continue from its checkpoint
  python algos/apex_dqn.py --env-id ALE/Pong-v5 --preset atari --ray-address HEAD_IP:6379 --num-actors 256
"""

import os

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # read when jax starts: no 75% GPU grab

import collections
import concurrent.futures
import contextlib
import dataclasses
import functools
import json
import signal
import socket
import sys
import threading
import time
import warnings
from typing import Annotated, Any, Literal, NamedTuple, Optional, Tuple

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

SCRIPT = "apex_dqn"
FORMAT = f"{SCRIPT}/1"  # of checkpoint.npz and model.npz
FRAME_STACK = 4
ROW = ("obs", "action", "reward", "next_obs", "discount")  # a replay row, as the n-step assembler emits it
ACTOR_COMEBACK_S = 120  # seconds an actor may send nothing (down, or never placed) before the run ends

# The ranges of the flags, held by pydantic to the command line and to a run folder's args.json alike.
Count = Annotated[int, Field(ge=1, lt=2**31)]
Envs = Annotated[int, Field(ge=1, le=1024)]
Positive = Annotated[float, Field(gt=0, le=1e30)]
Fraction = Annotated[float, Field(ge=0, le=1)]
Widths = Annotated[Tuple[Annotated[int, Field(ge=1, le=65_536)], ...], Field(min_length=1, max_length=16)]
Steps = Annotated[int, Field(ge=0, lt=2**31)]


@dataclasses.dataclass
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
    """Adam, or Ape-X's centred RMSProp: decay 0.95, eps 1.5e-7 outside the root (--preset atari)"""
    learning_rate: Positive = 1e-3
    """the optimiser's step size"""
    adam_eps: Positive = 1e-8
    """Adam's epsilon"""
    anneal_lr: bool = True
    """decay the learning rate linearly to 0 over --total-timesteps (env steps received)"""
    max_grad_norm: Positive = 10.0
    """clip the global gradient norm to this"""
    batch_size: Count = 128
    """transitions per SGD step"""
    gamma: Annotated[float, Field(gt=0, le=1)] = 0.99
    """discount factor"""
    n_step: Annotated[int, Field(ge=1, le=1000)] = 5
    """rewards per return (Ape-X: 3, --preset atari; 5 on CartPole, as dqn_prioritized.py)"""
    huber_delta: Positive = 1.0
    """Huber loss threshold"""
    clip_reward: Optional[Positive] = None
    """clip each reward to [-c, c] before the n-step sum; logged returns stay the env's"""
    terminal_on_life_loss: bool = True
    """envs with info["lives"] (ALE): a lost life ends the return for learning"""
    target_network_frequency: Count = 500
    """SGD steps between copies of the online network into the target network"""
    learning_starts: Steps = 1_000
    """replay rows before the learner starts"""
    train_frequency: Steps = 2
    """at most one SGD step per this many env steps received (the learner waits when ahead); 0: no cap, the paper's"""
    # Ape-X actors
    num_actors: Annotated[int, Field(ge=-1, le=100_000)] = -1
    """actor processes; -1: one per core the learner leaves free, at least 2"""
    num_envs: Envs = 1
    """environments per actor"""
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
    log_every: Count = 1_000
    """environment steps between tensorboard scalars"""
    run_dir: Optional[Annotated[str, Field(min_length=1)]] = None
    """output folder (default runs/<env_id>__apex_dqn__<seed>__<unix time>); must be new or empty"""
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


# --preset atari: Ape-X on Atari (Horgan et al. 2018, 4.1 and appendix; DQN's 4 frames a step, clipped rewards, 84x84x4
# stacks) for a cluster (360 CPU actors, a GPU learner); its gamma, alpha, B = 50 and 400-frame syncs are the defaults.
ATARI_PRESET = dict(
    total_timesteps=5_700_000_000,  # 22.8B frames in 5 days (Ape-X, Figure 2), 4 frames a step
    num_actors=360,  # Ape-X 4.1
    buffer_size=2_000_000,  # replay capacity 2M (Ape-X, appendix)
    batch_size=512,  # Ape-X, appendix
    n_step=3,
    optimizer="rmsprop",  # centred RMSProp, decay 0.95, epsilon 1.5e-7, no momentum (Ape-X, appendix) ...
    learning_rate=0.00025 / 4,  # ... lr 0.00025 / 4
    anneal_lr=False,
    max_grad_norm=40.0,  # gradient norms clipped to 40 (Ape-X, appendix)
    target_network_frequency=2_500,  # target network updated every 2500 training batches
    learning_starts=50_000,  # Ape-X does not say; Nature DQN's replay start size
    train_frequency=0,  # the learner runs free
    dueling=True,  # dueling network (Ape-X, appendix), with double Q-learning
    hidden_sizes=(512,),  # the dueling network's 512-unit streams
    per_beta1=0.4,  # constant beta 0.4 (the default beta0)
    clip_reward=1.0,
    eval_every=10_000_000,
    eval_episodes=8,
    checkpoint_every=50_000_000,
    log_every=100_000,
)  # Ape-X's frames per step, no-op starts and 108k-frame episodes: dqn_prioritized.py's pipeline


class ConfigError(Exception):
    """Bad input (flags, files, envs, a Ray address): one line on stderr and exit 2."""


class RunFailed(Exception):
    """The run cannot go on (divergence, a full disk, an actor that cannot run): one line and exit 1."""


# ------------------------------------------------------------------------------------------ NETWORK


class QNetwork(nn.Module):
    """Q(s, .): an MLP on vectors, Nature DQN's convolutions on frames [B, 4, H, W], the MinAtar paper's on bool
    planes [B, H, W, C] (planes=True); dueling=True: streams V and A (Wang et al. 2016, arXiv:1511.06581)."""

    num_actions: int
    hidden_sizes: Tuple[int, ...]
    planes: bool = False
    dueling: bool = False

    @nn.compact
    def __call__(self, obs: jax.Array) -> jax.Array:
        x = obs.astype(jnp.float32)
        if self.planes:
            x = nn.relu(nn.Conv(16, (3, 3), (1, 1), padding="VALID")(x))
        elif obs.ndim == 4:
            x = jnp.transpose(x, (0, 2, 3, 1)) / 255.0
            for features, kernel, stride in ((32, 8, 4), (64, 4, 2), (64, 3, 1)):
                x = nn.relu(nn.Conv(features, (kernel, kernel), (stride, stride), padding="VALID")(x))
        x = x.reshape((x.shape[0], -1))
        if not self.dueling:
            for width in self.hidden_sizes:
                x = nn.relu(nn.Dense(width)(x))
            return nn.Dense(self.num_actions)(x)
        value, advantage = x, x  # each stream has its own hidden layers
        for width in self.hidden_sizes:
            value, advantage = nn.relu(nn.Dense(width)(value)), nn.relu(nn.Dense(width)(advantage))
        advantage = nn.Dense(self.num_actions)(advantage)
        return nn.Dense(1)(value) + advantage - advantage.mean(axis=-1, keepdims=True)


# ------------------------------------------------------------------------------------------- REPLAY


class NStepAssembler:
    """Per-step transitions of parallel envs in, n-step ones out (dqn_prioritized.py's rules): each env's last n steps
    in a ring; the oldest leaves with n rewards, or all at an episode's end with k <= n (discount 0 if terminated)."""

    def __init__(self, n: int, gamma: float, num_envs: int, obs_shape, obs_dtype, clip_reward: Optional[float] = None):
        self.n, self.clip_reward, self.t = n, clip_reward, 0  # step t lives in ring slot t % n
        self.powers = gamma ** np.arange(n + 1, dtype=np.float64)
        self.obs = np.zeros((n, num_envs) + tuple(obs_shape), obs_dtype)
        self.action = np.zeros((n, num_envs), np.int64)
        self.reward = np.zeros((n, num_envs), np.float32)
        self.pending = np.zeros(num_envs, np.int64)

    def push(self, obs, action, reward, next_obs, terminated, truncated) -> Optional[dict]:
        """One vector step (next_obs: the real final observation where done) in; the rows it completes out, or None."""
        if self.clip_reward is not None:
            reward = np.clip(reward, -self.clip_reward, self.clip_reward)
        slot = self.t % self.n
        self.obs[slot], self.action[slot], self.reward[slot] = obs, action, reward
        self.t += 1
        done = terminated | truncated
        np.minimum(self.pending + 1, self.n, out=self.pending)
        full = np.flatnonzero((self.pending == self.n) & ~done)
        ended = np.flatnonzero(done)
        envs = np.concatenate([full, np.repeat(ended, self.pending[ended])])  # rows: full envs, then ended ones
        ages = np.concatenate([np.full(full.size, self.n - 1)] + [np.arange(self.pending[i]) for i in ended])
        self.pending[ended] = 0
        if not envs.size:
            return None
        oldest, k, offsets = (self.t - 1 - ages) % self.n, ages + 1, np.arange(self.n)  # each row's oldest slot
        rewards = self.reward[(oldest[:, None] + offsets) % self.n, envs[:, None]]
        ret = np.where(offsets < k[:, None], rewards * self.powers[: self.n], 0.0).sum(axis=1).astype(np.float32)
        discount = (self.powers[k] * (1.0 - terminated[envs])).astype(np.float32)
        return dict(zip(ROW, (self.obs[oldest, envs], self.action[oldest, envs], ret, next_obs[envs], discount)))


class PrioritizedReplay:
    """Proportional PER (Schaul et al. 2016) on cpprb's PrioritizedReplayBuffer, the docstring's rules: new rows at
    the actor's p = |delta|, not max_j p_j (add); P(i) and w_i, one stratified draw per minibatch (sample); p_i after
    learning (update_priorities). One lock (cpprb is not thread-safe); write_count[slot] counts overwrites, so that
    no stale |TD| lands on a new row."""

    def __init__(self, capacity: int, obs_shape, obs_dtype, alpha: float, eps: float):
        self.capacity, self.prioritized = capacity, alpha > 0
        self.row_bytes = 2 * int(np.prod(obs_shape)) * np.dtype(obs_dtype).itemsize + 64  # + priorities, trees
        require_memory(capacity * self.row_bytes, f"--buffer-size {capacity}")  # before cpprb allocates
        obs = (tuple(obs_shape), obs_dtype)
        self.spec = dict(zip(ROW, (obs, ((), np.int64), ((), np.float32), obs, ((), np.float32))))
        cpprb_spec = {k: {"shape": shape or 1, "dtype": dtype} for k, (shape, dtype) in self.spec.items()}  # 1, not ()
        self.buffer = cpprb.PrioritizedReplayBuffer(capacity, cpprb_spec, alpha=alpha, eps=eps)
        self.lock = threading.Lock()
        self.write_count = np.zeros(capacity, np.int64)
        self.priority = np.zeros(capacity, np.float64)  # cpprb cannot hand its priorities back

    def add(self, rows: dict, priorities: np.ndarray) -> None:
        """Insert a chunk at the priorities its actor computed (+ eps, by cpprb)."""
        priorities = np.asarray(priorities, np.float64)
        if not np.all(np.isfinite(priorities) & (priorities >= 0)):  # one NaN would poison cpprb's tree
            raise RunFailed("an actor sent non-finite priorities: its parameters diverged")
        with self.lock:
            slots = (self.buffer.get_next_index() + np.arange(len(priorities))) % self.capacity
            self.buffer.add(**{k: rows[k] for k in ROW}, priorities=priorities)
            np.add.at(self.write_count, slots, 1)
            self.priority[slots] = priorities

    def sample(self, batch_size: int, num_batches: int, beta: float = 1.0) -> Tuple[dict, np.ndarray, np.ndarray]:
        """(num_batches minibatches of B rows flat with IS 'weights', slots, write counts), each its own PER draw."""
        with self.lock:
            draws = []
            for _ in range(num_batches):
                draw = self.buffer.sample(batch_size, beta=beta)
                # cpprb returns indexes and weights in arrays that its next sample() overwrites.
                draw["indexes"], draw["weights"] = draw["indexes"].astype(np.int64), draw["weights"].copy()
                draws.append(draw)
            batch = {k: np.concatenate([d[k] for d in draws]) for k in draws[0]}
            indexes = batch.pop("indexes")
            write_counts = self.write_count[indexes]
        for key in ("action", "reward", "discount"):  # cpprb's [N, 1], dtypes as stored (weights: float32)
            batch[key] = batch[key].reshape(-1)
        weights = batch["weights"].reshape(num_batches, batch_size)  # w_i / max_{j in minibatch} w_j
        batch["weights"] = (weights / weights.max(axis=1, keepdims=True)).reshape(-1)
        return batch, indexes, write_counts

    def update_priorities(self, indexes: np.ndarray, write_counts: np.ndarray, priorities: np.ndarray) -> int:
        """p_i = |delta_i| (+ eps) where the slot still holds the sampled row; returns the rows kept."""
        with self.lock:
            fresh = self.write_count[indexes] == write_counts
            if fresh.any():
                self.buffer.update_priorities(indexes[fresh], priorities[fresh])
                self.priority[indexes[fresh]] = priorities[fresh]
        return int(fresh.sum())

    def __len__(self) -> int:
        """Rows cpprb holds."""
        with self.lock:
            return self.buffer.get_stored_size()

    def max_priority(self) -> float:
        with self.lock:
            return float(self.buffer.get_max_priority())

    def state_dict(self) -> dict:
        with self.lock:
            stored = self.buffer.get_stored_size()
            rows = self.buffer.get_all_transitions() if stored else {}
            state = {f"replay/{k}": rows.get(k, np.zeros((0,) + (s or (1,)), d)) for k, (s, d) in self.spec.items()}
            state["replay/priority"] = self.priority[:stored].copy()
            state["replay/next_index"] = np.asarray(self.buffer.get_next_index(), np.int64)
        return state

    def load_state_dict(self, arrays: dict, path: str, num_actions: int) -> None:
        """Rebuild cpprb from a checked file (maybe hostile): the same slots, priorities and insert position."""
        require("replay/priority" in arrays, f"{path} holds no replay (an earlier --no-checkpoint-replay): start anew")
        prio = arrays["replay/priority"]
        stored = len(prio) if prio.ndim == 1 else -1
        require(0 <= stored <= self.capacity, f"{path}: replay/priority is not a vector of <= {self.capacity} rows")
        get = functools.partial(checked_array, arrays, path=path)
        prio, next_index = get("replay/priority", (stored,), np.float64), int(get("replay/next_index", (), np.int64))
        data = {key: get(f"replay/{key}", (stored,) + (s or (1,)), d) for key, (s, d) in self.spec.items()}
        full = stored == self.capacity
        for ok, what in (
            (np.all((prio >= 0) & (prio <= 1e30)), "priorities"),
            (0 <= next_index < self.capacity and (next_index == stored or full), "next_index"),
            (np.all((data["action"] >= 0) & (data["action"] < num_actions)), "actions"),
            (np.all((data["discount"] >= 0) & (data["discount"] <= 1)), "discounts"),
        ):
            require(ok, f"{path}: replay {what} out of range")
        with self.lock:
            self.buffer.clear()
            if stored:
                self.buffer.add(**data, priorities=prio)
                if full and next_index:  # rewrite [0, next_index) so that the next insert lands there
                    self.buffer.add(**{key: v[:next_index] for key, v in data.items()}, priorities=prio[:next_index])
                self.priority[:stored] = prio
            self.write_count[:] = 0


# ------------------------------------------------------------------------------------------ LEARNER


class TrainState(NamedTuple):
    params: Any
    target_params: Any
    opt_state: Any
    sgd_steps: jax.Array


def make_optimizer(args: Args) -> optax.GradientTransformation:
    """The update's direction; the learning rate, annealed over env steps received, is an input of each update."""
    if args.optimizer == "rmsprop":  # Ape-X's centred RMSProp, eps outside the root
        direction = optax.scale_by_stddev(decay=0.95, eps=1.5e-7, eps_in_sqrt=False)
    else:
        direction = optax.scale_by_adam(eps=args.adam_eps)
    return optax.chain(optax.clip_by_global_norm(args.max_grad_norm), direction)


def double_q_td(q_apply, params, target_params, batch: dict) -> Tuple[jax.Array, jax.Array]:
    """(delta_i, Q(s_i, a_i)): double-Q n-step TD errors, for the loss and the actors' initial priorities alike."""
    q_sa = jnp.take_along_axis(q_apply(params, batch["obs"]), batch["action"][:, None], axis=1)[:, 0]
    a_star = jnp.argmax(q_apply(jax.lax.stop_gradient(params), batch["next_obs"]), axis=1)  # selects; no gradient
    q_next = jnp.take_along_axis(q_apply(target_params, batch["next_obs"]), a_star[:, None], axis=1)[:, 0]
    td = jax.lax.stop_gradient(batch["reward"] + batch["discount"] * q_next) - q_sa
    return td, q_sa


def huber(x: jax.Array, delta: float) -> jax.Array:
    """0.5 x^2 for |x| <= delta, else delta (|x| - delta / 2): its gradient is exact, where rlax's and optax's
    form adds x to delta in float32 and so has a zero gradient below half a float32 step of delta."""
    return jnp.where(jnp.abs(x) <= delta, 0.5 * x**2, delta * (jnp.abs(x) - 0.5 * delta))


def double_q_loss(q_apply, params, target_params, batch: dict, huber_delta: float):
    """IS-weighted Huber loss; returns (loss, (td, mean Q(s, a)))."""
    td, q_sa = double_q_td(q_apply, params, target_params, batch)
    loss = jnp.mean(batch["weights"] * huber(td, huber_delta))
    return loss, (td, q_sa.mean())


def make_update(q_apply, optimizer, args: Args, unroll: bool = False):
    """jit(state, batches[K, B, ...], lr) -> (state, metrics, |TD|[K, B]): K SGD steps in one call."""

    def sgd_step(state: TrainState, batch: dict, lr):
        grad_fn = jax.value_and_grad(double_q_loss, argnums=1, has_aux=True)
        (loss, (td, q_mean)), grads = grad_fn(q_apply, state.params, state.target_params, batch, args.huber_delta)
        direction, opt_state = optimizer.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, jax.tree_util.tree_map(lambda d: -lr * d, direction))
        sgd_steps = state.sgd_steps + 1
        target_params = optax.periodic_update(params, state.target_params, sgd_steps, args.target_network_frequency)
        td = jnp.where(jnp.isfinite(optax.tree.norm(params)), td, jnp.nan)  # non-finite params: NaN stops the run
        return TrainState(params, target_params, opt_state, sgd_steps), (loss, q_mean, td)

    def update(state: TrainState, batches: dict, lr):
        state, (loss, q_mean, td) = jax.lax.scan(lambda st, b: sgd_step(st, b, lr), state, batches, unroll=unroll)
        return state, {"losses/td_loss": loss.mean(), "losses/q_values": q_mean.mean()}, jnp.abs(td)

    return jax.jit(update, donate_argnums=0)


@functools.partial(jax.jit, static_argnums=(0, 1, 2))  # one compile, not one per eager op
def init_train_state(network: QNetwork, optimizer, obs_shape: tuple, key) -> TrainState:
    params = network.init(key, jnp.zeros((1, *obs_shape), jnp.float32))
    target_params = jax.tree_util.tree_map(jnp.copy, params)  # a copy: the update donates its state
    return TrainState(params, target_params, optimizer.init(params), jnp.zeros((), jnp.int32))


class Learner:
    """Acme's learner, as the other scripts': it owns the train state, the schedules of beta and
    the learning rate, a prefetch thread that samples K minibatches ahead onto the device, and a writer thread that
    writes each call's |TD| back as priorities and stores the published parameters in Ray's object store. step()
    runs one jitted call of K SGD steps; calls_due() says how many the env steps received so far call for."""

    def __init__(self, args: Args, network: QNetwork, replay: PrioritizedReplay, obs_shape: tuple):
        self.args, self.replay, self.num_actions = args, replay, network.num_actions
        optimizer = make_optimizer(args)
        init_key = jax.random.split(jax.random.PRNGKey(args.seed))[1]  # the init of earlier versions, seed for seed
        shapes = jax.eval_shape(functools.partial(init_train_state, network, optimizer, obs_shape), init_key)
        state_bytes = sum(x.size * x.dtype.itemsize for x in jax.tree_util.tree_leaves(shapes))
        batches = (args.prefetch_size + 1) * args.updates_per_call * args.batch_size * replay.row_bytes
        require_memory(3 * state_bytes + batches, "the network, its copies and the batches in flight", True)
        self.state = init_train_state(network, optimizer, obs_shape, init_key)
        unroll = len(obs_shape) == 3 and jax.default_backend() == "cpu"  # XLA's CPU runs convolutions slower in loops
        self.update = make_update(network.apply, optimizer, args, unroll)
        self.sampler = concurrent.futures.ThreadPoolExecutor(1, "prefetch")
        self.writer = concurrent.futures.ThreadPoolExecutor(1, "priority-writer")
        self.batches, self.writes = collections.deque(), collections.deque()  # futures, oldest first
        self.metrics, self.wait_seconds, self.learn_seconds, self.sgd_steps = {}, 0.0, 0.0, 0
        self.sgd_base, self.learn_from = 0, args.learning_starts
        self.act_device = actor_device("cpu", jax.local_devices())  # the evaluations' (the actors are Ray's processes)
        self.sync_every = args.param_sync_every * args.num_envs * resolved_actors(args)  # env steps a round of syncs
        self.publishing, self.published, self.published_at = None, None, 0

    def start(self, step: int) -> None:
        """At env step `step` (a resume's): a replay with fewer rows than --learning-starts waits for new ones,
        and the SGD steps it then owes are not caught up."""
        rows = len(self.replay)
        if rows < self.args.learning_starts:
            self.sgd_base, self.learn_from = self.sgd_steps, step + self.args.learning_starts - rows

    def calls_due(self, step: int) -> int:
        """One SGD step per --train-frequency env steps received, once the replay is ready (0: one call at a time)."""
        if len(self.replay) < self.args.learning_starts or step < self.learn_from:
            return 0
        if self.args.train_frequency == 0:
            return 1
        owed = self.sgd_base + (step - self.learn_from) // self.args.train_frequency - self.sgd_steps
        return max(0, owed) // self.args.updates_per_call

    def step(self, env_step: int) -> None:
        """K SGD steps in one call on batches sampled ahead, at the schedules' values for `env_step`."""
        args, lr_end = self.args, 0.0 if self.args.anneal_lr else self.args.learning_rate
        lr = np.float32(linear_schedule(args.learning_rate, lr_end, args.total_timesteps, env_step))
        while len(self.batches) <= args.prefetch_size:  # prefetch_size calls ahead while this one learns
            self.batches.append(self.sampler.submit(self.sample, self.beta(env_step)))
        start = time.perf_counter()
        batches, indexes, write_counts = self.batches.popleft().result()
        self.wait_seconds += time.perf_counter() - start
        self.state, self.metrics, priorities = self.update(self.state, batches, lr)
        self.writes.append(self.writer.submit(self.write_priorities, indexes, write_counts, priorities, self.sgd_steps))
        while self.writes and self.writes[0].done():
            self.writes.popleft().result()  # raises the writer's error, e.g. divergence
        self.sgd_steps += args.updates_per_call
        self.learn_seconds += time.perf_counter() - start

    def beta(self, env_step: int) -> float:
        return linear_schedule(self.args.per_beta0, self.args.per_beta1, self.args.total_timesteps, env_step)

    def sample(self, beta: float):
        """On the prefetch thread: (batches [K, B, ...] on the device, slot indexes, write counts)."""
        k, b = self.args.updates_per_call, self.args.batch_size
        batch, indexes, write_counts = self.replay.sample(b, k, beta)
        return jax.device_put({key: v.reshape((k, b) + v.shape[1:]) for key, v in batch.items()}), indexes, write_counts

    def write_priorities(self, indexes, write_counts, priorities, first_step: int) -> None:
        """On the writer thread (reading |TD| waits for the call): stop on divergence, else write back."""
        priorities = np.asarray(priorities, np.float64)
        finite = np.isfinite(priorities).all(axis=1)
        if not finite.all():
            step = first_step + int(np.argmin(finite)) + 1
            raise RunFailed(f"the learner diverged: non-finite TD error at SGD step {step}; a lower --learning-rate?")
        if self.replay.prioritized:  # with alpha = 0 a write changes nothing
            self.replay.update_priorities(indexes, write_counts, priorities.reshape(-1))

    def latest(self, step: int) -> list:
        """[a Ray reference to (version, (params, target_params))], the newest published, for the actors' next
        requests; published anew once per round of their syncs: copied on the device now (the next update donates
        the state), put in Ray's object store by the writer thread, so that the loop waits only for the first."""
        import ray

        if self.publishing is None or step - self.published_at >= self.sync_every:
            copy = jax.tree_util.tree_map(jnp.copy, (self.state.params, self.state.target_params))
            version = self.sgd_steps
            self.publishing = self.writer.submit(lambda: [ray.put((version, jax.device_get(copy)))])
            self.published_at = step
        if self.published is None or self.publishing.done():
            self.published = self.publishing.result()
        return self.published

    def scalars(self, step: int) -> dict:
        """What it logs: the last call's losses, beta, the largest priority, the rows held."""
        scalars = {k: float(v) for k, v in self.metrics.items()}
        scalars.update({"replay/beta": self.beta(step), "replay/priority_max": self.replay.max_priority()})
        return {**scalars, "replay/size": len(self.replay)}

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
        """A checkpoint's checked train state and replay (an earlier version's unused "key" is left)."""
        self.state = restore_tree(self.state, arrays, "train_state/", path)
        self.sgd_steps = int(self.state.sgd_steps)
        require(0 <= self.sgd_steps < 2**31, f"{path}: train_state/sgd_steps is out of range")
        self.replay.load_state_dict(arrays, path, self.num_actions)

    def close(self) -> None:
        self.sampler.shutdown(cancel_futures=True)
        self.writer.shutdown()


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
    """jit(params, obs[N], epsilon, key, step) -> actions[N], epsilon-greedy: one uniform per env, rescaled."""

    def act(params, obs, epsilon, key, step):
        u = jax.random.uniform(jax.random.fold_in(key, step), (obs.shape[0],))
        greedy = jnp.argmax(q_apply(params, obs), axis=-1)
        random = jnp.minimum((u / epsilon * num_actions).astype(greedy.dtype), num_actions - 1)
        return jnp.where(u < epsilon, random, greedy)

    return jax.jit(act)


def actor_epsilon(i: int, num_actors: int, base: float = 0.4, alpha: float = 7.0) -> float:
    """Ape-X's ladder epsilon_i = base^(1 + alpha i / (N - 1)): 0.4 down to 0.4^8 = 0.00066; one actor: base."""
    return base ** (1.0 + alpha * i / (num_actors - 1)) if num_actors > 1 else base


class Actor:
    """One Ape-X actor (a Ray actor, or called directly): its own envs, epsilon and n-step assembly. collect(latest)
    returns a chunk of >= --chunk-size transitions, their |delta| and the episodes ended; latest: [(version, (params,
    target_params))] or [a Ray reference to it], not fetched inside a list until the actor's sync is due."""

    def __init__(self, args: Args, index: int, num_actors: int, seed: int):
        import ray

        jax.config.update("jax_cpu_enable_async_dispatch", False)  # tiny calls: see dqn_prioritized.py
        with warnings.catch_warnings():  # Ray 2.60 warns about its own deprecated actor_id inside this
            warnings.simplefilter("ignore")
            restarted = ray.is_initialized() and ray.get_runtime_context().was_current_actor_reconstructed
        if restarted:  # Ray started this process again after the last one died: not the same episodes and draws
            seed = int(np.random.SeedSequence([seed, os.getpid()]).generate_state(1)[0] % 2**31)
        self.args = args
        self.epsilon = actor_epsilon(index, num_actors)
        self.envs = make_env(args.env_id, args.num_envs)
        space, num_actions = self.envs.single_observation_space, int(self.envs.single_action_space.n)
        self.action_start = int(self.envs.single_action_space.start)  # Discrete(n, start): index i is action start + i
        network = QNetwork(num_actions, args.hidden_sizes, planes=is_planes(space), dueling=args.dueling)
        self.act = make_act(network.apply, num_actions)
        self.td = jax.jit(functools.partial(double_q_td, network.apply))
        self.nstep = NStepAssembler(args.n_step, args.gamma, args.num_envs, space.shape, space.dtype, args.clip_reward)
        # Chunks padded to one size (a step can emit n rows per env), so the priority function compiles once.
        self.padded = args.chunk_size - 1 + args.num_envs * args.n_step
        self.key = jax.random.PRNGKey(seed)
        self.envs.action_space.seed(seed)
        self.obs, _ = self.envs.reset(seed=seed)
        self.steps, self.synced_at, self.params, self.version = 0, -float("inf"), None, -1
        self.ep_return, self.ep_length = np.zeros(args.num_envs), np.zeros(args.num_envs, np.int64)
        self.lives = None

    def collect(self, latest: list) -> dict:
        args, steps_before = self.args, self.steps
        if self.steps - self.synced_at >= args.param_sync_every:  # the learner's parameters (a Ray reference: fetch)
            import ray

            self.version, self.params = latest[0] if isinstance(latest[0], tuple) else ray.get(latest[0])
            self.synced_at = self.steps
        online, target = self.params
        parts, rows, episodes = [], 0, []
        while rows < args.chunk_size:
            actions = np.asarray(self.act(online, self.obs, np.float32(self.epsilon), self.key, np.int32(self.steps)))
            next_obs, reward, terminated, truncated, info = self.envs.step(actions + self.action_start)
            done = terminated | truncated
            ends_return = terminated
            if args.terminal_on_life_loss and "lives" in info:  # ALE: a life lost while the game goes on
                lives = np.asarray(info["lives"])
                ends_return = terminated | ((lives < self.lives) & ~done if self.lives is not None else False)
                self.lives = lives
            reached = real_next_obs(next_obs, done, info)
            out = self.nstep.push(self.obs, actions, reward, reached, ends_return, truncated)
            if out is not None:
                parts.append(out)
                rows += len(out["action"])
            self.ep_return += reward
            self.ep_length += 1
            episodes += [(float(self.ep_return[i]), int(self.ep_length[i])) for i in np.flatnonzero(done)]
            self.ep_return[done], self.ep_length[done] = 0.0, 0
            self.obs = next_obs
            self.steps += 1
        chunk = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
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


# ---------------------------------------------------------------------------------------------- RAY


def start_ray(args: Args) -> bool:
    """Join --ray-address, start a local Ray or use the one this process has; True if it must stop it."""
    if args.ray_address is None and "ray" not in sys.modules:
        # Read when ray is first imported (so only inside functions): a local node binds 127.0.0.1 only.
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
        warnings.filterwarnings("ignore", message="os.fork", category=RuntimeWarning)  # Ray forks and execs at once
        num_cpus = max(os.cpu_count() or 1, resolved_actors(args) + 1)  # every actor placed, even beyond the cores
        ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, configure_logging=False)  # a new one
    except Exception as e:
        raise RunFailed(f"could not start a local Ray ({first_line(e)})") from None
    return True


def reachable(address: str, timeout: float = 10.0) -> None:
    """A ConfigError unless something accepts connections at HOST:PORT (Ray retries a dead address for minutes)."""
    host, _, port = address.rpartition(":")
    if address == "auto" or address.startswith("ray://") or not port.isdigit():
        return  # 'auto' reads a local file, Ray Client has its own timeout; ray.init reports these
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except OSError as e:
        raise ConfigError(f"--ray-address {address}: no Ray there ({e.strerror or e})") from None


def resolved_actors(args: Args) -> int:
    """--num-actors; -1: one per core the learner leaves free, at least 2 (two rungs of the epsilon ladder)."""
    if args.num_actors != -1:
        return args.num_actors
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(2, cores - 1)


def kill_actors(actors: list) -> None:
    """Each on its own: an actor Ray cannot kill (Ray itself gone) does not keep the others alive."""
    import ray

    for actor in actors:
        with contextlib.suppress(Exception):
            ray.kill(actor, no_restart=True)


def remote_actor_class():
    """Actor as a Ray actor on the CPU, restarted with its request in flight whenever its process dies."""
    import ray

    if __name__ != "__main__":  # imported (tests, a user's code): the workers get the code by value, as a script's
        ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    env = {"JAX_PLATFORMS": "cpu"}
    return ray.remote(num_cpus=1, max_restarts=-1, max_task_retries=-1, runtime_env={"env_vars": env})(Actor)


class Actors:
    """The actors on Ray, each with one request in flight: the chunks they send, who sent what (actors.json: each
    actor's epsilon, process and restarts), how old the parameters each acted with were, and actors gone silent."""

    def __init__(self, args: Args, run_dir: str, seed: int, cleanup):
        n, remote = resolved_actors(args), remote_actor_class()
        self.actors = [remote.remote(args, i, n, seed + 10_007 * i) for i in range(n)]  # new episodes on resume
        cleanup.callback(kill_actors, self.actors)
        self.info = [dict(actor=i, epsilon=None, pid=None, restarts=0) for i in range(n)]  # as the actors report
        self.path, self.pending, self.heard, self.restarts = os.path.join(run_dir, "actors.json"), {}, [], 0
        self.lags = collections.deque(maxlen=n)  # SGD steps between the learner and each of the last n chunks

    def request(self, latest: list) -> None:
        """Each actor's first request (after a resume's evaluation: silence counts from here)."""
        self.pending = {actor.collect.remote(latest): i for i, actor in enumerate(self.actors)}
        self.heard = [time.monotonic()] * len(self.actors)

    def chunks(self, latest: list, wait: float, sgd_steps: int) -> list:
        """The chunks arrived within `wait` seconds, and whatever else is ready by then; each sender asked again."""
        import ray

        ready, _ = ray.wait(list(self.pending), num_returns=1, timeout=wait)
        if ready:
            ready, _ = ray.wait(list(self.pending), num_returns=len(self.pending), timeout=0)
        chunks = []
        for ref in ready:
            i = self.pending.pop(ref)
            try:
                chunk = ray.get(ref)
            except ray.exceptions.RayError as e:  # not a restart (Ray retries a request whose actor died)
                raise RunFailed(f"actor {i} failed: {first_line(e)}") from None
            self.pending[self.actors[i].collect.remote(latest)] = i
            self.heard[i] = time.monotonic()
            if self.info[i]["pid"] != chunk["pid"]:  # a process not seen before, after the first: a restart
                self.arrived(i, chunk)
            self.lags.append(sgd_steps - chunk["version"])
            chunks.append(chunk)
        silent = [i for i, heard in enumerate(self.heard) if time.monotonic() - heard > ACTOR_COMEBACK_S]
        if silent:  # down, or never placed (a cluster short of CPUs)
            raise RunFailed(f"actor {silent[0]} has sent nothing for {ACTOR_COMEBACK_S} s; see Ray's logs")
        return chunks

    def arrived(self, i: int, chunk: dict) -> None:
        """Actor i's process is new: its first, or one Ray restarted (its unsent chunk lost); actors.json says so."""
        if self.info[i]["pid"] is not None:
            self.info[i]["restarts"], self.restarts = self.info[i]["restarts"] + 1, self.restarts + 1
            print(f"actor {i} is back (process {chunk['pid']}): Ray restarted it, its unsent chunk is lost", flush=True)
        self.info[i].update(pid=chunk["pid"], epsilon=chunk["epsilon"])
        data = json.dumps(self.info, indent=1).encode()
        write_atomic(self.path, lambda f: f.write(data))

    def scalars(self) -> dict:
        lag = {"apex/param_lag": float(np.mean(self.lags))} if self.lags else {}
        return {**lag, "apex/actor_restarts": self.restarts}


# -------------------------------------------------------------------------------------------- TRAIN


def train(args: Args) -> dict:
    """Train with Args as parse_args gives them (with --resume: the run's flags, merged there); returns a summary.
    A first Ctrl-C checkpoints, then raises KeyboardInterrupt (SIGTERM checkpoints and returns)."""
    args = check_args(args)
    env_fn = functools.partial(make_env, args.env_id)
    with contextlib.ExitStack() as cleanup:  # closes what was opened, in reverse, however the run ends
        signals = Signals(cleanup)  # first: a Ctrl-C while JAX compiles at the start stops the run too
        async_dispatch = jax.config.read("jax_cpu_enable_async_dispatch")
        jax.config.update("jax_cpu_enable_async_dispatch", False)  # the tiny policy call costs less without it
        cleanup.callback(jax.config.update, "jax_cpu_enable_async_dispatch", async_dispatch)  # as found, after
        with contextlib.closing(env_fn(1)) as probe:
            spaces = (probe.single_observation_space, probe.single_action_space)
        space, num_actions = spaces[0], int(spaces[1].n)
        network = QNetwork(num_actions, args.hidden_sizes, planes=is_planes(space), dueling=args.dueling)
        alpha = args.per_alpha if args.prioritized else 0.0
        replay = PrioritizedReplay(args.buffer_size, space.shape, space.dtype, alpha, args.per_eps)
        learner = Learner(args, network, replay, space.shape)
        cleanup.callback(learner.close)
        started_ray = start_ray(args)  # before the run folder: a bad address writes nothing
        signals.install(cleanup)  # again: Ray's start took SIGTERM
        import ray

        if started_ray:
            cleanup.callback(ray.shutdown)
        act = make_act(network.apply, num_actions)
        evaluator = functools.partial(
            evaluate, act, env_fn=env_fn, episodes=args.eval_episodes, epsilon=args.eval_epsilon
        )
        run = Run(args, learner, env_fn, spaces, evaluator, signals, cleanup)
        step = run.start_step
        learner.start(step)
        actors = Actors(args, run.dir, args.seed + step, cleanup)
        where = args.ray_address or (f"local, {ray.util.get_node_ip_address()}" if started_ray else "already running")
        print(f"{len(actors.actors)} actors on Ray ({where})", flush=True)
        run.eval_if_due(step)  # the one a signal cut short, if the run resumed from there
        actors.request(learner.latest(step))
        while step < args.total_timesteps and not run.stopped:
            # STORE: the chunks arrived (up to 0.1 s wait when nothing is to learn); each sender asked again first
            wait = 0.0 if learner.calls_due(step) else 0.1
            for chunk in actors.chunks(learner.latest(step), wait, learner.sgd_steps):
                replay.add(chunk["transitions"], chunk["priorities"])
                step += chunk["env_steps"]
                for ret, length in chunk["episodes"]:
                    run.episode(step, ret, length)

            # LEARN: K SGD steps per jitted call on prefetched batches; the writer thread writes the priorities back
            for _ in range(learner.calls_due(step)):
                if run.stopped:  # a signal: checkpoint now, the backlog waits for the resume
                    break
                learner.step(step)

            run.log(step, actors.scalars())
            run.eval_if_due(step)
            run.checkpoint(step)
        return {**run.finish(step), "actor_restarts": actors.restarts}


# ================================================================================================ THE SEAM
# Above, the algorithm; below, the run harness: envs, files, checkpoints and resume, logging, signals, the CLI.


# ------------------------------------------------------------------------------------- ENVIRONMENTS


def is_planes(space) -> bool:
    """MinAtar's bool feature planes (H, W, C): the state itself, kept as is, no frame stack."""
    return isinstance(space, gym.spaces.Box) and space.dtype == np.bool_ and len(space.shape) == 3


def make_env(env_id: str, num_envs: int, video: Optional[Tuple[str, str]] = None) -> gym.vector.VectorEnv:
    """Sync vector envs in SAME_STEP autoreset mode (the real last observation in info["final_obs"]); images get
    Nature DQN's 84x84 grey stacks of 4, ALE games AtariPreprocessing (30 no-ops, 4 frames a step), 108k frames."""
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
    box = isinstance(space, gym.spaces.Box)
    vector = box and len(space.shape) == 1
    image = box and space.dtype == np.uint8 and (len(space.shape) == 2 or space.shape[2:] == (3,))  # grey or RGB
    require(isinstance(probe.action_space, gym.spaces.Discrete), f"{env_id}: DQN needs Discrete actions (SAC: sac.py)")
    hint = "wrap it in gymnasium.wrappers.FlattenObservation (a vector env: wrappers.vector.FlattenObservation)"
    hint = hint if space.is_np_flattenable else "write a gymnasium.ObservationWrapper that returns a Box vector"
    takes = f"this script takes vectors, uint8 images or bool planes: {hint}"
    require(vector or image or is_planes(space), f"{env_id} has observations {space}; {takes}")
    wrappers, kwargs = [], {}
    if image and ale:
        wrappers = [functools.partial(gym.wrappers.AtariPreprocessing, noop_max=30, frame_skip=4, screen_size=84)]
        kwargs = {"frameskip": 1, "max_num_frames_per_episode": 108_000}
    elif image:
        grey = [gym.wrappers.GrayscaleObservation] if len(space.shape) == 3 else []
        wrappers = grey + [functools.partial(gym.wrappers.ResizeObservation, shape=(84, 84))]
    if image:
        stack = functools.partial(gym.wrappers.FrameStackObservation, stack_size=FRAME_STACK, padding_type="reset")
        wrappers.append(stack)
    if video is not None:
        kwargs["render_mode"] = "rgb_array"
        if sys.platform.startswith("linux") and not os.environ.get("DISPLAY"):  # headless rendering
            os.environ.setdefault("MUJOCO_GL", "egl")
            os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
    sync = dict(vectorization_mode="sync", vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP})
    envs = gym.make_vec(env_id, num_envs, wrappers=wrappers, **sync, **kwargs)
    if video is not None:  # the first episode of sub-env 0; videos/ keeps the earlier evaluations' files
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*Overwriting existing videos")
            envs.envs[0] = gym.wrappers.RecordVideo(envs.envs[0], video[0], lambda e: e == 0, name_prefix=video[1])
    return envs


def real_next_obs(next_obs, done, info):
    """The observation each step led to: at an episode's end, info["final_obs"] (SAME_STEP mode)."""
    if not done.any():
        return next_obs
    real = next_obs.copy()
    for i in np.flatnonzero(done):
        real[i] = info["final_obs"][i]
    return real


def evaluate(act, params, env_fn, episodes: int, epsilon: float, seed: int, video=None, stop=None):
    """Returns of whole games (unclipped) on parallel envs, the same seeds each time; None if a signal cuts it short."""
    with contextlib.closing(env_fn(episodes, video=video)) as envs:
        envs.action_space.seed(seed)
        obs, _ = envs.reset(seed=seed)
        returns, running, t = np.zeros(episodes), np.ones(episodes, bool), 0
        action_start = int(envs.single_action_space.start)
        while running.any():
            if stop:  # a signal arrived: the run checkpoints at once
                return None
            actions = np.asarray(act(params, obs, np.float32(epsilon), jax.random.PRNGKey(seed), np.int32(t)))
            obs, reward, terminated, truncated, _ = envs.step(actions + action_start)
            returns += reward * running
            running &= ~(terminated | truncated)
            t += 1
        return returns


# -------------------------------------------------------------------------------------------- FILES
# checkpoint.npz and model.npz, read with allow_pickle=False: meta.json (format, counters, flags) and one array per
# leaf named by its place ("train_state/params/params/Dense_0/kernel", "replay/obs"), each checked before use.


def require(ok, message: str) -> None:
    if not ok:
        raise ConfigError(message)


def require_memory(nbytes: int, what: str, device: bool = False) -> None:
    """Refuse before allocating what the RAM (a replay), or with device=True the device too, cannot hold."""
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    limit = min(ram, (jax.local_devices()[0].memory_stats() or {}).get("bytes_limit", ram)) if device else ram
    require(nbytes < limit, f"{what}: {nbytes / 2**30:,.1f} GiB, more than the {limit / 2**30:,.1f} GiB here")


def first_line(error: BaseException) -> str:
    """The first line of an error's message (of its cause, for an error Ray passes on)."""
    return (str(getattr(error, "cause", None) or error).strip().splitlines() or [type(error).__name__])[0]


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
    """Flags from JSON (a run folder's, maybe hostile, or the command line's), or a ConfigError on the first bad one."""
    try:
        text = json.dumps(saved, default=lambda v: v.item() if isinstance(v, np.generic) else str(v))  # numpy, paths
        args = pydantic.TypeAdapter(Args).validate_json(text)
    except pydantic.ValidationError as e:
        error = e.errors()[0]
        flag = "--" + str(error["loc"][0]).replace("_", "-") if error["loc"] else "the flags"
        message = f"{flag} {error['msg'].removeprefix('Input ')}, got {error.get('input')!r}"
        raise ConfigError(f"{where}: {message}" if where else message) from None
    for ok, message in (
        (args.batch_size <= args.buffer_size, f"--batch-size {args.batch_size} exceeds --buffer-size"),
        (args.learning_starts >= args.batch_size, "--learning-starts must be at least --batch-size"),
        (args.num_actors != 0, "--num-actors must be positive or -1 (as the cores allow)"),
    ):
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


# ---------------------------------------------------------------------------------------------- CLI


def parse_args(argv=None) -> Args:
    """tyro's parse over --preset's defaults, or --resume's run flags; where to write and send come from here only."""
    argv = sys.argv[1:] if argv is None else list(argv)
    preset = None
    for token, after in zip(argv, argv[1:] + [None]):  # the last one wins, as in tyro
        preset = token[9:] if token.startswith("--preset=") else after if token == "--preset" else preset
    typed = tyro.cli(Args, args=argv, default=Args(preset=preset, **ATARI_PRESET) if preset == "atari" else Args())
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
    args = tyro.cli(Args, args=argv, default=saved)
    sent = dict(track=typed.track, wandb_project_name=typed.wandb_project_name, wandb_entity=typed.wandb_entity)
    args = dataclasses.replace(args, resume=typed.resume, run_dir=typed.resume, ray_address=typed.ray_address, **sent)
    confirmed = ":" not in args.env_id or args.env_id == typed.env_id  # "module:Env" imports a module
    require(confirmed, f"{path}: env id {args.env_id!r} imports a module: type --env-id to confirm")
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
