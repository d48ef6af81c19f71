"""--num-devices (issue 17): the data-parallel learner of every script, on 2 forced host devices.

XLA reads --xla_force_host_platform_device_count once, when jax starts, so each check runs
tests/multidevice_worker.py in a fresh interpreter with the flag set, and checks its report here.
On this CPU the 2 "devices" share the same cores: this proves correctness, not speed.
"""

import json
import os
import subprocess
import sys

import pytest
from helpers import ROOT, load_script

SCRIPTS = ("dqn_prioritized", "sac", "bc_offline")
# float32 sums in another order: after 6 SGD steps with Adam, the largest difference seen in any
# leaf was 3.4e-7 of that leaf's largest value (DQN's second Adam moment), in the priorities
# 1.2e-7. RTOL 1e-5 leaves room and still fails on a real difference: gradients of half of each
# batch (as devices that skipped the all-reduce would apply) change the median parameter leaf
# by 0.4% (SAC) to 3% (DQN) of its largest value in the same test.
RTOL, ATOL = 1e-5, 1e-9


def worker(*argv) -> dict:
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "tests", "multidevice_worker.py"), *argv],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=600,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("REPORT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(lines[-1][len("REPORT ") :])


@pytest.mark.parametrize("script", SCRIPTS)
def test_update_on_two_devices_equals_one_device(script):
    """Two fused calls (K=3 SGD steps each, B=16) from the same state on the same batches: the
    parameters, target parameters, optimiser state, counters, metrics and priorities agree."""
    r = worker("update", script)
    assert r["state_devices_1"] == 1 and r["state_devices_2"] == 2  # replicated on both
    # The prefetch thread's batches arrive split: each device holds one contiguous half of B.
    assert r["shards"] == [[0, [3, 8, 3]], [8, [3, 8, 3]]] and r["shard_devices"] == 2
    assert r["rows_in_sampled_order"]
    assert r["moved"] > 1e-3  # the updates did something to compare
    worst = {k: d / (RTOL * r["state_scale"][k] + ATOL) for k, d in r["state_diff"].items()}
    assert max(worst.values()) <= 1, sorted(worst.items(), key=lambda kv: -kv[1])[:3]
    assert r["priorities_diff"] <= RTOL * r["priorities_scale"] + ATOL
    assert all(d <= 1e-4 for d in r["metrics_diff"].values()), r["metrics_diff"]
    # Bad device counts are refused, naming what is there.
    assert r["errors"]['{"num_devices": 3}'] == f"--num-devices 3, but this machine has 2: {r['device_names']}"
    assert r["errors"]['{"num_devices": 2, "batch_size": 15}'] == "--batch-size 15 does not split evenly over 2 devices"
    assert r["all_devices"] == 2  # -1: every local device


@pytest.mark.parametrize("script", SCRIPTS)
def test_checkpoints_move_between_device_counts(script, tmp_path):
    """Train on 2 devices, resume that checkpoint on 1, resume the result on 2 again."""
    runs = worker("run", script, str(tmp_path))["runs"]
    assert [run["devices"] for run in runs] == [2, 1, 2]
    assert [run["done"] for run in runs] == ([300, 400, 500] if script == "bc_offline" else [600, 800, 1000])
    assert [run["checkpoint_args_devices"] for run in runs] == [2, 1, 2]
    assert all(run["finite"] for run in runs)
    assert runs[-1]["kept"] == ["checkpoint.npz"]


@pytest.mark.parametrize("script", SCRIPTS)
def test_more_devices_than_there_are_is_one_line(script, capsys):
    mod = load_script(script)
    extra = ["--env-id", "Pendulum-v1"] if script == "sac" else []
    assert mod.cli(["--num-devices", "2", *extra]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--num-devices 2, but this machine has 1: " in err, err
    assert mod.cli(["--num-devices", "0", *extra]) == 2
    assert "--num-devices must be positive or -1" in capsys.readouterr().err
