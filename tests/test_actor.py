"""The actor apart from the learner (Acme's split): which device acts, the copy it acts with, and which
params version acts at each env step (the params an update call starts from, while that call runs)."""

import os
import subprocess
import sys
import types

import jax
import numpy as np
import pytest
from helpers import ROOT, load_script

dqn = load_script("dqn_prioritized")
sac = load_script("sac")
bc = load_script("bc_offline")


def leaves(tree):
    return [np.array(x) for x in jax.tree_util.tree_leaves(jax.device_get(tree))]


def same(a, b) -> bool:
    return all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("script", [dqn, sac])
def test_actor_device_rule(script):
    cpu = jax.devices("cpu")[0]
    tpu = [types.SimpleNamespace(platform="tpu", id=i) for i in range(2)]
    assert script.actor_device("cpu", tpu) is cpu  # an accelerator learns, the host CPU acts (SAC: always)
    cpus = jax.devices("cpu")
    assert script.actor_device("cpu", cpus) is cpus[0]  # a CPU learner acts where it learns


def test_dqn_acts_on_the_learners_device_when_told_and_the_atari_preset_tells_it():
    tpu = [types.SimpleNamespace(platform="tpu", id=i) for i in range(2)]
    assert dqn.actor_device("learner", tpu) is tpu[0]
    assert dqn.ATARI_PRESET["actor_device"] == "learner" and dqn.Args().actor_device == "cpu"


@pytest.mark.parametrize("script", [dqn, sac])
def test_without_a_cpu_backend_the_learner_acts(script, monkeypatch):
    def devices(backend=None):
        if backend == "cpu":
            raise RuntimeError("Unknown backend cpu")  # JAX_PLATFORMS=tpu
        return []

    tpu = [types.SimpleNamespace(platform="tpu", id=0)]
    monkeypatch.setattr(script.jax, "devices", devices)
    assert script.actor_device("cpu", tpu) is tpu[0]


@pytest.mark.parametrize("script", [dqn, sac, bc])
def test_actor_copy_survives_the_donating_update(script):
    """The update donates its state; a copy on the same device must be a copy, not the same buffers."""
    update = jax.jit(lambda s: jax.tree_util.tree_map(lambda x: x + 1.0, s), donate_argnums=0)
    state = update({"w": jax.numpy.zeros((64, 64)), "b": jax.numpy.zeros(64)})
    copy = script.actor_copy(state, jax.devices("cpu")[0])
    for _ in range(2):
        state = update(state)
    assert not any(x.is_deleted() for x in jax.tree_util.tree_leaves(copy))
    assert all((x == 1.0).all() for x in leaves(copy)) and all((x == 3.0).all() for x in leaves(state))


def record_acting(monkeypatch, script, params_of):
    """Wrap the script's make_act and make_update to log the params each policy call gets (with the
    number of observations) and the params each update call starts from and ends with."""
    log = {"acts": [], "updates": []}
    make_act, make_update = script.make_act, script.make_update

    def logging_make_act(*a, **k):
        act = make_act(*a, **k)

        def logged(params, obs, *rest, **kw):
            log["acts"].append((len(obs), leaves(params)))
            return act(params, obs, *rest, **kw)

        return logged

    def logging_make_update(*a, **k):
        update = make_update(*a, **k)

        def logged(state, *rest):
            training_acts = sum(n == 1 for n, _ in log["acts"])
            before = leaves(params_of(state))
            out = update(state, *rest)
            log["updates"].append((training_acts, before, leaves(params_of(out[0]))))
            return out

        return logged

    monkeypatch.setattr(script, "make_act", logging_make_act)
    monkeypatch.setattr(script, "make_update", logging_make_update)
    return log


def check_schedule(log):
    """Env step j acts with the params the newest update call dispatched before it started from (the
    initial params before the first call); the evaluation after the loop with the final params."""
    updates, acts = log["updates"], log["acts"]
    training = [p for n, p in acts if n == 1]
    assert len(updates) >= 3
    for j, params in enumerate(training):  # updates[i][0]: the policy calls before call i was dispatched
        dispatched = [u for u in updates if u[0] <= j]
        expected = dispatched[-1][1] if dispatched else updates[0][1]
        assert same(params, expected), f"env step {j} acted with other params than the call in flight started from"
    assert not same(training[-1], updates[-1][2])  # the last steps lag the newest params
    evaluation = [p for n, p in acts if n == 2]
    assert evaluation and all(same(p, updates[-1][2]) for p in evaluation)  # the current params evaluate


@pytest.mark.parametrize("script, params_of", [(dqn, lambda s: s.params), (sac, lambda s: s.actor_params)])
def test_each_step_acts_with_the_params_the_update_in_flight_started_from(script, params_of, monkeypatch, tmp_path):
    log = record_acting(monkeypatch, script, params_of)
    small = dict(total_timesteps=400, learning_starts=64, batch_size=16, updates_per_call=32, buffer_size=1000)
    quiet = dict(eval_every=10**6, eval_episodes=2, checkpoint_every=0)
    script.train(script.Args(**small, **quiet, run_dir=str(tmp_path / "run")))
    check_schedule(log)


def test_the_copy_of_a_replicated_state_survives_on_two_devices():
    """With --num-devices 2 the state is one array over both devices; a device_put of the whole of it
    to device 0 aliases device 0's replica, which the donating update frees."""
    code = """
import jax, numpy as np, sys
sys.path.insert(0, "tests")
from helpers import ROOT, load_script
dqn = load_script("dqn_prioritized")
mesh = jax.sharding.Mesh(np.array(jax.devices()), ("d",))
state = jax.device_put(jax.numpy.zeros(8), jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec()))
copy = dqn.actor_copy(state, jax.devices()[0])
update = jax.jit(lambda s: s + 1.0, donate_argnums=0)
state = update(update(state))
print("COPY", len(jax.devices()), copy.is_deleted() or float(copy.sum()))
"""
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    assert "COPY 2 0.0" in out.stdout, out.stdout + out.stderr
