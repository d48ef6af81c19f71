"""Soft actor-critic with prioritized experience replay, in one file.

SAC with twin critics, a tanh-squashed Gaussian actor and a learned temperature (Haarnoja et al. 2018, "Soft
Actor-Critic Algorithms and Applications", arXiv:1812.05905) at the settings of jaxrl's SAC (Kostrikov 2021,
github.com/ikostrikov/jaxrl) and proportional prioritized replay (Schaul et al. 2016, arXiv:1511.05952) on cpprb.
The learner is Acme's (Hoffman et al. 2020, arXiv:2006.00979): a thread puts batches on the device, K SGD steps
run in one jitted call, another thread writes the priorities back; --num-devices N splits the batches.

Update, on a minibatch of B transitions i = (s_i, a_i, r_i, s'_i) (actions in [-1, 1]^|A|):
  a = tanh(u), u ~ N(mu(s), sigma(s)):  log pi(a|s) = log N(u; mu, sigma) - sum_j 2 (log 2 - u_j - softplus(-2 u_j))
  y_i     = r_i + d_i (min_m Q_target_m(s'_i, a'_i) - alpha log pi(a'_i|s'_i)),  a'_i ~ pi(.|s'_i)
            d_i = gamma (1 - terminated_i): a truncation bootstraps
  L_Q     = (1/B) sum_i w_i sum_m (Q_m(s_i, a_i) - y_i)^2 / 2                        (w_i: PER IS weights)
  L_pi    = (1/B) sum_i [alpha log pi(a~_i|s_i) - min_m Q_m(s_i, a~_i)],  a~_i ~ pi(.|s_i)
  L_alpha = (1/B) sum_i -alpha (log pi(a~_i|s_i) + H_target),  H_target = -scale |A|
  p_i     = mean_m |Q_m(s_i, a_i) - y_i| + eps
  P(i)    = p_i^alpha_per / sum_j p_j^alpha_per,  w_i = (N P(i))^-beta / max_j (N P(j))^-beta over the
            minibatch, beta: --per-beta0 -> 1
  Q_target <- tau Q + (1 - tau) Q_target every --target-network-frequency SGD steps; every
  --policy-frequency SGD steps the actor and alpha take --policy-frequency steps.
  Acting: a ~ pi(.|s) on the host CPU with the actor's params as the update call in flight found them.

Run (outputs: runs/<env_id>__sac__<seed>__<time>/, arrays and JSON, no pickle; docs/sac.md, docs/runs.md)
  python algos/sac.py                                          # Pendulum-v1, 20k steps
  python algos/sac.py --env-id HalfCheetah-v5 --total-timesteps 1000000 --num-devices -1
  python algos/sac.py --resume runs/<run>                      # continue from its checkpoint
  python algos/sac.py --capture-video                          # eval videos in RUN_DIR/videos
  python tools/sac_evaluate.py runs/<run>         # tools/: evaluate a model, write a dataset, plot a run
From code, on an env of your own (a factory of vector envs in SAME_STEP autoreset mode; `video` films evaluations):
  import gymnasium as gym, sac
  def env_fn(num_envs, video=None):
      return gym.make_vec("MountainCarContinuous-v0", num_envs, vector_kwargs={"autoreset_mode": "SameStep"})
  sac.train(sac.Args(env_id="MountainCarContinuous-v0", total_timesteps=20_000, run_dir="runs/mine"), env_fn)
  sac.train(sac.parse_args(["--resume", "runs/mine", "--total-timesteps", "40000"]), env_fn)  # continues it
Ctrl-C in train() checkpoints, then raises KeyboardInterrupt. The tools take such an env as a gymnasium id
"module:Env" with its module on PYTHONPATH.
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
import sys
import threading
import time
import warnings
from typing import Annotated, Optional, Tuple

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

SCRIPT = "sac"
FORMAT = f"{SCRIPT}/2"  # of checkpoint.npz and model.npz
LOG_STD_MIN, LOG_STD_MAX = -10.0, 2.0  # the clip of jaxrl's actor
ROW = ("obs", "action", "reward", "next_obs", "discount")  # a replay row

# The ranges of the flags, held by pydantic to the command line and to a run folder's args.json alike.
Count = Annotated[int, Field(ge=1, lt=2**31)]
Envs = Annotated[int, Field(ge=1, le=1024)]
Positive = Annotated[float, Field(gt=0)]
Fraction = Annotated[float, Field(ge=0, le=1)]
Rate = Annotated[float, Field(gt=0, le=1)]
Widths = Annotated[Tuple[Annotated[int, Field(ge=1, le=65_536)], ...], Field(min_length=1, max_length=16)]


@dataclasses.dataclass
class Args:
    # Algorithm
    env_id: str = "Pendulum-v1"
    """gymnasium id with a bounded Box action space and vector observations"""
    seed: Annotated[int, Field(ge=0, lt=2**31)] = 1
    """seed of the envs, the networks and the exploration"""
    total_timesteps: Count = 20_000
    """environment steps, summed over the envs"""
    num_envs: Envs = 1
    """parallel training environments"""
    hidden_sizes: Widths = (256, 256)
    """hidden layer widths of the actor and of each critic"""
    policy_lr: Positive = 3e-4
    """Adam step size of the actor"""
    q_lr: Positive = 3e-4
    """Adam step size of the critics"""
    batch_size: Count = 256
    """transitions per SGD step"""
    gamma: Rate = 0.99
    """discount factor"""
    tau: Rate = 0.005
    """Polyak rate of the target critics"""
    target_network_frequency: Count = 1
    """SGD steps between target-critic updates"""
    policy_frequency: Annotated[int, Field(ge=1, le=1000)] = 1
    """SGD steps between actor and alpha updates (each time that many of them, as CleanRL)"""
    autotune: bool = True
    """learn the temperature to reach the target entropy"""
    alpha: Positive = 0.2
    """the temperature with --no-autotune"""
    alpha_init: Positive = 1.0
    """initial temperature with --autotune (CleanRL, sbx, softlearning and jaxrl start at 1)"""
    target_entropy_scale: Annotated[float, Field(ge=-100, le=100)] = 0.5
    """target entropy = -scale * |A|"""
    learning_starts: Count = 10_000
    """environment steps of uniformly random actions before learning"""
    train_frequency: Count = 1
    """environment steps per SGD step"""
    # Replay
    buffer_size: Count = 1_000_000
    """replay capacity in transitions"""
    prioritized: bool = False
    """prioritized replay (off by default: no gain measured, docs/benchmarks.md, Ablations); uniform is alpha = 0"""
    per_alpha: Fraction = 0.6
    """priority exponent alpha"""
    per_beta0: Fraction = 0.4
    """initial importance-sampling exponent, annealed linearly to 1"""
    per_eps: Positive = 1e-6
    """added to |TD| so that no transition has zero probability"""
    # Learner
    updates_per_call: Annotated[int, Field(ge=1, le=10_000)] = 32
    """SGD steps fused in one jitted call"""
    prefetch_size: Annotated[int, Field(ge=1, le=64)] = 2
    """calls' worth of batches the prefetch thread keeps ready on the device"""
    num_devices: Annotated[int, Field(ge=-1, le=65_536)] = 1
    """local devices the learner splits each batch over (-1: all)"""
    # Run and output
    eval_every: Count = 5_000
    """environment steps between evaluations"""
    eval_episodes: Envs = 10
    """episodes per evaluation, run as parallel envs, deterministic actions"""
    checkpoint_every: Annotated[int, Field(ge=0, lt=2**31)] = 50_000
    """environment steps between checkpoints (0: none by steps)"""
    log_every: Count = 1_000
    """environment steps between tensorboard scalars"""
    run_dir: Optional[Annotated[str, Field(min_length=1)]] = None
    """output folder (default runs/<env_id>__sac__<seed>__<unix time>); must be new or empty"""
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


class ConfigError(Exception):
    """Bad input (flags, files, envs): one line on stderr and exit 2."""


class RunFailed(Exception):
    """The run cannot go on (divergence, a full disk): one line and exit 1."""


# ----------------------------------------------------------------------------------------- NETWORKS

# jaxrl's orthogonal init, gain sqrt 2 on every layer (jaxrl's log-std head: 1): it learns more (docs/sac.md, Tried)
Dense = functools.partial(nn.Dense, kernel_init=nn.initializers.orthogonal(2**0.5))


class Actor(nn.Module):
    """s -> (mean, log_std) of the Gaussian that tanh squashes into [-1, 1]^|A|."""

    action_dim: int
    hidden_sizes: Tuple[int, ...]

    @nn.compact
    def __call__(self, obs):
        x = obs.astype(jnp.float32)
        for width in self.hidden_sizes:
            x = nn.relu(Dense(width)(x))
        return Dense(self.action_dim)(x), jnp.clip(Dense(self.action_dim)(x), LOG_STD_MIN, LOG_STD_MAX)


class Critic(nn.Module):
    hidden_sizes: Tuple[int, ...]

    @nn.compact
    def __call__(self, obs, action):
        x = jnp.concatenate([obs.astype(jnp.float32), action], axis=-1)
        for width in self.hidden_sizes:
            x = nn.relu(Dense(width)(x))
        return Dense(1)(x)[..., 0]


class TwinCritic(nn.Module):
    """Two independent critics as one vmapped network: output [2, B]."""

    hidden_sizes: Tuple[int, ...]

    @nn.compact
    def __call__(self, obs, action):
        twins = nn.vmap(Critic, variable_axes={"params": 0}, split_rngs={"params": True}, in_axes=None, axis_size=2)
        return twins(self.hidden_sizes)(obs, action)


def sample_tanh_gaussian(mean, log_std, key):
    """(a = tanh(u), log pi(a)) for u ~ N(mean, std), with the stable form of log(1 - tanh(u)^2)."""
    std = jnp.exp(log_std)
    u = mean + std * jax.random.normal(key, mean.shape)
    log_normal = -0.5 * (((u - mean) / std) ** 2 + 2.0 * log_std + jnp.log(2.0 * jnp.pi))
    log_det = 2.0 * (jnp.log(2.0) - u - jax.nn.softplus(-2.0 * u))
    return jnp.tanh(u), jnp.sum(log_normal - log_det, axis=-1)


# ------------------------------------------------------------------------------------------- REPLAY


class PrioritizedReplay:
    """Proportional PER (Schaul et al. 2016) on cpprb, under one lock (cpprb is not thread-safe), inserts staged
    128 rows at a time; write_count[slot] counts overwrites: a |TD| goes back only to the row it came from."""

    def __init__(self, capacity, obs_dim, action_dim, alpha, eps):
        self.capacity = capacity
        self.spec = dict(zip(ROW, ((obs_dim,), (action_dim,), (), (obs_dim,), ())))  # a row's shapes, all float32
        cpprb_spec = {k: {"shape": shape or 1, "dtype": np.float32} for k, shape in self.spec.items()}
        self.buffer = cpprb.PrioritizedReplayBuffer(capacity, cpprb_spec, alpha=alpha, eps=eps)
        self.lock = threading.Lock()
        self.write_count = np.zeros(capacity, np.int64)
        self.priority = np.zeros(capacity, np.float64)  # cpprb cannot hand its priorities back
        self.staging_size = min(128, capacity)
        self.staging = {k: np.zeros((self.staging_size,) + shape, np.float32) for k, shape in self.spec.items()}
        self.staged_rows = 0
        self.rng = np.random.default_rng()  # deals the draws out (cpprb's own draws are not seeded either)

    def add(self, rows: dict) -> None:
        done, total = 0, len(rows["action"])
        while done < total:
            take = min(total - done, self.staging_size - self.staged_rows)
            for key, column in self.staging.items():
                column[self.staged_rows : self.staged_rows + take] = rows[key][done : done + take]
            self.staged_rows, done = self.staged_rows + take, done + take
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

    def sample(self, batch_size: int, num_batches: int = 1, beta: float = 1.0):
        """(batches[K, B, ...] with IS 'weights', slot indexes[K * B], their write counts). PER stratifies each
        minibatch over the whole priority mass (Schaul et al. 2016, B.2.1): one row from each 1/B of it. One cpprb
        draw of K*B rows takes one from each 1/(K*B), K in each 1/B; those K are dealt out to the K minibatches in
        random order, so a minibatch's row there is uniform over that 1/B. Rows add() stages wait for flush()."""
        k, b = num_batches, batch_size
        deal = self.rng.permuted(np.arange(k * b).reshape(b, k), axis=1).T.reshape(-1)  # [K, B]: row of the draw
        with self.lock:
            if not self.buffer.get_stored_size():
                raise ValueError(f"sample: no rows in cpprb yet ({self.staged_rows} staged: flush() hands them over)")
            draw = self.buffer.sample(k * b, beta=beta)  # one beta for the K minibatches
            batch = {key: value[deal].reshape((k, b) + value.shape[1:]) for key, value in draw.items()}  # copies
            indexes = batch.pop("indexes").astype(np.int64).reshape(-1)
            write_counts = self.write_count[indexes]
        for key in ("reward", "discount", "weights"):
            batch[key] = batch[key].reshape(k, b).astype(np.float32)
        batch["weights"] /= batch["weights"].max(axis=1, keepdims=True)  # per minibatch, as Acme, Dopamine
        return batch, indexes, write_counts

    def update_priorities(self, indexes, write_counts, priorities) -> int:
        """p_i = mean_m |delta_m,i| (+ eps by cpprb) where the slot still holds the sampled row."""
        if not np.all(np.isfinite(priorities) & (priorities >= 0)):  # one NaN poisons every sum in the tree
            raise ValueError("priorities must be finite and >= 0")
        with self.lock:
            fresh = self.write_count[indexes] == write_counts
            if fresh.any():  # cpprb refuses an empty update
                self.buffer.update_priorities(indexes[fresh], priorities[fresh])
                self.priority[indexes[fresh]] = priorities[fresh]
        return int(fresh.sum())

    def __len__(self) -> int:
        """Rows cpprb holds (staged ones not yet)."""
        with self.lock:
            return self.buffer.get_stored_size()

    def max_priority(self) -> float:
        with self.lock:
            return self.buffer.get_max_priority()

    def state_dict(self) -> dict:
        self.flush()
        with self.lock:
            rows = self.buffer.get_all_transitions()
            state = {f"replay/{k}": rows[k] for k in self.spec}
            state["replay/priority"] = self.priority[: self.buffer.get_stored_size()].copy()
            state["replay/next_index"] = np.asarray(self.buffer.get_next_index(), np.int64)
            state["replay/max_priority"] = np.asarray(self.buffer.get_max_priority(), np.float64)
        return state

    def load_state_dict(self, arrays: dict, path: str) -> None:
        """Rebuild cpprb slot by slot from a checked file: indexes, priorities, insert position as saved."""
        prio = arrays.get("replay/priority")
        stored = len(prio) if isinstance(prio, np.ndarray) and prio.ndim == 1 else -1
        require(0 <= stored <= self.capacity, f"{path}: replay/priority is not a vector of <= {self.capacity} rows")
        get = functools.partial(checked_array, arrays, path=path)
        prio, next_index = get("replay/priority", (stored,), np.float64), int(get("replay/next_index", (), np.int64))
        top = float(get("replay/max_priority", (), np.float64))
        data = {key: get(f"replay/{key}", (stored,) + (s or (1,)), np.float32) for key, s in self.spec.items()}
        full = stored == self.capacity
        discount = data["discount"]
        ok = 0 < top <= 1e30 and np.all((prio >= 0) & (prio <= top))
        require(ok, f"{path}: replay priorities out of range [0, max]")
        require(
            0 <= next_index < self.capacity and (next_index == stored or full),
            f"{path}: replay/next_index out of range",
        )
        require(np.all((discount >= 0) & (discount <= 1)), f"{path}: replay discounts out of range [0, 1]")
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


# ------------------------------------------------------------------------------------------ LEARNER


TrainState = collections.namedtuple(
    "TrainState", "actor_params critic_params target_critic_params log_alpha actor_opt critic_opt alpha_opt sgd_steps"
)
Nets = collections.namedtuple("Nets", "actor critic actor_tx critic_tx alpha_tx")  # flax modules, optax optimisers


def make_nets(args: Args, action_dim: int) -> Nets:
    actor, critic = Actor(action_dim, args.hidden_sizes), TwinCritic(args.hidden_sizes)
    return Nets(actor, critic, optax.adam(args.policy_lr), optax.adam(args.q_lr), optax.adam(args.q_lr))


def init_train_state(nets: Nets, args: Args, obs_dim: int, action_dim: int, key) -> TrainState:
    log_alpha = np.log(args.alpha_init if args.autotune else args.alpha).astype(np.float32)

    @jax.jit  # one compile, not one per eager op
    def init(key, log_alpha):
        k_actor, k_critic = jax.random.split(key)
        obs, action = jnp.zeros((1, obs_dim)), jnp.zeros((1, action_dim))
        actor_params, critic_params = nets.actor.init(k_actor, obs), nets.critic.init(k_critic, obs, action)
        target = jax.tree_util.tree_map(jnp.copy, critic_params)  # a copy: the update donates its input buffers
        opts = (nets.actor_tx.init(actor_params), nets.critic_tx.init(critic_params), nets.alpha_tx.init(log_alpha))
        return TrainState(actor_params, critic_params, target, log_alpha, *opts, jnp.zeros((), jnp.int32))

    return init(key, log_alpha)


def critic_loss(nets: Nets, critic_params, state: TrainState, batch: dict, key):
    """IS-weighted squared error of both critics against the clipped double-Q soft target: (L_Q, (td[2, B], mean Q))."""
    mean, log_std = nets.actor.apply(state.actor_params, batch["next_obs"])
    next_action, next_log_prob = sample_tanh_gaussian(mean, log_std, key)
    next_q = nets.critic.apply(state.target_critic_params, batch["next_obs"], next_action).min(axis=0)
    target = batch["reward"] + batch["discount"] * (next_q - jnp.exp(state.log_alpha) * next_log_prob)
    q = nets.critic.apply(critic_params, batch["obs"], batch["action"])
    td = q - jax.lax.stop_gradient(target)
    return jnp.mean(batch["weights"] * (0.5 * td**2).sum(axis=0)), (td, q.mean())


def actor_alpha_loss(nets: Nets, actor_params, log_alpha, critic_params, obs, key, target_entropy):
    """L_pi + L_alpha, aux (L_pi, L_alpha, entropy); the stop_gradients give each parameter its own loss."""
    mean, log_std = nets.actor.apply(actor_params, obs)
    action, log_prob = sample_tanh_gaussian(mean, log_std, key)
    q = nets.critic.apply(critic_params, obs, action).min(axis=0)
    alpha = jnp.exp(log_alpha)
    actor_loss = jnp.mean(jax.lax.stop_gradient(alpha) * log_prob - q)
    alpha_loss = jnp.mean(-alpha * (jax.lax.stop_gradient(log_prob) + target_entropy))
    return actor_loss + alpha_loss, (actor_loss, alpha_loss, -jnp.mean(log_prob))


def make_update(nets: Nets, args: Args, action_dim: int, shardings: "Shardings"):
    """jit(state, batches[K, B, ...], key) -> (state, metrics, priorities[K, B]): K SGD steps in a lax.scan."""
    target_entropy = -args.target_entropy_scale * action_dim

    def actor_step(carry, key):
        state, obs = carry
        grad_fn = jax.grad(actor_alpha_loss, argnums=(1, 2), has_aux=True)  # d/d actor params, d/d log alpha
        grads, aux = grad_fn(nets, state.actor_params, state.log_alpha, state.critic_params, obs, key, target_entropy)
        actor_grads, alpha_grad = grads
        updates, actor_opt = nets.actor_tx.update(actor_grads, state.actor_opt, state.actor_params)
        state = state._replace(actor_params=optax.apply_updates(state.actor_params, updates), actor_opt=actor_opt)
        if args.autotune:
            updates, alpha_opt = nets.alpha_tx.update(alpha_grad, state.alpha_opt, state.log_alpha)
            state = state._replace(log_alpha=optax.apply_updates(state.log_alpha, updates), alpha_opt=alpha_opt)
        return (state, obs), aux

    def actor_steps(state, obs, key):
        (state, _), aux = jax.lax.scan(actor_step, (state, obs), jax.random.split(key, args.policy_frequency))
        return state, tuple(x.mean() for x in aux)

    def sgd_step(state: TrainState, inputs):
        batch, key = inputs
        critic_key, actor_key = jax.random.split(key)
        grad_fn = jax.value_and_grad(critic_loss, argnums=1, has_aux=True)
        (q_loss, (td, q_mean)), grads = grad_fn(nets, state.critic_params, state, batch, critic_key)
        updates, opt = nets.critic_tx.update(grads, state.critic_opt, state.critic_params)
        params = optax.apply_updates(state.critic_params, updates)
        steps = state.sgd_steps + 1
        polyak = optax.incremental_update(params, state.target_critic_params, args.tau)
        target = optax.periodic_update(polyak, state.target_critic_params, steps, args.target_network_frequency)
        state = state._replace(critic_params=params, critic_opt=opt, target_critic_params=target, sgd_steps=steps)
        state, (actor_l, alpha_l, entropy) = jax.lax.cond(  # the delayed actor and alpha steps
            steps % args.policy_frequency == 0,
            lambda s: actor_steps(s, batch["obs"], actor_key),
            lambda s: (s, (jnp.nan, jnp.nan, jnp.nan)),
            state,
        )
        finite = jnp.isfinite(optax.tree.norm((state.critic_params, state.actor_params, state.log_alpha)))
        td = jnp.where(finite, td, jnp.nan)  # non-finite parameters: NaN priorities stop the run
        return state, (q_loss, q_mean, actor_l, alpha_l, entropy, td)

    def update(state: TrainState, batches: dict, key):
        keys = jax.random.split(jax.random.fold_in(key, state.sgd_steps), batches["reward"].shape[0])
        state, (q_loss, q_mean, actor_l, alpha_l, entropy, td) = jax.lax.scan(sgd_step, state, (batches, keys))
        metrics = {"losses/qf_loss": q_loss.mean(), "losses/qf_values": q_mean.mean()}
        metrics.update({"losses/actor_loss": jnp.nanmean(actor_l), "losses/alpha_loss": jnp.nanmean(alpha_l)})
        metrics.update({"losses/entropy": jnp.nanmean(entropy), "losses/alpha": jnp.exp(state.log_alpha)})
        return state, metrics, jnp.abs(td).mean(axis=1)

    whole, split = shardings
    return jax.jit(update, donate_argnums=0, in_shardings=(whole, split, whole), out_shardings=(whole, whole, split))


Shardings = collections.namedtuple("Shardings", "replicated split")  # the state: whole on each device; batches: split


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
    """Acme's learner: it owns the train state (on the learner's devices) and its PRNG key, beta's schedule, a
    prefetch thread that samples K minibatches ahead and puts them on the device(s), and a writer thread that
    writes each call's |TD| back as priorities. step() runs one jitted call of K SGD steps; actor_params is the
    actor's copy of the policy, taken as each call is dispatched (so it lags the learner by at most K SGD steps)."""

    def __init__(self, args: Args, nets: Nets, replay: PrioritizedReplay, obs_dim: int, action_dim: int):
        self.args, self.replay, self.shardings = args, replay, learner_shardings(args)
        self.act_device = actor_device("cpu", self.shardings.replicated.mesh.devices.flat)
        self.key, init_key = jax.random.split(jax.random.PRNGKey(args.seed))
        init = functools.partial(init_train_state, nets, args, obs_dim, action_dim)
        shapes = jax.eval_shape(init, init_key)
        state_bytes = sum(x.size * x.dtype.itemsize for x in jax.tree_util.tree_leaves(shapes))
        batches = (
            (args.prefetch_size + 1) * args.updates_per_call * args.batch_size * (2 * obs_dim + action_dim + 3) * 4
        )
        require_memory(2 * state_bytes + batches, "the networks, their copies and the batches in flight", True)
        self.state = jax.device_put(init(init_key), self.shardings.replicated)
        self.update = make_update(nets, args, action_dim, self.shardings)
        self.sampler = concurrent.futures.ThreadPoolExecutor(1, "prefetch")
        self.writer = concurrent.futures.ThreadPoolExecutor(1, "priority-writer")
        self.batches, self.writes = collections.deque(), collections.deque()  # futures, oldest first
        self.metrics, self.wait_seconds, self.learn_seconds = {}, 0.0, 0.0
        self.sgd_steps = 0  # SGD steps done (the train state's count)
        self.actor_params = actor_copy(
            self.state.actor_params, self.act_device
        )  # the params that act (one call behind)

    def step(self, env_step: int) -> bool:
        """K SGD steps in one call on batches sampled ahead; False, and nothing done, while the replay holds
        fewer than B rows (a resumed replay's may be fewer)."""
        self.replay.flush()
        if len(self.replay) < self.args.batch_size:
            return False
        beta = self.beta(env_step)
        while len(self.batches) <= self.args.prefetch_size:  # prefetch_size calls ahead while this one learns
            self.batches.append(self.sampler.submit(self.sample, beta))
        start = time.perf_counter()
        batches, indexes, write_counts = self.batches.popleft().result()
        self.wait_seconds += time.perf_counter() - start
        self.actor_params = actor_copy(self.state.actor_params, self.act_device)  # call i-1's params act while i runs
        self.state, self.metrics, priorities = self.update(self.state, batches, self.key)
        self.writes.append(self.writer.submit(self.write_priorities, indexes, write_counts, priorities, self.sgd_steps))
        while self.writes and self.writes[0].done():
            self.writes.popleft().result()  # raises the writer's error, e.g. divergence
        self.sgd_steps += self.args.updates_per_call
        self.learn_seconds += time.perf_counter() - start
        return True

    def beta(self, env_step: int) -> float:
        return linear_schedule(self.args.per_beta0, 1.0, self.args.total_timesteps, env_step)

    def sample(self, beta: float):
        """On the prefetch thread: (batches [K, B, ...] on the device(s), slot indexes, write counts)."""
        batches, indexes, write_counts = self.replay.sample(self.args.batch_size, self.args.updates_per_call, beta)
        return jax.device_put(batches, self.shardings.split), indexes, write_counts

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
        """What it logs: the last call's losses, beta and the largest priority."""
        scalars = {k: float(v) for k, v in self.metrics.items()}
        return {**scalars, "replay/beta": self.beta(step), "replay/priority_max": self.replay.max_priority()}

    def progress(self) -> str:
        q_loss, alpha = (float(self.metrics.get(k, np.nan)) for k in ("losses/qf_loss", "losses/alpha"))
        return f"qf_loss {q_loss:.3f}  alpha {alpha:.3f}"

    def policy_params(self):
        return self.state.actor_params

    def state_dict(self) -> dict:
        """The train state, its key and the replay, once the priorities of every call so far are in the replay."""
        while self.writes:
            self.writes.popleft().result()
        return {**tree_arrays("train_state/", self.state), "key": np.asarray(self.key), **self.replay.state_dict()}

    def load_state_dict(self, arrays: dict, path: str) -> None:
        """A checkpoint's checked train state (one copy, whatever number of devices wrote it), key and replay."""
        state = restore_tree(self.state, arrays, "train_state/", path)
        self.state = jax.device_put(state, self.shardings.replicated)
        self.key = jnp.asarray(checked_array(arrays, "key", (2,), np.uint32, path))
        self.replay.load_state_dict(arrays, path)
        self.sgd_steps = int(self.state.sgd_steps)
        require(0 <= self.sgd_steps < 2**31, f"{path}: train_state/sgd_steps is out of range")
        self.actor_params = actor_copy(self.state.actor_params, self.act_device)  # no lag yet

    def close(self) -> None:
        self.sampler.shutdown(cancel_futures=True)
        self.writer.shutdown()


def make_replay(args: Args, obs_dim: int, action_dim: int) -> PrioritizedReplay:
    """The replay, refused before allocating what this machine's RAM cannot hold."""
    row_bytes = (2 * obs_dim + action_dim + 3) * 4 + 48  # + priorities, write counts, cpprb's trees
    require_memory(args.buffer_size * row_bytes, f"--buffer-size {args.buffer_size}")
    alpha = args.per_alpha if args.prioritized else 0.0
    return PrioritizedReplay(args.buffer_size, obs_dim, action_dim, alpha, args.per_eps)


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


def make_act(actor: Actor):
    """jit(params, obs[N], key, step, deterministic) -> actions[N, |A|] in [-1, 1] (deterministic: tanh(mean))."""

    def act(params, obs, key, step, deterministic: bool):
        mean, log_std = actor.apply(params, obs)
        if deterministic:
            return jnp.tanh(mean)
        return sample_tanh_gaussian(mean, log_std, jax.random.fold_in(key, step))[0]

    return jax.jit(act, static_argnames="deterministic")


def to_env_action(action: np.ndarray, low: np.ndarray, high: np.ndarray) -> np.ndarray:
    """[n, prod(shape)] in [-1, 1] -> [n, *shape] in [low, high], affine, clipped against rounding."""
    action = action.reshape((len(action),) + low.shape)
    return np.clip(low + (action + 1.0) * 0.5 * (high - low), low, high)


def from_env_action(env_action: np.ndarray, low: np.ndarray, high: np.ndarray) -> np.ndarray:
    """[n, *shape] in [low, high] -> [n, prod(shape)] in [-1, 1], the inverse of to_env_action."""
    return np.clip(2.0 * (env_action - low) / (high - low) - 1.0, -1.0, 1.0).reshape(len(env_action), -1)


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
        jax.config.update("jax_cpu_enable_async_dispatch", False)  # the small policy call costs less without it
        cleanup.callback(jax.config.update, "jax_cpu_enable_async_dispatch", async_dispatch)  # as found, after
        envs = cleanup.enter_context(contextlib.closing(env_fn(args.num_envs)))
        mode = envs.metadata.get("autoreset_mode")
        require(mode == gym.vector.AutoresetMode.SAME_STEP, f"the env factory must set SAME_STEP autoreset, not {mode}")
        check_spaces(envs, args.env_id)
        require(envs.num_envs == args.num_envs, f"the env factory made {envs.num_envs} envs, not {args.num_envs}")
        obs_dim, action_dim = envs.single_observation_space.shape[0], int(np.prod(envs.single_action_space.shape))
        low, high = envs.single_action_space.low, envs.single_action_space.high
        nets = make_nets(args, action_dim)
        replay = make_replay(args, obs_dim, action_dim)
        learner = Learner(args, nets, replay, obs_dim, action_dim)
        cleanup.callback(learner.close)
        act = make_act(nets.actor)
        spaces = (envs.single_observation_space, envs.single_action_space)
        evaluator = functools.partial(evaluate, act, env_fn=env_fn, episodes=args.eval_episodes)
        run = Run(args, learner, env_fn, spaces, evaluator, signals, cleanup)
        step, act_key = (
            run.start_step,
            jax.device_put(learner.key, learner.act_device),
        )  # the policy's inputs live where it runs
        envs.action_space.seed(args.seed + step)
        obs, _ = envs.reset(seed=args.seed + step)  # env state is not saved: a resume starts new episodes
        run.eval_if_due(step)  # the one a signal cut short, if the run resumed from there
        while step < args.total_timesteps and not run.stopped:
            # ACT: uniformly random actions until learning starts, then samples of the policy
            if step < args.learning_starts:
                action = from_env_action(envs.action_space.sample(), low, high)
            else:
                action = np.asarray(act(learner.actor_params, obs, act_key, np.int32(step), deterministic=False))
            next_obs, reward, terminated, truncated, info = envs.step(to_env_action(action, low, high))

            # STORE: the row leads to the real final observation; only termination ends the return
            reached = real_next_obs(next_obs, terminated | truncated, info)
            replay.add(dict(zip(ROW, (obs, action, reward, reached, args.gamma * (1.0 - terminated)))))
            obs, step = next_obs, step + args.num_envs

            # LEARN: one SGD step per --train-frequency env steps, K fused per call
            sgd_due = (step - args.learning_starts) // args.train_frequency
            while not run.stopped and sgd_due - learner.sgd_steps >= args.updates_per_call:
                if not learner.step(step):  # the replay holds fewer than B rows
                    break

            run.tally(step, reward, terminated | truncated)
            run.log(step, {})
            run.eval_if_due(step)
            run.checkpoint(step)
        return run.finish(step)


def sgd_budget(args: Args) -> int:
    """SGD steps in the whole run: one per --train-frequency env steps after --learning-starts."""
    return max(0, args.total_timesteps - args.learning_starts) // args.train_frequency


# ================================================================================================ THE SEAM
# Above, the algorithm; below, the run harness: envs, files, checkpoints and resume, logging, signals, the CLI.


# ------------------------------------------------------------------------------------- ENVIRONMENTS


def make_env(env_id: str, num_envs: int, video: Optional[Tuple[str, str]] = None) -> gym.vector.VectorEnv:
    """Sync vector envs in SAME_STEP autoreset mode; with video = (folder, prefix) env 0 films its first episode."""
    if video is not None and sys.platform.startswith("linux") and not os.environ.get("DISPLAY"):
        os.environ.setdefault("MUJOCO_GL", "egl")  # headless rendering
        os.environ.setdefault("SDL_VIDEODRIVER", "dummy")

    def make(filmed: bool):
        if not filmed:
            return gym.make(env_id)
        with warnings.catch_warnings():  # videos/ holds the earlier evaluations' files, which stay
            warnings.filterwarnings("ignore", message=".*Overwriting existing videos")
            env = gym.make(env_id, render_mode="rgb_array")
            return gym.wrappers.RecordVideo(env, video[0], lambda episode: episode == 0, name_prefix=video[1])

    thunks = [functools.partial(make, video is not None and i == 0) for i in range(num_envs)]
    try:
        envs = gym.vector.SyncVectorEnv(thunks, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    except ImportError as e:
        raise ConfigError(f"cannot make env {env_id!r}: {first_line(e)} (pip install -r requirements.txt)") from None
    except (gym.error.Error, AttributeError, ValueError) as e:
        raise ConfigError(f"cannot make env {env_id!r}: {first_line(e)}") from None
    try:
        check_spaces(envs, env_id)
    except ConfigError:
        envs.close()
        raise
    return envs


def check_spaces(envs, env_id: str) -> None:
    """SAC's spaces: bounded Box actions of any shape (the networks see them flat), vector observations."""
    space, obs_space = envs.single_action_space, envs.single_observation_space
    box = "SAC needs a Box action space (algos/dqn_prioritized.py takes discrete actions)"
    require(isinstance(space, gym.spaces.Box), f"{env_id} has a {type(space).__name__} action space; {box}")
    bounded = np.isfinite(space.low).all() and np.isfinite(space.high).all()
    require(bounded, f"{env_id} has unbounded actions {space}; SAC's tanh policy needs finite bounds")
    hint = "write a gymnasium.ObservationWrapper that returns a Box vector"
    if obs_space.is_np_flattenable:
        hint = "wrap it in gymnasium.wrappers.FlattenObservation (a vector env: wrappers.vector.FlattenObservation)"
    vector = isinstance(obs_space, gym.spaces.Box) and len(obs_space.shape) == 1
    require(vector, f"{env_id} has observations {obs_space}; the networks take vectors: {hint}")


def real_next_obs(next_obs, done, info):
    """The observation each step led to: at an episode's end, info["final_obs"] (SAME_STEP mode)."""
    if not done.any():  # most steps: no copy
        return next_obs
    real = next_obs.copy()
    for i in np.flatnonzero(done):
        real[i] = info["final_obs"][i]
    return real


def evaluate(act, params, env_fn, episodes: int, seed: int, video=None, stop=None):
    """Returns of deterministic episodes on parallel envs, the same seeds every time (None if `stop` fills)."""
    with contextlib.closing(env_fn(episodes, video=video)) as envs:
        low, high = envs.single_action_space.low, envs.single_action_space.high
        envs.action_space.seed(seed)
        obs, _ = envs.reset(seed=seed)
        returns, running = np.zeros(episodes), np.ones(episodes, bool)
        while running.any():
            if stop:  # a signal arrived: the run checkpoints at once
                return None
            action = np.asarray(act(params, obs, None, None, deterministic=True))
            obs, reward, terminated, truncated, _ = envs.step(to_env_action(action, low, high))
            returns += reward * running
            running &= ~(terminated | truncated)
        return returns


# -------------------------------------------------------------------------------------------- FILES


def require(ok, message: str) -> None:
    if not ok:
        raise ConfigError(message)


def require_memory(nbytes: int, what: str, device: bool = False) -> None:
    """Refuse before allocating what RAM (with device=True: also the device's memory, if it says) cannot hold."""
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
    """Flags from JSON (maybe hostile) in their types and ranges, or one ConfigError naming the first bad one."""
    text = json.dumps(saved, default=lambda v: v.item() if isinstance(v, np.generic) else str(v))  # numpy, paths
    prefix = f"{where}: " if where else ""
    try:
        args = pydantic.TypeAdapter(Args).validate_json(text)
    except pydantic.ValidationError as e:
        error = e.errors()[0]
        flag = "--" + str(error["loc"][0]).replace("_", "-") if error["loc"] else "the flags"
        raise ConfigError(f"{prefix}{flag} {error['msg'].removeprefix('Input ')}, got {error.get('input')!r}") from None
    require(args.seed < 2**31 - args.total_timesteps - 10_000, f"{prefix}--seed must be in [0, 2^31 - 10^4 - steps)")
    require(args.batch_size <= args.buffer_size, f"{prefix}--batch-size {args.batch_size} exceeds --buffer-size")
    require(args.learning_starts >= args.batch_size, f"{prefix}--learning-starts must be at least --batch-size")
    require(args.num_devices != 0, f"{prefix}--num-devices must be positive or -1 (all)")
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
    """One line at the start for a run that will not learn."""
    if sgd_budget(args) < args.updates_per_call:
        least = args.learning_starts + args.updates_per_call * args.train_frequency
        print(
            f"warning: no SGD step in this run (learning starts at {args.learning_starts}): "
            f"give --total-timesteps {least}",
            file=sys.stderr,
        )


# ---------------------------------------------------------------------------------------------- CLI


def parse_args(argv=None) -> Args:
    """tyro's parse; --resume takes the run's own flags, overridden by those typed (and where to write)."""
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
    sent = dict(track=typed.track, wandb_project_name=typed.wandb_project_name, wandb_entity=typed.wandb_entity)
    args = dataclasses.replace(args, resume=typed.resume, run_dir=typed.resume, **sent)  # W&B: as typed only
    typed_again = ":" not in args.env_id or args.env_id == typed.env_id
    require(typed_again, f"{path}: env id {args.env_id!r} imports a module: type --env-id to confirm")
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
