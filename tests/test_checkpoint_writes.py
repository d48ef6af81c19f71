"""Checkpoint writes in the three single-process scripts: a write that fails (a full disk) leaves the
previous checkpoint whole and no temp file, and a fresh run never writes into another run's folder."""

import os
import subprocess
import sys

import numpy as np
import pytest
from helpers import ROOT, load_script

MODULES = {name: load_script(name) for name in ("dqn_prioritized", "sac", "bc_offline")}
ONLINE = dict(
    hidden_sizes=(16,),
    learning_starts=100,
    batch_size=16,
    buffer_size=1000,
    updates_per_call=4,
    eval_episodes=1,
    eval_every=10_000,
)
SMALL = {
    "dqn_prioritized": ONLINE,
    "sac": dict(ONLINE, env_id="Pendulum-v1"),
    "bc_offline": dict(
        hidden_sizes=(16,),
        batch_size=16,
        updates_per_call=10,
        eval_episodes=1,
        eval_every=10_000,
        dataset=[os.path.join(ROOT, "data", "pendulum-sac-expert.hdf5")],
    ),
}


def as_argv(flags: dict) -> list:
    """The command line that types these Args fields."""
    argv = []
    for name, value in flags.items():
        flag = "--" + name.replace("_", "-")
        if isinstance(value, bool):
            argv.append(flag if value else "--no-" + name.replace("_", "-"))
        elif isinstance(value, (tuple, list)):
            argv += [flag, *map(str, value)]
        else:
            argv += [flag, str(value)]
    return argv


def run(script, run_dir, budget, **flags):
    mod = MODULES[script]
    unit = "total_updates" if script == "bc_offline" else "total_timesteps"
    flags = {**SMALL[script], unit: budget, "run_dir": str(run_dir), **flags}
    resume = flags.pop("resume", None)  # train(parse_args(...)), which also does --resume
    return mod.train(mod.parse_args((["--resume", resume] if resume else []) + as_argv(flags)))


def step_of(script, path) -> int:
    meta, arrays = MODULES[script].load_npz(str(path), "checkpoint")
    return int(arrays["train_state/sgd_steps"]) if script == "bc_offline" else meta["global_step"]


@pytest.mark.parametrize("script", list(MODULES))
def test_a_failed_write_leaves_the_previous_checkpoint_whole(script, tmp_path, monkeypatch):
    """The write of the 4th checkpoint fails (a full disk): the run stops in one line, and
    checkpoint.npz is still the 3rd, whole."""
    mod, every = MODULES[script], (50 if script == "bc_offline" else 100)
    real_savez, calls = np.savez, []

    def savez_fails_on_the_fourth(f, **arrays):
        calls.append(1)
        if len(calls) == 4:
            raise OSError(28, "No space left on device")
        real_savez(f, **arrays)

    monkeypatch.setattr(mod.np, "savez", savez_fails_on_the_fourth)
    with pytest.raises(mod.RunFailed, match="No space left on device"):
        run(script, tmp_path, 6 * every, checkpoint_every=every)
    assert step_of(script, tmp_path / "checkpoint.npz") == 3 * every
    assert not [name for name in os.listdir(tmp_path) if ".tmp." in name]


@pytest.mark.parametrize("script", list(MODULES))
def test_a_fresh_run_refuses_a_folder_holding_an_earlier_runs_checkpoints(script, tmp_path):
    """A fresh run (no --resume) into a folder that holds another run's checkpoint is refused
    (issues 26, 27): nothing of the earlier run is touched, and its checkpoint evaluates with the
    script's tool."""
    every = 50 if script == "bc_offline" else 100
    run(script, tmp_path, 6 * every, checkpoint_every=every)
    mod, tool = MODULES[script], {"dqn_prioritized": "dqn", "sac": "sac", "bc_offline": "bc"}[script] + "_evaluate.py"
    before = {n: (tmp_path / n).stat().st_mtime_ns for n in os.listdir(tmp_path)}
    with pytest.raises(mod.ConfigError, match="is not empty"):
        run(script, tmp_path, 3 * every, checkpoint_every=every, seed=2)
    assert {n: (tmp_path / n).stat().st_mtime_ns for n in os.listdir(tmp_path)} == before
    assert step_of(script, tmp_path / "checkpoint.npz") == 6 * every
    out = subprocess.run(
        [sys.executable, os.path.join(ROOT, "tools", tool), str(tmp_path / "checkpoint.npz"), "--episodes", "1"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0 and "over 1 episodes" in out.stdout, out.stderr
    assert np.isfinite(float(out.stdout.split(":")[1].split("+-")[0]))
