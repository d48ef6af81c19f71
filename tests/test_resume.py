"""Resume correctness (issue 12): flags typed on the command line win (also when set back to
their default), --preset does not overwrite a run's own flags; what to send where comes from the
command line only, a resume restores exactly what was saved, the resumed run goes on as the
unbroken one would have (DQN), and an evaluation a signal cut short is redone."""

import dataclasses
import json
import os
import shutil
import signal

import numpy as np
import optax
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
    return module.parse_args(argv)  # the run's flags as defaults, typed ones win


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


def test_dqn_code_resumes_through_parse_args(tmp_path):
    """Code resumes a run with train(parse_args([...])) (resolve_args and main(Args(resume=...))
    are gone): a flag typed as --flag=value wins, the others are the run's own."""
    run = fake_run(tmp_path, dqn, batch_size=64)
    args = dqn.parse_args(["--resume", run, "--total-timesteps=123456"])
    assert args.total_timesteps == 123_456 and args.batch_size == 64
    assert args.resume == run and args.run_dir == run  # writes into the run's own folder


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
        result = bc.train(bc.parse_args(fast + ["--total-updates", str(total), "--run-dir", run_dir]))
        assert result["updates"] == total
        assert int(bc.load_npz(run_dir, "checkpoint")[1]["train_state/sgd_steps"]) == total


def test_bc_first_prefetched_batches_use_the_scheduled_beta(tmp_path, monkeypatch):
    """The prefetch thread draws before the first call: it must see --per-beta0 (before: the replay's 0.4,
    whatever the flag said), which the learner's schedule now hands to each draw."""
    seen = []
    real = bc.PrioritizedDataset.sample

    def spy(self, batch_size, num_batches=1, beta=1.0):
        seen.append(beta)
        return real(self, batch_size, num_batches, beta)

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
    assert seen and min(seen) == pytest.approx(0.9) and max(seen) < 1.0  # the schedule's, not a default


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
    assert "--learning-starts must be at least --batch-size" in capsys.readouterr().err
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
    assert "finite number" in capsys.readouterr().err


# --- DQN: what a run folder may not decide -------------------------------------------------------


@pytest.mark.parametrize("script", list(MODULES))
def test_a_run_folder_does_not_choose_where_its_scalars_are_sent(script, tmp_path):
    """A folder's args.json (maybe someone else's) with track=true and its W&B names: the resume keeps its other
    flags and sends nothing; --track and the W&B names come from the command line only (then to the same run)."""
    module = MODULES[script]
    run = fake_run(tmp_path, module, track=True, wandb_entity="someone", wandb_project_name="theirs", batch_size=64)
    args = module.parse_args(["--resume", run])
    assert args.batch_size == 64 and not args.track and args.wandb_entity is None
    assert args.wandb_project_name == module.Args().wandb_project_name
    args = module.parse_args(["--resume", run, "--track", "--wandb-project-name", "mine"])
    assert args.track and args.wandb_project_name == "mine" and args.wandb_entity is None


def test_dqn_env_id_naming_a_module_needs_to_be_typed(tmp_path):
    """gymnasium imports the module of an id "module:Env": from args.json only when typed again."""
    run = fake_run(tmp_path, dqn, env_id="os:system")
    with pytest.raises(dqn.ConfigError, match="imports a module"):
        dqn.parse_args(["--resume", run])
    assert dqn.parse_args(["--resume", run, "--env-id", "os:system"]).env_id == "os:system"
    assert dqn.parse_args(["--resume", run, "--env-id", "CartPole-v1"]).env_id == "CartPole-v1"


def snapshot(folder):
    out = {}
    for name in sorted(os.listdir(folder)):
        path = os.path.join(folder, name)
        with open(path, "rb") as f:
            out[name] = (f.read(), os.stat(path).st_mtime_ns)
    return out


def test_dqn_refused_resume_leaves_the_folder_as_it_was(tmp_path, capsys):
    """Flags accepted, then no checkpoint to continue from: exit 2, and the run folder (its
    args.json included) is as it was: a refused resume writes nothing."""
    run = fake_run(tmp_path, dqn, batch_size=16, learning_starts=100)
    before = snapshot(run)
    capsys.readouterr()
    assert dqn.cli(["--resume", run, "--learning-starts", "50", "--total-timesteps", "5000"]) == 2
    assert "no such file" in capsys.readouterr().err
    assert snapshot(run) == before


# --- DQN: a resume restores what was saved, and goes on as the unbroken run ----------------------

DQN_RUN = (
    "--hidden-sizes 16 --learning-starts 200 --batch-size 32 --buffer-size 5000 --updates-per-call 4 "
    "--train-frequency 2 --eval-episodes 1 --eval-every 1000 --log-every 500 --checkpoint-every 0 "
    "--total-timesteps 3000"
).split()
STOP_AT = 1000  # the first evaluation


def stop_after_first_evaluation(monkeypatch):
    """The run stops after its first evaluation as on SIGTERM (the loop's stop list gets a
    signal number), at a step known in advance."""
    real = dqn.evaluate

    def evaluate(*a, **kw):
        returns = real(*a, **kw)
        stop = a[7] if len(a) > 7 else kw.get("stop")
        stop.append(15)
        return returns

    monkeypatch.setattr(dqn, "evaluate", evaluate)


def record_schedules(monkeypatch):
    """Every value of epsilon's and beta's schedules that train() asks for, in order, and the
    SGD-step totals the optimiser's learning-rate schedule is built for."""
    calls, totals = [], []
    real_schedule, real_optimizer = dqn.linear_schedule, dqn.make_optimizer

    def linear_schedule(start, end, duration, t):
        value = real_schedule(start, end, duration, t)
        calls.append((start, end, duration, t, value))
        return value

    def make_optimizer(args, total_sgd_steps):
        totals.append(total_sgd_steps)
        return real_optimizer(args, total_sgd_steps)

    monkeypatch.setattr(dqn, "linear_schedule", linear_schedule)
    monkeypatch.setattr(dqn, "make_optimizer", make_optimizer)
    return calls, totals


@pytest.fixture(scope="module")
def stopped(tmp_path_factory):
    """A DQN run of 3000 steps stopped at step 1000: (its folder, the schedule calls it made)."""
    run_dir = str(tmp_path_factory.mktemp("stopped") / "run")
    with pytest.MonkeyPatch.context() as mp:
        stop_after_first_evaluation(mp)
        calls, totals = record_schedules(mp)
        result = dqn.train(dqn.parse_args(DQN_RUN + ["--run-dir", run_dir]))
    assert result["signal"] == 15 and result["global_step"] == STOP_AT
    return run_dir, calls, totals


def assert_same_arrays(got: dict, want: dict):
    assert sorted(got) == sorted(want)
    for name in want:
        assert got[name].dtype == want[name].dtype, name
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)


def assert_cpprb_holds(buffer, arrays: dict, args):
    """cpprb's own state, the part sampling uses: rows stored, next insert slot, max priority,
    and each slot's priority, read back through importance weights: with beta = 1 cpprb gives
    w_i = min_j v_j / v_i, v = (p + eps)^alpha, so a slot whose priority was not restored shows."""
    priority = arrays["replay/priority"]
    stored = len(priority)
    assert buffer.get_stored_size() == stored
    assert buffer.get_next_index() == int(arrays["replay/next_index"])
    np.testing.assert_allclose(buffer.get_max_priority(), arrays["replay/max_priority"], rtol=1e-6)
    assert len(np.unique(priority)) > stored // 2  # the run's updates made the priorities differ
    draw = buffer.sample(20 * stored, beta=1.0)
    slots = draw["indexes"].astype(np.int64).ravel()
    assert slots.max() < stored and len(np.unique(slots)) > stored // 2
    v = (priority + args.per_eps) ** args.per_alpha
    np.testing.assert_allclose(draw["weights"].ravel(), v.min() / v[slots], rtol=1e-4)
    # and the rows at those slots are the saved ones
    np.testing.assert_array_equal(draw["obs"], arrays["replay/obs"][slots])
    np.testing.assert_array_equal(draw["action"].ravel(), arrays["replay/action"][slots].ravel())


def test_dqn_resume_restores_the_saved_state_leaf_by_leaf(stopped):
    """Built as train() builds it on --resume: the train state (params, target, optimiser state,
    SGD steps), the replay's rows, priorities, next index and max priority come back as
    saved, in our arrays and in cpprb; the counters and the schedules at the resumed step are the
    saved run's."""
    run_dir, _, _ = stopped
    ckpt = os.path.join(run_dir, "checkpoint.npz")
    meta, arrays = dqn.load_npz(ckpt, "checkpoint")
    args = dqn.parse_args(["--resume", run_dir])
    saved = dqn.args_from_json(meta["args"], ckpt)
    assert args == dataclasses.replace(saved, resume=run_dir, run_dir=run_dir)
    assert meta["global_step"] == STOP_AT and meta["episodes"] > 0

    envs = dqn.make_env(args.env_id, args.num_envs)
    num_actions, space = int(envs.single_action_space.n), envs.single_observation_space
    envs.close()
    network = dqn.QNetwork(num_actions, args.hidden_sizes, planes=dqn.is_planes(space))
    total_sgd = max(0, args.total_timesteps - args.learning_starts) // args.train_frequency
    optimizer = dqn.make_optimizer(args, total_sgd)
    template = dqn.init_train_state(network, optimizer, space.shape, dqn.jax.random.PRNGKey(12345))
    state = dqn.restore_tree(template, arrays, "train_state/", ckpt)
    saved_state = {k: v for k, v in arrays.items() if k.startswith("train_state/")}
    assert_same_arrays(dqn.tree_arrays("train_state/", state), saved_state)
    for part in ("params", "target_params", "opt_state", "sgd_steps"):
        assert any(k.startswith(f"train_state/{part}") for k in saved_state), part

    replay, _ = dqn.make_replay(args, space)
    replay.load_state_dict(arrays, ckpt, num_actions)
    assert_same_arrays(replay.state_dict(), {k: v for k, v in arrays.items() if k.startswith("replay/")})
    assert_cpprb_holds(replay.buffer, arrays, args)

    # The schedules at the resumed step: epsilon and beta from the step, the learning rate from
    # the optimiser's own count, which is the SGD step count (Adam's bias correction too).
    sgd = int(arrays["train_state/sgd_steps"])
    assert sgd == (STOP_AT - args.learning_starts) // args.train_frequency // 4 * 4
    counts = [v for k, v in dqn.tree_arrays("train_state/opt_state/", state.opt_state).items() if k.endswith("count")]
    assert len(counts) == 2 and all(int(c) == sgd for c in counts)
    step = meta["global_step"]
    for a in (args, saved):  # the same values, computed from the resumed and the saved flags
        epsilon = dqn.linear_schedule(a.start_e, a.end_e, a.exploration_fraction * a.total_timesteps, step)
        beta = dqn.linear_schedule(a.per_beta0, 1.0, a.total_timesteps, step)
        lr = optax.linear_schedule(a.learning_rate, 0.0, total_sgd)(sgd)
        # epsilon reached --end-e at step 600; beta is 1/3 of its way from 0.4 to 1; the default rate 5e-4
        assert (epsilon, beta, float(lr)) == pytest.approx((0.05, 0.6, 5e-4 * (1 - sgd / total_sgd)))


def test_dqn_resumed_run_writes_back_the_same_checkpoint(stopped, tmp_path, monkeypatch):
    """Through train(): a resume with nothing left to run checkpoints what it restored, and that
    file equals the one it resumed from, array by array; cpprb holds the saved replay."""
    run_dir = shutil.copytree(stopped[0], tmp_path / "run")
    before_meta, before = dqn.load_npz(str(run_dir), "checkpoint")
    replays = []
    real_make_replay = dqn.make_replay

    def make_replay(args, space, *rest):
        replay, nstep = real_make_replay(args, space, *rest)
        replays.append(replay)
        return replay, nstep

    monkeypatch.setattr(dqn, "make_replay", make_replay)
    result = dqn.train(dqn.parse_args(["--resume", str(run_dir), "--total-timesteps", str(STOP_AT)]))
    assert result["global_step"] == STOP_AT and result["sgd_steps"] == int(before["train_state/sgd_steps"])
    meta, after = dqn.load_npz(str(run_dir), "checkpoint")
    assert (meta["global_step"], meta["episodes"]) == (before_meta["global_step"], before_meta["episodes"])
    assert_same_arrays(after, before)
    assert len(replays) == 1
    assert_cpprb_holds(replays[0].buffer, before, dqn.args_from_json(before_meta["args"], "meta"))


def test_dqn_resumed_run_goes_on_as_the_unbroken_one(stopped, tmp_path, monkeypatch):
    """Stopped at 1000 and resumed to 3000, against the same run not stopped: the same epsilon and
    beta at every step, asked for in the same order (so the SGD calls fall on the same steps),
    the same learning-rate schedule, the same counters at the end, and the optimiser's count
    went on from the saved one."""
    run_dir = str(shutil.copytree(stopped[0], tmp_path / "run"))
    calls, totals = record_schedules(monkeypatch)
    reference = dqn.train(dqn.parse_args(DQN_RUN + ["--run-dir", str(tmp_path / "unbroken")]))
    unbroken_calls, unbroken_totals = list(calls), list(totals)
    calls.clear()
    totals.clear()
    resumed_run = dqn.train(dqn.parse_args(["--resume", run_dir]))
    _, first_calls, first_totals = stopped
    assert first_calls[-1][3] <= STOP_AT and calls[0][3] == STOP_AT  # epsilon at the resumed step first
    # The loop chooses each step's actions ahead, before it stores the step before: the stopped run asked for
    # epsilon at STOP_AT too, for actions its envs never took, and the resumed run asks for it anew.
    assert STOP_AT in [c[3] for c in first_calls if c[:3] == calls[0][:3]]
    assert first_calls + calls[1:] == unbroken_calls
    assert first_totals == totals == unbroken_totals
    assert resumed_run["global_step"] == reference["global_step"] == 3000
    assert resumed_run["sgd_steps"] == reference["sgd_steps"] == (3000 - 200) // 2 // 4 * 4
    _, arrays = dqn.load_npz(run_dir, "checkpoint")
    counts = [v for k, v in arrays.items() if k.startswith("train_state/opt_state/") and k.endswith("count")]
    assert len(counts) == 2 and all(int(c) == reference["sgd_steps"] for c in counts)
    with open(os.path.join(run_dir, "eval.csv")) as f:
        resumed_evals = [line.split(",")[0] for line in f.read().splitlines()[1:]]
    with open(os.path.join(tmp_path / "unbroken", "eval.csv")) as f:
        unbroken_evals = [line.split(",")[0] for line in f.read().splitlines()[1:]]
    assert resumed_evals == unbroken_evals == ["1000", "2000", "3000"]


SMALL_RUNS = {
    "dqn": (
        "--hidden-sizes 16 --learning-starts 200 --batch-size 32 --buffer-size 5000 --updates-per-call 4 "
        "--eval-episodes 2 --eval-every 1000 --total-timesteps 2000"
    ).split(),
    "sac": (
        "--hidden-sizes 16 --learning-starts 256 --batch-size 64 --buffer-size 5000 --updates-per-call 4 "
        "--eval-episodes 2 --eval-every 300 --total-timesteps 600"
    ).split(),
    "bc": (
        "--hidden-sizes 16 --batch-size 64 --updates-per-call 10 --eval-episodes 2 --eval-every 100 --total-updates 200"
    ).split(),
}


@pytest.mark.parametrize("times, old_name", [(1, False), (2, False), (1, True)])
@pytest.mark.parametrize("script", list(MODULES))
def test_an_evaluation_a_signal_cuts_short_is_redone_on_resume(script, times, old_name, tmp_path, monkeypatch):
    """SIGTERM during the evaluation midway: the run checkpoints at once, and the resumed run
    evaluates that step first, so eval.csv has every row (before: the row was lost for good).
    Twice: GNU timeout sends SIGTERM to the run and then to its process group; the second is not
    a second Ctrl-C (before: it interrupted the run before its checkpoint). old_name: the
    checkpoint says so as f6a5972's did ("eval_missed"), and still resumes so."""
    module, real, calls = MODULES[script], MODULES[script].evaluate, []

    def signalled(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:  # the first evaluation of the run, midway
            for _ in range(times):
                os.kill(os.getpid(), signal.SIGTERM)  # the handler train() set takes it
        return real(*args, **kwargs)

    monkeypatch.setattr(module, "evaluate", signalled)
    run_dir = str(tmp_path / "run")
    result = module.train(module.parse_args(SMALL_RUNS[script] + ["--run-dir", run_dir]))
    assert result.get("signal") == signal.SIGTERM
    if old_name:
        path = os.path.join(run_dir, "checkpoint.npz")
        meta, arrays = module.load_npz(path, "checkpoint")
        meta["eval_missed"] = meta.pop("cut_short")
        module.save_npz(path, meta, arrays)
    monkeypatch.setattr(module, "evaluate", real)
    module.train(module.parse_args(["--resume", run_dir]))
    with open(os.path.join(run_dir, "eval.csv")) as f:
        steps = [int(row.split(",")[0]) for row in f.read().splitlines()[1:]]
    every = int(SMALL_RUNS[script][SMALL_RUNS[script].index("--eval-every") + 1])
    assert steps == [every, 2 * every], steps
