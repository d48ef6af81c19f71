"""Whole-script behaviour: checkpoints and resume, signals, the run folder, the evaluation tool,
bad input, imports."""

import csv
import json
import os
import signal
import subprocess
import sys
import time

import gymnasium as gym
import numpy as np
import pytest
from helpers import ROOT, import_in_fresh_process, load_script
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

dqn = load_script("dqn_prioritized")
SCRIPT = os.path.join(ROOT, "algos", "dqn_prioritized.py")
EVALUATE = os.path.join(ROOT, "tools", "dqn_evaluate.py")

# Small and fast: a few thousand steps of CartPole.
FAST = [
    "--hidden-sizes",
    "32",
    "32",
    "--learning-starts",
    "200",
    "--batch-size",
    "32",
    "--buffer-size",
    "5000",
    "--updates-per-call",
    "4",
    "--eval-episodes",
    "2",
    "--eval-every",
    "1000",
    "--log-every",
    "500",
]


def run_cli(argv):
    return dqn.cli(argv)


def read_eval(run_dir):
    with open(os.path.join(run_dir, "eval.csv")) as f:
        return list(csv.DictReader(f))


def evaluate_tool(*argv):
    return subprocess.run([sys.executable, EVALUATE, *argv], capture_output=True, text=True, timeout=300, cwd=ROOT)


def snapshot(folder):
    """Every path under folder with its bytes and modification time (a folder: None)."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(folder):
        for name in dirnames:
            out[os.path.relpath(os.path.join(dirpath, name), folder)] = None
        for name in filenames:
            path = os.path.join(dirpath, name)
            with open(path, "rb") as f:
                out[os.path.relpath(path, folder)] = (f.read(), os.stat(path).st_mtime_ns)
    return out


def one_line(capsys, *words):
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    for word in words:
        assert word in err, err
    return err


def test_import_starts_nothing():
    out = import_in_fresh_process("dqn_prioritized")
    assert out.returncode == 0 and "clean" in out.stdout, out.stderr


def test_checkpoint_round_trip_and_resume_continue_counters(tmp_path, capsys):
    run_dir = str(tmp_path / "run")
    assert run_cli(FAST + ["--total-timesteps", "2000", "--checkpoint-every", "1000", "--run-dir", run_dir]) == 0
    meta, arrays = dqn.load_npz(run_dir, "checkpoint")
    assert meta["global_step"] == 2000
    first_sgd = int(arrays["train_state/sgd_steps"])
    assert first_sgd == (2000 - 200) // 2 // 4 * 4  # replay ratio kept, in whole calls of 4
    stored = len(arrays["replay/priority"])
    assert stored > 1900  # n-step keeps at most n-1 per env pending
    assert os.path.isfile(os.path.join(run_dir, "model.npz"))

    # Restoring the saved train state into a fresh template gives back the same arrays.
    args = dqn.Args(hidden_sizes=(32, 32))
    net = dqn.QNetwork(2, args.hidden_sizes)
    template = dqn.init_train_state(net, dqn.make_optimizer(args, 10), (4,), dqn.jax.random.PRNGKey(9))
    restored = dqn.restore_tree(template, arrays, "train_state/", run_dir)
    for name, value in dqn.tree_arrays("train_state/", restored).items():
        np.testing.assert_array_equal(value, arrays[name])

    # Resume and extend to 3000 steps: counters continue, evaluation goes on from 2000, the line says so.
    capsys.readouterr()
    assert run_cli(["--resume", run_dir, "--total-timesteps", "3000"]) == 0
    assert "; any schedule over the budget ends at 3000 steps, not 2000" in capsys.readouterr().out
    meta2, arrays2 = dqn.load_npz(run_dir, "checkpoint")
    assert meta2["global_step"] == 3000
    assert int(arrays2["train_state/sgd_steps"]) == (3000 - 200) // 2 // 4 * 4
    assert meta2["episodes"] > meta["episodes"]
    steps = [int(r["step"]) for r in read_eval(run_dir)]
    assert steps == sorted(steps) and steps[-1] == 3000 and 2000 in steps
    with open(os.path.join(run_dir, "args.json")) as f:
        assert '"total_timesteps": 3000' in f.read()


def test_evaluation_tool_uses_the_runs_protocol(tmp_path):
    """tools/dqn_evaluate.py (was --eval-only --load): the run's --eval-epsilon unless given. The
    run goes into a folder that exists and is empty, which a fresh run accepts."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    assert run_cli(FAST + ["--total-timesteps", "600", "--eval-epsilon", "0.25", "--run-dir", str(run_dir)]) == 0
    out = evaluate_tool(str(run_dir / "model.npz"), "--episodes", "3")
    assert out.returncode == 0, out.stderr
    assert "over 3 episodes (epsilon 0.25)" in out.stdout  # the run's own protocol
    out = evaluate_tool(str(run_dir), "--episodes", "2", "--epsilon", "0.5")  # a run folder: its model.npz
    assert out.returncode == 0, out.stderr
    assert "over 2 episodes (epsilon 0.5)" in out.stdout  # unless given
    mean = float(out.stdout.split(":")[1].split("+-")[0])
    assert np.isfinite(mean) and mean >= 1  # a CartPole episode lasts at least one step


def test_sigterm_writes_checkpoint_and_resume_continues(tmp_path):
    run_dir = str(tmp_path / "run")
    proc = subprocess.Popen(
        [sys.executable, SCRIPT]
        + FAST
        + ["--total-timesteps", "1000000", "--checkpoint-every", "0", "--run-dir", run_dir],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=str(tmp_path),
    )
    deadline = time.time() + 120  # until the first evaluation's row (eval.csv has its header from the start)
    while time.time() < deadline and not (os.path.exists(os.path.join(run_dir, "eval.csv")) and read_eval(run_dir)):
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "Traceback" not in err and "--resume" in out
    stopped = dqn.load_npz(run_dir, "checkpoint")[0]["global_step"]
    assert 1000 <= stopped < 1_000_000
    assert run_cli(["--resume", run_dir, "--total-timesteps", str(stopped + 500)]) == 0
    assert dqn.load_npz(run_dir, "checkpoint")[0]["global_step"] == stopped + 500


# --- the run folder: a fresh run writes only into a new or empty one ----------------------------


@pytest.mark.parametrize("held", ["notes", "earlier-run"])
def test_fresh_run_refuses_a_folder_that_is_not_empty(held, tmp_path, capsys):
    """One line, exit 2, and nothing in the folder changed (before: the run wrote its args.json,
    events and checkpoints among the files there, and removed an earlier run's kept checkpoints)."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    if held == "notes":
        (run_dir / "notes.txt").write_text("mine\n")
    else:  # what an earlier run leaves: a fresh run must not mix its files with these
        (run_dir / "args.json").write_text('{"script": "dqn_prioritized", "args": {}}')
        (run_dir / "checkpoint.npz").write_bytes(b"an earlier run's checkpoint")
        (run_dir / "checkpoint-100.npz").write_bytes(b"an earlier run's kept checkpoint")
    before = snapshot(run_dir)
    capsys.readouterr()
    assert run_cli(FAST + ["--total-timesteps", "600", "--run-dir", str(run_dir)]) == 2
    one_line(capsys, "is not empty", "--resume")
    assert snapshot(run_dir) == before


# CleanRL's CartPole flags as issue 28 typed them, less its target period
CLEANRL = "--train-frequency 10 --learning-rate 2.5e-4 --buffer-size 10000 --learning-starts 10000".split()
CLEANRL += "--total-timesteps 200000 --batch-size 128 --exploration-fraction 0.5 --end-e 0.05".split()
PERIOD = "a target copy every {} SGD steps did not learn at CleanRL's CartPole settings (docs/dqn.md): give --huber"
FEW = "one SGD step per 10 env steps ({} in all) learned but fell back by the end at CleanRL's CartPole settings"


@pytest.mark.parametrize(
    "flags, warned",
    [
        # CleanRL's period, 500 env steps, in SGD steps: it diverged, and 19,000 SGD steps are too few
        (
            CLEANRL + ["--target-network-frequency", "50", "--no-prioritized", "--n-step", "1"],
            [PERIOD.format(50), FEW.format("19,000")],
        ),
        (
            CLEANRL + ["--target-network-frequency", "200", "--no-prioritized", "--n-step", "1"],
            [PERIOD.format(200), FEW.format("19,000")],
        ),
        (CLEANRL + ["--target-network-frequency", "50", "--huber-delta", "1e30"], []),  # its squared error held
        (CLEANRL + ["--target-network-frequency", "500"], [FEW.format("19,000")]),  # its line as typed fell back
        (CLEANRL + ["--target-network-frequency", "500", "--total-timesteps", "350000"], [FEW.format("34,000")]),
        (CLEANRL + ["--target-network-frequency", "500", "--total-timesteps", "360000"], []),  # 35,000 SGD steps
        (CLEANRL + ["--target-network-frequency", "500", "--train-frequency", "2"], []),  # held
        (CLEANRL + ["--target-network-frequency", "500", "--total-timesteps", "500000"], []),  # CleanRL's budget held
        ([], []),
        (
            ["--total-timesteps", "1063"],
            ["no SGD step in this run (learning starts at 1000): give --total-timesteps 1064"],
        ),
        (["--total-timesteps", "1064"], []),  # one call of 32 SGD steps
        (["--preset", "atari"], []),
        (["--preset", "minatar"], []),
    ],
)
def test_settings_that_did_not_hold_on_cartpole_are_one_warning_each_at_the_start(flags, warned, tmp_path, capsys):
    """At CleanRL's CartPole settings the Huber loss with a target copy every 50 SGD steps diverged here,
    in CleanRL's dqn_jax.py given the Huber loss, and in sbx; with a copy every 500 its 19,000 SGD steps
    learned but fell back by 200k steps (docs/dqn.md). One line each says what to change, before
    anything else can fail (here the run folder, which is not empty)."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "notes.txt").write_text("mine\n")
    capsys.readouterr()
    assert run_cli(flags + ["--run-dir", str(run_dir)]) == 2
    err = capsys.readouterr().err
    assert "is not empty" in err, err  # the flags were taken and the run got as far as its folder
    warnings = [line for line in err.splitlines() if line.startswith("warning:")]
    assert len(warnings) == len(warned) and all(w in line for w, line in zip(warned, warnings)), warnings
    assert all("): give --" in line for line in warnings), warnings  # each names a flag to change


def test_fresh_run_refuses_a_run_dir_that_is_a_file(tmp_path, capsys):
    path = tmp_path / "run"
    path.write_text("not a folder\n")
    capsys.readouterr()
    assert run_cli(FAST + ["--total-timesteps", "600", "--run-dir", str(path)]) == 2
    one_line(capsys, "is not a folder")
    assert path.read_text() == "not a folder\n" and os.listdir(tmp_path) == ["run"]


# --- bad input: one clear line, non-zero exit, no traceback ------------------------------------


class MatrixEnv(gym.Env):
    observation_space = gym.spaces.Box(-1.0, 1.0, (3, 3), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, seed=None, options=None):
        return self.observation_space.sample(), {}

    def step(self, action):
        return self.observation_space.sample(), 0.0, False, False, {}


gym.register("TestMatrixObs-v0", entry_point=MatrixEnv)


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--env-id", "Pendulum-v1"], "Discrete actions"),
        (["--env-id", "NoSuchEnv-v9"], "cannot make env"),
        (["--env-id", "TestMatrixObs-v0"], "this script takes vectors, uint8 images or bool planes"),
        (["--preset", "atari", "--adam-eps", "-1"], "--adam-eps should be greater than 0"),
        (["--batch-size", "512", "--buffer-size", "256"], "exceeds --buffer-size"),
        (["--buffer-size", "0"], "--buffer-size should be greater than or equal to 1"),
        (["--num-envs", "-1"], "--num-envs should be greater than or equal to 1"),
        (["--gamma", "1.5"], "--gamma should be less than or equal to 1"),
        (["--seed", str(2**31 - 1)], "--seed must be in"),
        (["--eval-episodes", "5000"], "--eval-episodes should be less than or equal to 1024"),
        (["--hidden-sizes", "100000"], "--hidden-sizes should be less than or equal to 65536"),
        (["--resume", "/nonexistent/run"], "no args.json"),
    ],
)
def test_bad_input_is_one_clear_line(argv, message, capsys):
    assert run_cli(argv) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1 and "Traceback" not in err


def test_bad_input_from_the_command_line_has_no_traceback():
    out = subprocess.run(
        [sys.executable, SCRIPT, "--env-id", "MountainCarContinuous-v0"], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 2
    assert "Traceback" not in out.stderr and "Discrete actions" in out.stderr


@pytest.mark.parametrize(
    "argv,message",
    [
        (["/nonexistent/model.npz"], "no such file"),
        (["/nonexistent/model.npz", "--episodes", "0"], "--episodes must be in"),
        (["/nonexistent/model.npz", "--epsilon", "2"], "--epsilon must be in"),
    ],
)
def test_evaluation_tool_bad_input_is_one_clear_line(argv, message):
    out = evaluate_tool(*argv)
    err = out.stderr.strip()
    assert out.returncode == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert message in err


def test_flags_from_a_file_get_the_checks_between_flags_too():
    """args_from_json is what the tools use on a model's flags (tools/dqn_evaluate.py): a seed the
    envs' int32 seeds cannot take, or a batch larger than the replay, is one ConfigError there too,
    not a traceback later (before: only train()'s own check refused them)."""
    for change, word in (({"seed": 10**30}, "--seed"), ({"batch_size": 512, "buffer_size": 256}, "exceeds")):
        with pytest.raises(dqn.ConfigError, match=word):
            dqn.args_from_json({**dqn.dataclasses.asdict(dqn.Args()), **change}, "model.npz")


def test_args_built_in_python_may_hold_numpy_scalars_and_paths(tmp_path):
    """train(Args(...), env_fn) is the documented way in: values a researcher computes with numpy,
    or a pathlib run folder, pass the checks as the Python numbers and strings they stand for."""
    args = dqn.Args(learning_rate=np.float32(5e-4), total_timesteps=np.int64(2000), run_dir=tmp_path / "run")
    checked = dqn.check_args(args)
    assert checked.learning_rate == pytest.approx(5e-4) and checked.total_timesteps == 2000
    assert checked.run_dir == str(tmp_path / "run")


def test_out_of_memory_is_one_line_that_says_so(monkeypatch, capsys):
    def no_memory(args):
        raise MemoryError()

    monkeypatch.setattr(dqn, "train", no_memory)
    assert dqn.cli([]) == 1
    err = capsys.readouterr().err.strip()
    assert "out of memory" in err and len(err.splitlines()) == 1


def test_runs_of_two_seeds_share_no_env_streams(tmp_path):
    """A vector env seeds env i with reset's seed + i, so resets seeded 1 and 2 would give runs of
    seeds 1 and 2 the same streams in all their envs but one (and a 10-episode evaluation 9 of its 10)."""
    seeded = {}  # run seed -> the seeds each env got, training's and the evaluation's

    def recording(seed):
        def env_fn(num_envs, video=None):
            envs = dqn.make_env("CartPole-v1", num_envs, video)
            reset = envs.reset

            def reset_recorded(seed=None, options=None):
                seeded[run_seed] |= {seed + i for i in range(num_envs)}
                return reset(seed=seed, options=options)

            envs.reset = reset_recorded
            return envs

        run_seed = seed
        seeded[seed] = set()
        return env_fn

    for seed in (1, 2):
        args = dqn.parse_args(FAST + ["--seed", str(seed), "--num-envs", "4", "--total-timesteps", "100"])
        dqn.train(dqn.dataclasses.replace(args, run_dir=str(tmp_path / str(seed))), recording(seed))
    assert len(seeded[1]) == len(seeded[2]) == 4 + 2  # 4 training envs, 2 evaluation episodes
    assert not seeded[1] & seeded[2]


def test_a_preset_run_folder_from_before_exploration_steps_resumes_with_its_fraction(tmp_path):
    """A --preset minatar folder written before --exploration-steps (its args.json has no such key)
    resumes end to end, its epsilon still decaying over its fraction of the budget, not the preset's 100k."""
    run_dir, fast = str(tmp_path / "run"), ["--learning-starts", "9000", "--eval-every", "9000", "--log-every", "500"]
    flags = ["--preset", "minatar", "--env-id", "MinAtar/Breakout-v1", "--total-timesteps", "1000", *fast]
    assert run_cli(flags + ["--exploration-fraction", "0.25", "--checkpoint-every", "1000", "--run-dir", run_dir]) == 0
    path = os.path.join(run_dir, "args.json")
    with open(path) as f:
        saved = json.load(f)
    del saved["args"]["exploration_steps"]
    saved["args"]["exploration_fraction"] = 0.25
    with open(path, "w") as f:
        json.dump(saved, f)
    assert run_cli(["--resume", run_dir, "--total-timesteps", "2000"]) == 0
    epsilon = {}
    for name in sorted(os.listdir(run_dir)):
        if name.startswith("events.out"):
            acc = EventAccumulator(os.path.join(run_dir, name), size_guidance={"scalars": 0})
            acc.Reload()
            epsilon.update({e.step: e.value for e in acc.Scalars("charts/epsilon")})
    assert max(epsilon) == 2000
    assert epsilon[2000] == pytest.approx(0.1)  # 0.25 of 2000 is past; the preset's 100k would give 0.98
