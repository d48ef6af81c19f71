"""Resume correctness (issue 12): flags typed on the command line win (also when set back to
their default), --preset does not overwrite a run's own flags, and a resume without the
replay waits for learning_starts fresh rows instead of sampling an empty buffer."""

import json
import os

import pytest
from helpers import ROOT, load_script

dqn, sac, bc = (load_script(n) for n in ("dqn_prioritized", "sac", "bc_offline"))
MODULES = {"dqn": dqn, "sac": sac, "bc": bc}


def fake_run(tmp_path, module, **flags):
    run = tmp_path / "run"
    run.mkdir()
    args = {**module.dataclasses.asdict(module.Args()), **flags}
    (run / "args.json").write_text(json.dumps({"script": module.SCRIPT, "args": args}))
    return str(run)


def resumed(module, argv):
    args = module.tyro.cli(module.Args, args=argv) if module is not dqn else dqn.parse_args(argv)
    return module.resolve_args(args, module.given_flags(argv))


@pytest.mark.parametrize("script", list(MODULES))
def test_flag_set_back_to_its_default_is_taken(script, tmp_path):
    module = MODULES[script]
    default = module.Args().batch_size
    run = fake_run(tmp_path, module, batch_size=default // 2, seed=7)
    args = resumed(module, ["--resume", run, "--batch-size", str(default)])
    assert args.batch_size == default  # typed, though equal to the default
    assert args.seed == 7  # not typed: the run's own
    args = resumed(module, ["--resume", run])
    assert args.batch_size == default // 2  # nothing typed: the run's own


@pytest.mark.parametrize("script", list(MODULES))
def test_bool_flag_typed_as_no_flag(script, tmp_path):
    module = MODULES[script]
    run = fake_run(tmp_path, module, prioritized=not module.Args().prioritized)
    typed = "--prioritized" if module.Args().prioritized else "--no-prioritized"
    assert resumed(module, ["--resume", run, typed]).prioritized == module.Args().prioritized
    assert resumed(module, ["--resume", run]).prioritized != module.Args().prioritized


def test_preset_does_not_overwrite_the_runs_own_flags(tmp_path):
    run = fake_run(
        tmp_path,
        dqn,
        **{**dqn.ATARI_PRESET, "preset": "atari", "env_id": "ALE/Pong-v5", "learning_rate": 1e-4, "batch_size": 64},
    )
    args = resumed(dqn, ["--preset", "atari", "--resume", run])
    assert args.learning_rate == 1e-4 and args.batch_size == 64 and args.env_id == "ALE/Pong-v5"
    args = resumed(dqn, ["--preset", "atari", "--resume", run, "--batch-size", "32"])
    assert args.batch_size == 32 and args.learning_rate == 1e-4


def test_code_that_builds_args_keeps_the_differs_from_default_rule(tmp_path):
    """main(Args(...)) without `given`: a field counts as given when it differs from its default."""
    run = fake_run(tmp_path, dqn, batch_size=64)
    args = dqn.resolve_args(dqn.Args(resume=run, total_timesteps=123_456))
    assert args.total_timesteps == 123_456 and args.batch_size == 64


FAST = [
    "--hidden-sizes",
    "16",
    "--learning-starts",
    "200",
    "--batch-size",
    "32",
    "--buffer-size",
    "5000",
    "--updates-per-call",
    "4",
    "--train-frequency",
    "2",
    "--eval-episodes",
    "1",
    "--eval-every",
    "100000",
]


def test_dqn_resume_without_replay_waits_for_learning_starts(tmp_path, capsys):
    """Stopped with 3 of 4 SGD steps pending and no replay in the checkpoint: before the fix the
    prefetch thread sampled an empty cpprb buffer and died (index out of bounds)."""
    run_dir = str(tmp_path / "run")
    first = 200 + 2 * (4 * 125 + 3)  # (first - 200) / 2 = 503 SGD steps due: 500 done, 3 pending
    assert dqn.cli(FAST + ["--total-timesteps", str(first), "--no-checkpoint-replay", "--run-dir", run_dir]) == 0
    meta, arrays = dqn.load_npz(run_dir, "checkpoint")
    assert int(arrays["train_state/sgd_steps"]) == 500 and not any(k.startswith("replay/") for k in arrays)
    capsys.readouterr()
    assert dqn.cli(["--resume", run_dir, "--total-timesteps", "3000"]) == 0
    assert "0 rows in the replay" in capsys.readouterr().out
    _, arrays = dqn.load_npz(run_dir, "checkpoint")
    learn_from = first + 200  # learning_starts fresh rows first; their updates are skipped
    assert int(arrays["train_state/sgd_steps"]) == 500 + (3000 - learn_from) // 2 // 4 * 4


def test_sac_resume_without_replay_waits_for_learning_starts(tmp_path):
    run_dir = str(tmp_path / "run")
    fast = [
        "--hidden-sizes",
        "16",
        "--learning-starts",
        "100",
        "--batch-size",
        "16",
        "--buffer-size",
        "2000",
        "--updates-per-call",
        "4",
        "--eval-episodes",
        "1",
        "--eval-every",
        "100000",
    ]
    assert sac.cli(fast + ["--total-timesteps", "403", "--no-checkpoint-replay", "--run-dir", run_dir]) == 0
    _, arrays = sac.load_npz(run_dir, "checkpoint")
    assert int(arrays["train_state/sgd_steps"]) == 300  # 303 due, 3 pending
    assert sac.cli(["--resume", run_dir, "--total-timesteps", "800"]) == 0
    _, arrays = sac.load_npz(run_dir, "checkpoint")
    assert int(arrays["train_state/sgd_steps"]) == 300 + (800 - 503) // 4 * 4


def test_bc_runs_every_update_asked_for(tmp_path):
    """--total-updates not a multiple of --updates-per-call: the last call is shorter (before:
    the remainder was dropped, and a total below K ran no update at all)."""
    data = os.path.join(ROOT, "data", "pendulum-sac-expert.hdf5")
    fast = [
        "--dataset",
        data,
        "--hidden-sizes",
        "16",
        "--batch-size",
        "16",
        "--updates-per-call",
        "10",
        "--eval-episodes",
        "1",
        "--eval-every",
        "100000",
    ]
    for total in (7, 23):
        run_dir = str(tmp_path / f"run{total}")
        result = bc.main(bc.tyro.cli(bc.Args, args=fast + ["--total-updates", str(total), "--run-dir", run_dir]))
        assert result["updates"] == total
        assert int(bc.load_npz(run_dir, "checkpoint")[1]["train_state/sgd_steps"]) == total


def test_bc_first_prefetched_batches_use_the_scheduled_beta(tmp_path, monkeypatch):
    """The prefetch thread draws before the loop sets beta: it must see --per-beta0 (before:
    the replay's 0.4, whatever the flag said)."""
    seen = []
    real = bc.PrioritizedDataset.sample

    def spy(self, batch_size, num_batches=1):
        seen.append(self.beta)
        return real(self, batch_size, num_batches)

    monkeypatch.setattr(bc.PrioritizedDataset, "sample", spy)
    data = os.path.join(ROOT, "data", "pendulum-sac-expert.hdf5")
    assert (
        bc.cli(
            [
                "--dataset",
                data,
                "--hidden-sizes",
                "16",
                "--batch-size",
                "16",
                "--updates-per-call",
                "10",
                "--total-updates",
                "20",
                "--prioritized",
                "--per-beta0",
                "0.9",
                "--eval-episodes",
                "1",
                "--eval-every",
                "100000",
                "--run-dir",
                str(tmp_path / "run"),
            ]
        )
        == 0
    )
    assert seen and min(seen) >= 0.9


@pytest.mark.parametrize("script", ["dqn", "sac"])
def test_typed_flags_are_checked_with_the_runs_own(script, tmp_path, capsys):
    """Checked together after the merge: a run with --batch-size 16 may be resumed with
    --learning-starts 50 (the default batch of 128 is not the run's), and not with
    --batch-size 500 against its --learning-starts 100 (which would be written to args.json and
    refuse every later resume)."""
    module = MODULES[script]
    run = fake_run(tmp_path, module, batch_size=16, learning_starts=100)
    capsys.readouterr()
    assert module.cli(["--resume", run, "--batch-size", "500"]) == 2
    assert "--learning-starts 100 must be at least --batch-size 500" in capsys.readouterr().err
    assert module.cli(["--resume", run, "--learning-starts", "50"]) == 2  # accepted; then no checkpoint
    err = capsys.readouterr().err
    assert "no such file" in err and "batch" not in err
    with open(os.path.join(run, "args.json")) as f:
        assert json.load(f)["args"]["batch_size"] == 16  # a refused resume wrote nothing


def test_preset_cannot_change_on_resume(tmp_path):
    run = fake_run(tmp_path, dqn)
    with pytest.raises(dqn.ConfigError, match="--preset cannot change"):
        resumed(dqn, ["--preset", "atari", "--resume", run])


@pytest.mark.parametrize("script", list(MODULES))
def test_nan_flag_is_refused(script, capsys):
    flag = "--per-alpha"
    capsys.readouterr()
    assert MODULES[script].cli([flag, "nan"]) == 2
    assert "must be a finite number" in capsys.readouterr().err
