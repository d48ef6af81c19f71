"""The pieces as a researcher uses them from code (issue 58): train() in a loop over seeds stops on
Ctrl-C, a bad env factory fails before the first env step, train() leaves JAX's settings as it
found them, and a network changed in the script is the one the tools load."""

import os
import signal
import subprocess
import sys

import flax.linen as nn
import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import ROOT, load_script, load_tool

dqn, sac = load_script("dqn_prioritized"), load_script("sac")
SMALL = dict(hidden_sizes=(16,), learning_starts=200, batch_size=32, buffer_size=2000, updates_per_call=4)
SMALL.update(eval_episodes=2, eval_every=400, log_every=200, total_timesteps=800)


def vector_env(env_id, num_envs, video=None):
    """A custom env factory as the docstrings show it."""
    same_step = {"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP}
    return gym.make_vec(env_id, num_envs, vectorization_mode="sync", vector_kwargs=same_step)


def cartpole(num_envs, video=None):
    return vector_env("CartPole-v1", num_envs)


SCRIPTS = {"dqn": (dqn, "CartPole-v1"), "sac": (sac, "Pendulum-v1")}


class Counting(gym.vector.VectorWrapper):
    """Counts env steps; sends this process SIGINT at step `interrupt_at` (a Ctrl-C while the loop runs)."""

    steps, interrupt_at, times = 0, None, 1

    def step(self, actions):
        Counting.steps += 1
        if Counting.steps == Counting.interrupt_at:
            for _ in range(Counting.times):
                os.kill(os.getpid(), signal.SIGINT)
        return super().step(actions)


@pytest.mark.parametrize("name", SCRIPTS)
def test_ctrl_c_in_train_called_from_code_checkpoints_then_raises_keyboard_interrupt(name, tmp_path, capsys):
    """A loop over seeds stops at the Ctrl-C (train() used to return, and the next seed ran all its steps)."""
    script, env_id = SCRIPTS[name]
    Counting.steps, Counting.interrupt_at, Counting.times = 0, 300, 1
    ran = []

    def callers_handler(signum, frame):  # the caller's own (SIG_IGN in a background job, default_int_handler else)
        raise AssertionError("the caller's handler ran during train()")

    before = signal.signal(signal.SIGINT, callers_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            for seed in (1, 2):
                ran.append(seed)
                script.train(
                    script.Args(env_id=env_id, seed=seed, run_dir=str(tmp_path / f"seed{seed}"), **SMALL),
                    lambda n, video=None: Counting(vector_env(env_id, n)),
                )
        assert signal.getsignal(signal.SIGINT) is callers_handler  # the caller's handler is back
    finally:
        signal.signal(signal.SIGINT, before)
    assert ran == [1]
    meta, _ = script.load_npz(str(tmp_path / "seed1"), "checkpoint")
    assert meta["global_step"] == 300  # checkpointed where it stopped
    assert f"continue with --resume {tmp_path / 'seed1'}" in capsys.readouterr().out


@pytest.mark.parametrize("name", SCRIPTS)
def test_a_second_ctrl_c_stops_at_once_and_says_where_to_resume_from(name, tmp_path, capsys):
    script, env_id = SCRIPTS[name]
    Counting.steps, Counting.interrupt_at, Counting.times = 0, 300, 2
    run_dir = str(tmp_path / "run")
    with pytest.raises(KeyboardInterrupt):
        script.train(
            script.Args(env_id=env_id, run_dir=run_dir, **SMALL), lambda n, video=None: Counting(vector_env(env_id, n))
        )
    # none yet: at once means at once, and the line says so (it used to send the user to --resume)
    assert "a second Ctrl-C: stopped at once; no checkpoint yet" in capsys.readouterr().out
    assert not os.path.exists(os.path.join(run_dir, "checkpoint.npz"))
    Counting.times = 1


@pytest.mark.parametrize("name", SCRIPTS)
def test_an_env_factory_without_the_video_argument_fails_before_the_first_env_step(name, tmp_path):
    """The evaluations call env_fn(n, video=...): train() calls it so once at the start (it used to
    fail at the first evaluation, after every step until then, with no checkpoint)."""
    script, env_id = SCRIPTS[name]
    Counting.steps, Counting.interrupt_at = 0, None
    with pytest.raises(script.ConfigError, match="env_fn\\(num_envs, video=...\\) failed: .*video"):
        args = script.Args(env_id=env_id, run_dir=str(tmp_path / "run"), **SMALL)
        script.train(args, lambda n: Counting(vector_env(env_id, n)))
    assert Counting.steps == 0


@pytest.mark.parametrize("name", SCRIPTS)
def test_train_leaves_jax_settings_as_it_found_them(name, tmp_path):
    script, env_id = SCRIPTS[name]
    before = jax.config.read("jax_cpu_enable_async_dispatch")
    try:
        for value in (True, False):
            jax.config.update("jax_cpu_enable_async_dispatch", value)
            args = script.Args(env_id=env_id, run_dir=str(tmp_path / str(value)), **SMALL)
            script.train(args, lambda n, video=None: vector_env(env_id, n))
            assert jax.config.read("jax_cpu_enable_async_dispatch") is value
    finally:
        jax.config.update("jax_cpu_enable_async_dispatch", before)


class Dueling(dqn.QNetwork):
    """A researcher's change to the script's network (a dueling head, Wang et al. 2016)."""

    @nn.compact
    def __call__(self, obs):
        x = obs.astype(jnp.float32)
        for width in self.hidden_sizes:
            x = nn.relu(nn.Dense(width)(x))
        value, advantage = nn.Dense(1)(x), nn.Dense(self.num_actions)(x)
        return value + advantage - advantage.mean(axis=-1, keepdims=True)


def test_the_tools_load_the_network_the_script_builds(tmp_path, monkeypatch):
    """tools/dqn_evaluate.py builds the network through the script's make_network (it built its own copy,
    so a changed network failed to load there)."""
    monkeypatch.setattr(dqn, "make_network", lambda args, space, n: Dueling(n, args.hidden_sizes))
    run_dir = str(tmp_path / "run")
    dqn.train(dqn.Args(run_dir=run_dir, **SMALL))
    act, params, saved, _, _ = load_tool("dqn_evaluate").load_policy(run_dir)
    assert saved.hidden_sizes == (16,) and "Dense_2" in params["params"]  # the dueling head's layers
    actions = act(params, np.zeros((3, 4), np.float32), 0.0, np.random.default_rng(0))
    assert actions.shape == (3,) and set(actions.tolist()) <= {0, 1}


@pytest.mark.parametrize("name", SCRIPTS)
def test_the_docstrings_custom_env_example_runs_and_resumes(name, tmp_path, monkeypatch):
    """The example in the script's docstring, as written but for a shorter budget."""
    script = SCRIPTS[name][0]
    lines = script.__doc__.split("From code")[1].split("\n")[1:]
    code = "\n".join(line[2:] for line in lines[: next(i for i, x in enumerate(lines) if not x.startswith("  "))])
    assert ".train(" in code and '.parse_args(["--resume", "runs/mine"' in code
    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(__import__("sys").modules, script.SCRIPT, script)
    exec(code.replace("20_000", "1_000").replace('"40000"', '"1200"'), {})
    meta, _ = script.load_npz(str(tmp_path / "runs" / "mine"), "checkpoint")
    assert meta["global_step"] == 1200 and meta["args"]["env_id"] in ("Acrobot-v1", "MountainCarContinuous-v0")


def test_a_sac_run_that_does_no_sgd_step_says_so_at_the_start(tmp_path, capsys):
    """python algos/sac.py --total-timesteps 3000 learned nothing (learning starts at 10k) and said only qf_loss nan."""
    assert sac.cli(["--total-timesteps", "1031", "--learning-starts", "1000", "--run-dir", str(tmp_path / "a")]) == 0
    warned = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning:")]
    assert warned == ["warning: no SGD step in this run (learning starts at 1000): give --total-timesteps 1032"]
    assert sac.cli(["--total-timesteps", "1032", "--learning-starts", "1000", "--run-dir", str(tmp_path / "b")]) == 0
    assert "warning:" not in capsys.readouterr().err


@pytest.mark.parametrize("name", SCRIPTS)
def test_a_ctrl_c_while_the_run_starts_stops_it_after_a_checkpoint(name, tmp_path, capsys):
    """SIGINT while train() builds the run (here as it makes the envs, before JAX compiles the network):
    train()'s handler takes it from its first line, so the run stops cleanly at step 0 with a checkpoint.
    Before, Python's default handler raised KeyboardInterrupt wherever the start was, often inside a JAX
    compile, and the process then crashed as it exited (docs/reliability.md)."""
    script, env_id = SCRIPTS[name]
    made = []

    def interrupting(n, video=None):
        if not made:
            os.kill(os.getpid(), signal.SIGINT)
        made.append(n)
        return vector_env(env_id, n)

    run_dir = str(tmp_path / "run")
    with pytest.raises(KeyboardInterrupt):
        script.train(script.Args(env_id=env_id, run_dir=run_dir, **SMALL), interrupting)
    meta, _ = script.load_npz(run_dir, "checkpoint")
    assert meta["global_step"] == 0
    assert f"stopped by signal 2 at step 0; continue with --resume {run_dir}" in capsys.readouterr().out


@pytest.mark.parametrize("name", ["dqn_prioritized", "sac", "bc_offline", "apex_dqn"])
def test_a_second_ctrl_c_inside_jax_is_raised_as_jax_returns(name):
    """Raised inside a JAX compile, a KeyboardInterrupt left the process to crash as it exited (rc -11: seen
    with benchmark/stress.py under glibc's malloc checks); inside JAX the handler only marks it, and
    check() raises it at the next checkpoint or the run's end. Outside JAX it is raised at once."""
    import contextlib
    import types

    script = load_script(name)
    inside_jax = types.SimpleNamespace(f_globals={"__name__": "jax._src.compiler"}, f_back=None)
    ours = types.SimpleNamespace(f_globals={"__name__": name}, f_back=inside_jax)  # a traced function of ours
    with contextlib.ExitStack() as cleanup:
        signals = script.Signals(cleanup)
        assert signal.getsignal(signal.SIGINT) == signals.on_signal
        signals.on_signal(signal.SIGTERM, None)  # the first: a stop
        signals.on_signal(signal.SIGTERM, None)  # `timeout`'s second SIGTERM is no Ctrl-C
        signals.check()
        signals.on_signal(signal.SIGINT, ours)  # inside JAX: not raised there
        assert signals.interrupted and signals.stopped == [signal.SIGTERM] * 2 + [signal.SIGINT]
        with pytest.raises(KeyboardInterrupt):
            signals.check()
        with pytest.raises(KeyboardInterrupt):
            signals.on_signal(signal.SIGINT, types.SimpleNamespace(f_globals={"__name__": name}, f_back=None))
    assert signal.getsignal(signal.SIGINT) is not signals.on_signal  # put back


def test_a_second_ctrl_c_while_xla_compiles_is_raised_after_and_the_exit_is_clean(tmp_path):
    """The crash itself (results/runs/stress/compile_interrupt.py): a KeyboardInterrupt raised while XLA compiles
    makes the process segfault as it exits. With the script's Signals the second Ctrl-C, sent while a 300-layer
    function compiles, waits for the compile; check() raises it, and Python exits as a Ctrl-C leaves it (-SIGINT).
    Seen failing (rc -11, 3 of 3) with 57a2ec6's handler (a second Ctrl-C raised at once) in place of Signals."""
    code = f"""
import contextlib, importlib.util, os, signal, threading
import jax, jax.numpy as jnp
spec = importlib.util.spec_from_file_location("dqn", {os.path.join(ROOT, "algos", "dqn_prioritized.py")!r})
dqn = importlib.util.module_from_spec(spec)
spec.loader.exec_module(dqn)
def big(x):
    for i in range(300):
        x = jnp.sin(x @ x.T) + i
    return x.sum()
with contextlib.ExitStack() as cleanup:
    signals = dqn.Signals(cleanup)
    os.kill(os.getpid(), signal.SIGINT)  # the first: a stop
    threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGINT)).start()  # the second, while XLA compiles
    jax.jit(big)(jnp.ones((64, 64))).block_until_ready()
    print("compiled", signals.interrupted, flush=True)
    signals.check()
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == -signal.SIGINT and "compiled True" in done.stdout, (done.returncode, done.stderr[-2000:])
