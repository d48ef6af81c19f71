"""--keep-checkpoints and --checkpoint-minutes (issue 17), in all three scripts: the last K complete
checkpoints stay, each a loadable file of its own step; older ones go only once a newer one is
complete (a write that fails leaves all K); a checkpoint is also taken when the minutes are up."""

import os
import re
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


def kept(run_dir):
    return sorted(
        int(m.group(1)) for m in map(re.compile(r"checkpoint-(\d+)\.npz").fullmatch, os.listdir(run_dir)) if m
    )


@pytest.mark.parametrize("script", list(MODULES))
def test_the_last_k_checkpoints_stay_each_of_its_own_step(script, tmp_path):
    every = 50 if script == "bc_offline" else 100  # BC counts SGD steps, the others env steps
    run(script, tmp_path / "k3", 6 * every, checkpoint_every=every, keep_checkpoints=3)
    assert kept(tmp_path / "k3") == [4 * every, 5 * every]
    assert step_of(script, tmp_path / "k3" / "checkpoint.npz") == 6 * every
    for step in (4 * every, 5 * every):
        assert step_of(script, tmp_path / "k3" / f"checkpoint-{step}.npz") == step
    # The default keeps one: checkpoint.npz alone, as before the flag existed.
    run(script, tmp_path / "k1", 3 * every, checkpoint_every=every)
    assert kept(tmp_path / "k1") == [] and (tmp_path / "k1" / "checkpoint.npz").is_file()
    # A resume goes on keeping: the resumed-from checkpoint becomes the next older one.
    run(script, tmp_path / "k3", 7 * every, checkpoint_every=every, keep_checkpoints=3, resume=str(tmp_path / "k3"))
    assert kept(tmp_path / "k3") == [5 * every, 6 * every]
    assert step_of(script, tmp_path / "k3" / "checkpoint.npz") == 7 * every


@pytest.mark.parametrize("script", list(MODULES))
def test_a_failed_write_removes_nothing(script, tmp_path, monkeypatch):
    """The write of the 4th checkpoint fails (a full disk): the 3 complete ones before it all
    remain, and the newest of them is still checkpoint.npz (also named checkpoint-<its step>.npz
    by then, the link made before the write)."""
    mod, every = MODULES[script], (50 if script == "bc_offline" else 100)
    real_savez, calls = np.savez, []

    def savez_fails_on_the_fourth(f, **arrays):
        calls.append(1)
        if len(calls) == 4:
            raise OSError(28, "No space left on device")
        real_savez(f, **arrays)

    monkeypatch.setattr(mod.np, "savez", savez_fails_on_the_fourth)
    with pytest.raises(mod.RunFailed, match="No space left on device"):
        run(script, tmp_path, 6 * every, checkpoint_every=every, keep_checkpoints=3)
    assert kept(tmp_path) == [every, 2 * every, 3 * every]
    assert step_of(script, tmp_path / "checkpoint.npz") == 3 * every
    assert step_of(script, tmp_path / f"checkpoint-{every}.npz") == every
    assert not [name for name in os.listdir(tmp_path) if ".tmp." in name]


@pytest.mark.parametrize("script", list(MODULES))
def test_checkpoint_minutes_take_checkpoints_without_a_step_period(script, tmp_path):
    """--checkpoint-every 0 and a period of 30 ms: checkpoints still come, by the clock."""
    budget = 1000 if script == "bc_offline" else 1500
    run(
        script,
        tmp_path,
        budget,
        checkpoint_every=0,
        checkpoint_minutes=0.0005,
        keep_checkpoints=1000,
    )
    steps = kept(tmp_path)
    assert len(steps) >= 2 and all(0 < s < budget for s in steps), steps
    for step in steps:
        assert step_of(script, tmp_path / f"checkpoint-{step}.npz") == step


@pytest.mark.parametrize("script", list(MODULES))
def test_a_fresh_run_refuses_a_folder_holding_an_earlier_runs_checkpoints(script, tmp_path):
    """A fresh run (no --resume) into a folder that holds another run's kept checkpoints is refused
    (issues 26, 27): nothing of the earlier run is touched, and each kept file evaluates with the
    script's tool."""
    every = 50 if script == "bc_offline" else 100
    run(script, tmp_path, 6 * every, checkpoint_every=every, keep_checkpoints=3)
    assert kept(tmp_path) == [4 * every, 5 * every]
    mod, tool = MODULES[script], {"dqn_prioritized": "dqn", "sac": "sac", "bc_offline": "bc"}[script] + "_evaluate.py"
    before = {n: (tmp_path / n).stat().st_mtime_ns for n in os.listdir(tmp_path)}
    with pytest.raises(mod.ConfigError, match="is not empty"):
        run(script, tmp_path, 3 * every, checkpoint_every=every, keep_checkpoints=3, seed=2)
    assert {n: (tmp_path / n).stat().st_mtime_ns for n in os.listdir(tmp_path)} == before
    for step in (4 * every, 5 * every):
        assert step_of(script, tmp_path / f"checkpoint-{step}.npz") == step
        out = subprocess.run(
            [
                sys.executable,
                os.path.join(ROOT, "tools", tool),
                str(tmp_path / f"checkpoint-{step}.npz"),
                "--episodes",
                "1",
            ],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert out.returncode == 0 and "over 1 episodes" in out.stdout, out.stderr
        assert np.isfinite(float(out.stdout.split(":")[1].split("+-")[0]))


def test_dqn_resume_after_a_kill_between_link_and_rename(tmp_path):
    """With K > 1 a checkpoint first hard-links checkpoint.npz to a temp name, then renames it to
    checkpoint-<step>.npz; a kill between the two leaves the temp link. The resume must still
    take its checkpoints (a fixed temp name that is not cleared would fail every one of them)
    and leave no temp file behind."""
    every = 100
    run("dqn_prioritized", tmp_path, 3 * every, checkpoint_every=every, keep_checkpoints=3)
    os.link(tmp_path / "checkpoint.npz", tmp_path / "checkpoint.npz.tmp.link")  # what the kill left
    run("dqn_prioritized", tmp_path, 5 * every, checkpoint_every=every, keep_checkpoints=3, resume=str(tmp_path))
    assert step_of("dqn_prioritized", tmp_path / "checkpoint.npz") == 5 * every
    assert kept(tmp_path) == [3 * every, 4 * every]
    assert not [name for name in os.listdir(tmp_path) if ".tmp." in name]
