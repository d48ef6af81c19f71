"""What CleanRL users reach for: --capture-video, the progress bar (tqdm), curve.png (tools/plot_run.py)
and Weights & Biases (--track, live; tools/wandb_upload.py after), in the scripts; an evaluation of a saved model is
tools/<script>_evaluate.py's."""

import csv
import functools
import glob
import io
import json
import os
import re
import signal
import subprocess
import sys
import time
import types

import imageio.v3 as iio
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import ROOT, load_script, load_tool

dqn = load_script("dqn_prioritized")
sac = load_script("sac")
bc = load_script("bc_offline")

# The FAST flags of tests/test_dqn_run.py, test_sac.py and test_bc.py, and a length that gives
# one evaluation inside the loop plus the final one.
RUNS = {
    "dqn": (
        dqn,
        [
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
            "--total-timesteps",
            "2000",
        ],
        ["eval-step-1000-episode-0.mp4", "final-step-2000-episode-0.mp4"],
        "final eval at step",
    ),
    "sac": (
        sac,
        [
            "--hidden-sizes",
            "32",
            "32",
            "--learning-starts",
            "256",
            "--batch-size",
            "64",
            "--buffer-size",
            "5000",
            "--updates-per-call",
            "4",
            "--eval-episodes",
            "2",
            "--eval-every",
            "500",
            "--log-every",
            "250",
            "--total-timesteps",
            "600",
        ],
        ["eval-step-500-episode-0.mp4", "final-step-600-episode-0.mp4"],
        "final eval at step",
    ),
    "bc": (
        bc,
        [
            "--hidden-sizes",
            "32",
            "32",
            "--batch-size",
            "64",
            "--updates-per-call",
            "10",
            "--eval-episodes",
            "2",
            "--eval-every",
            "100",
            "--log-every",
            "100",
            "--total-updates",
            "200",
        ],
        ["eval-update-100-episode-0.mp4", "final-update-200-episode-0.mp4"],
        "final eval after",
    ),
}


class Terminal(io.StringIO):
    def isatty(self):
        return True


def plot_run(run_dir):
    """tools/plot_run.py RUN_DIR, as a user runs it."""
    return subprocess.run(
        [sys.executable, os.path.join(ROOT, "tools", "plot_run.py"), run_dir],
        capture_output=True,
        text=True,
        timeout=300,
    )


def video_frames(path):
    return list(iio.imiter(path, plugin="FFMPEG"))


def read_eval(run_dir):
    with open(os.path.join(run_dir, "eval.csv"), newline="") as f:
        return {int(r["step"]): float(r["mean"]) for r in csv.DictReader(f)}


class StandInWandb(types.ModuleType):
    """wandb's API as the scripts call it with --track, recording the calls."""

    def __init__(self, refuse=None):
        super().__init__("wandb")
        self.calls, self.refuse = {"log": [], "finished": 0, "exit_codes": []}, refuse
        self.Video = lambda path, format: types.SimpleNamespace(path=path, format=format)
        self.Settings = dict
        self.errors = types.SimpleNamespace(Error=type("Error", (Exception,), {}))

    def init(self, **kwargs):
        self.calls["init"] = kwargs
        if self.refuse:
            raise self.errors.Error(self.refuse)
        return self

    def define_metric(self, name, step_metric):
        self.calls["metric"] = (name, step_metric)

    def log(self, row):
        self.calls["log"].append(row)

    def finish(self, exit_code=None):
        self.calls["finished"] += 1
        self.calls["exit_codes"].append(exit_code)


def tensorboard_scalars(run_dir, wall_time=False):
    """[(step, tag, value)] (with wall_time: [(step, tag, wall time)]) of the run folder's event files, in order."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
    from tensorboard.util.tensor_util import make_ndarray

    rows = []
    for path in sorted(glob.glob(os.path.join(run_dir, "events.out.tfevents.*"))):
        for event in EventFileLoader(path).Load():
            for v in event.summary.value:
                rows.append((event.step, v.tag, event.wall_time if wall_time else make_ndarray(v.tensor).item()))
    return rows


def wandb_history(path):
    """The history rows of an offline W&B run file: leveldb-log records (blocks of 32 KiB, a 7-byte header
    each: CRC, length, kind) of wandb's protobuf Record, after the file's 7-byte header."""
    from wandb.proto import wandb_internal_pb2

    with open(path, "rb") as f:
        data = f.read()
    assert data[:4] == b":W&B", data[:8]
    rows, pos, part = [], 7, b""
    while pos + 7 <= len(data):
        if 32768 - pos % 32768 < 7:  # a block's tail too short for a header is padding
            pos += 32768 - pos % 32768
            continue
        length, kind = int.from_bytes(data[pos + 4 : pos + 6], "little"), data[pos + 6]
        part, pos = part + data[pos + 7 : pos + 7 + length], pos + 7 + length
        if kind in (1, 4):  # a whole record, or its last piece
            record = wandb_internal_pb2.Record()
            record.ParseFromString(part)
            part = b""
            if record.WhichOneof("record_type") == "history":
                rows.append({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item})
    return rows


def test_a_cartpole_evaluation_is_filmed_frame_by_frame(tmp_path):
    """RecordVideo films the reset frame and one frame per step of the first episode of sub-env 0;
    CartPole's return is its length. (Uniformly random actions: an episode of 15-206 steps, which the
    test checks first: moviepy 2.x drops the last frame of a clip where n times 1/fps sums to under
    n/fps, Zulko/moviepy#2507: at CartPole's 50 fps for 11-14 frames and most counts from 207 on.)"""
    net = dqn.QNetwork(2, (32, 32))
    params = net.init(jax.random.PRNGKey(0), jnp.zeros((1, 4)))
    folder = str(tmp_path / "videos")
    env_fn = functools.partial(dqn.make_env, "CartPole-v1")
    returns = dqn.evaluate(dqn.make_act(net.apply, 2), params, env_fn, 2, 1.0, 2, video=(folder, "eval-step-7"))
    assert os.listdir(folder) == ["eval-step-7-episode-0.mp4"]  # one episode of one sub-env
    frames = video_frames(os.path.join(folder, "eval-step-7-episode-0.mp4"))
    assert 15 <= returns[0] <= 206, returns  # the premise: a length moviepy films whole
    assert len(frames) == returns[0] + 1
    assert frames[0].shape == (400, 600, 3)  # CartPole's render size
    assert 0 < frames[0].mean() < 255  # a picture, not a blank frame


@pytest.mark.parametrize("name", list(RUNS))
def test_capture_video_curve_and_progress_line_on_a_terminal(name, tmp_path, monkeypatch):
    module, fast, videos, final = RUNS[name]
    run_dir = str(tmp_path / "run")
    terminal = Terminal()
    monkeypatch.setattr(sys, "stdout", terminal)
    monkeypatch.setattr(sys, "stderr", terminal)  # tqdm writes to stderr: one terminal shows both streams
    wandb = StandInWandb()
    monkeypatch.setitem(sys.modules, "wandb", wandb)
    assert module.cli(fast + ["--capture-video", "--track", "--wandb-entity", "me", "--run-dir", run_dir]) == 0
    monkeypatch.undo()
    # --track: W&B got each scalar tensorboard got, at its step, as it was written, and each film at its step.
    init, rows = wandb.calls["init"], wandb.calls["log"]
    assert (init["project"], init["entity"], init["name"], init["id"]) == ("cleanRL", "me", "run", "run")
    assert init["resume"] == "never" and init["config"]["capture_video"] and "dir" not in init  # a new run: new
    assert init["reinit"] == "create_new" and wandb.calls["exit_codes"] == [0]  # a W&B run the caller has open stays
    assert init["settings"] == {"x_transaction_log_flush_interval": 0.25}
    assert wandb.calls["metric"] == ("*", "global_step") and wandb.calls["finished"] == 1
    logged = [
        (row["global_step"], tag, v)
        for row in rows
        for tag, v in row.items()
        if tag not in ("global_step", "videos/eval")
    ]
    assert logged == [(s, t, pytest.approx(v)) for s, t, v in tensorboard_scalars(run_dir)]
    films = [(row["global_step"], os.path.basename(row["videos/eval"].path)) for row in rows if "videos/eval" in row]
    assert films == [(int(re.search(r"-(\d+)-episode", v).group(1)), v) for v in videos]
    # One video per evaluation plus the final one, each a readable MP4 of the env's frames.
    assert sorted(os.listdir(os.path.join(run_dir, "videos"))) == videos
    render_size = (400, 600, 3) if name == "dqn" else (500, 500, 3)  # CartPole, Pendulum
    for video in videos:
        frames = video_frames(os.path.join(run_dir, "videos", video))
        assert len(frames) > 5 and frames[0].shape == render_size
    out = terminal.getvalue()
    # tqdm's bar rewrites itself in place: steps done of the total, and the plain line's fields as
    # its postfix; the plain line itself is not printed on a terminal.
    total, unit, fields = {
        "dqn": ("2000", "step", r", SPS +\d+  loss \S+  episodes \d+  eval \S+$"),
        "sac": ("600", "step", r", SPS +\d+  qf_loss \S+  alpha \S+  episodes \d+  eval \S+$"),
        "bc": ("200", "update", r", updates/s +\d+  loss \S+  eval "),
    }[name]
    bars = list(re.finditer(r"\r *(\d+)%\|[^|\r\n]*\| (\d+)/" + total + r" \[([^\]\r\n]*)\]", out))
    assert len(bars) > 1 and bars[-1].group(1, 2) == ("100", total), out
    assert re.search(fields, bars[-1].group(3)), out
    assert not re.search(f"^{unit} +\\d+", out, re.M), out
    # The bar is ended (its last draw closed by a newline) before the final message, which starts a
    # line of its own, and is not drawn again under it.
    final_at = out.index(final)
    # (tqdm pads a draw shorter than the one before with spaces)
    assert out[bars[-1].end() : final_at].strip(" ") == "\n", out
    assert out[final_at - 1] == "\n", out
    # curve.png is tools/plot_run.py's, not the run's.
    assert not os.path.exists(os.path.join(run_dir, "curve.png"))
    plotted = plot_run(run_dir)
    assert plotted.returncode == 0, plotted.stderr[-2000:]
    assert plotted.stdout.strip() == os.path.join(run_dir, "curve.png")
    # curve.png is an image.
    import matplotlib.image

    picture = matplotlib.image.imread(os.path.join(run_dir, "curve.png"))
    assert picture.ndim == 3 and picture.shape[0] > 100 and picture.shape[1] > 100


def test_plain_log_without_matplotlib_no_curve_and_an_evaluation_filmed_by_the_tool(tmp_path, monkeypatch, capsys):
    """Off a terminal (here: pytest's captured streams) the plain line, every 10th log tick and at
    the end, and no bar; the run needs no matplotlib and writes no curve.png; tools/dqn_evaluate.py
    RUN --capture-video films into videos/ beside the model."""
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    module, fast, _, _ = RUNS["dqn"]
    run_dir = str(tmp_path / "run")
    assert module.cli(fast + ["--run-dir", run_dir]) == 0
    captured = capsys.readouterr()
    assert "\r" not in captured.out and "\x1b" not in captured.out
    assert "\r" not in captured.err and "/2000 [" not in captured.err, captured.err  # no tqdm bar
    assert re.search(r"^step     2000  SPS +\d+  loss \S+  episodes \d+  eval \S+$", captured.out, re.M), captured.out
    assert os.path.isfile(os.path.join(run_dir, "model.npz"))
    assert not os.path.exists(os.path.join(run_dir, "curve.png"))
    assert not glob.glob(os.path.join(run_dir, "*.tmp.*"))
    evaluate = load_tool("dqn_evaluate")
    assert evaluate.main([run_dir, "--episodes", "2", "--capture-video"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^eval CartPole-v1: \S+ \+- \S+ over 2 episodes", out, re.M), out
    assert os.listdir(os.path.join(run_dir, "videos")) == ["eval-episode-0.mp4"]
    frames = video_frames(os.path.join(run_dir, "videos", "eval-episode-0.mp4"))
    assert len(frames) > 5 and frames[0].shape == (400, 600, 3)


def refused(name, flag, tmp_path, capsys):
    """(stderr, run folder) of the script's cli() given `flag`, which must exit 2 with one line."""
    module, fast, _, _ = RUNS[name]
    run_dir = tmp_path / "run"
    assert module.cli(fast + [flag, "--run-dir", str(run_dir)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and flag in err, err
    return err, run_dir


@pytest.mark.parametrize("name", list(RUNS))
def test_capture_video_without_moviepy_is_one_line_before_training(name, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "moviepy", None)
    err, run_dir = refused(name, "--capture-video", tmp_path, capsys)
    assert "pip install moviepy" in err, err
    module = RUNS[name][0]
    assert not run_dir.exists()  # refused before anything ran
    # A saved run's flags do not ask for the packages (a model for --eval-only, or for DQN's tools/dqn_evaluate.py).
    args = module.args_from_json({"capture_video": True, "track": True, "wandb_entity": "me"}, "model.npz")
    assert args.capture_video and args.track and args.wandb_entity == "me"


@pytest.mark.parametrize("name", list(RUNS))
def test_track_refused_by_wandb_is_one_line_and_leaves_the_folder_empty(name, tmp_path, monkeypatch, capsys):
    """Not logged in, no such entity, the id taken: wandb.init's error in one line, exit 2, before anything is
    written, so the same --run-dir can be given again."""
    monkeypatch.setitem(sys.modules, "wandb", StandInWandb(refuse="api_key not configured (no-tty)\ncall wandb.login"))
    err, run_dir = refused(name, "--track", tmp_path, capsys)
    assert "--track: api_key not configured" in err, err
    assert not run_dir.exists() or not os.listdir(run_dir)


def test_a_track_run_that_fails_shows_as_failed_in_wandb(tmp_path, monkeypatch):
    """An error in the loop (here the env's) finishes the W&B run with exit code 1."""
    wandb = StandInWandb()
    monkeypatch.setitem(sys.modules, "wandb", wandb)

    class Broken(dqn.gym.vector.VectorWrapper):
        def step(self, actions):
            raise RuntimeError("the env broke")

    args = dqn.parse_args(RUNS["dqn"][1] + ["--track", "--run-dir", str(tmp_path / "run")])
    with pytest.raises(RuntimeError, match="the env broke"):
        dqn.train(args, lambda n, video=None: Broken(dqn.make_env("CartPole-v1", n)))
    assert wandb.calls["exit_codes"] == [1]


@pytest.mark.parametrize("name", list(RUNS))
def test_track_without_wandb_is_one_line_before_training(name, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "wandb", None)
    err, run_dir = refused(name, "--track", tmp_path, capsys)
    assert "pip install wandb" in err, err
    assert not run_dir.exists()


def test_wandb_upload_sends_the_scalars_flags_and_videos(tmp_path, monkeypatch):
    """The scripts write no W&B: tools/wandb_upload.py RUN_DIR sends what a run wrote. What it hands wandb's API is
    read off a stand-in module; then wandb itself takes the same calls in offline mode."""
    module, fast, _, _ = RUNS["dqn"]
    run_dir = str(tmp_path / "CartPole-v1__dqn__1__123")
    assert module.cli(fast + ["--capture-video", "--run-dir", run_dir]) == 0
    calls = {"log": []}

    class Run:
        def define_metric(self, name, step_metric):
            calls["metric"] = (name, step_metric)

        def log(self, row):
            calls["log"].append(row)

        def finish(self):
            calls["finished"] = True

    class Video:
        def __init__(self, path, format):
            self.path, self.format = path, format

    stand_in = types.SimpleNamespace(init=lambda **kwargs: calls.update(init=kwargs) or Run(), Video=Video)
    upload = load_tool("wandb_upload").upload
    with monkeypatch.context() as patch:
        patch.setitem(sys.modules, "wandb", stand_in)
        assert upload(run_dir, "test-project", "me") == "CartPole-v1__dqn__1__123"
    init, rows = calls["init"], calls["log"]
    assert (init["project"], init["entity"], init["id"], init["name"]) == (
        "test-project",
        "me",
        "CartPole-v1__dqn__1__123",  # the run folder's name
        "CartPole-v1__dqn__1__123",
    )
    for flag, value in {"env_id": "CartPole-v1", "total_timesteps": 2000, "capture_video": True}.items():
        assert init["config"][flag] == value, flag  # the flags are the run's config
    assert calls["metric"] == ("*", "global_step") and calls["finished"]
    steps = [row["global_step"] for row in rows]
    assert steps == sorted(set(steps))  # one row per step, in order
    # The evaluations logged are eval.csv's, at the same global steps; the training scalars too.
    logged = {row["global_step"]: row["eval/episodic_return"] for row in rows if "eval/episodic_return" in row}
    expected = read_eval(run_dir)
    assert sorted(logged) == sorted(expected) == [1000, 2000]
    for step, mean in expected.items():
        assert logged[step] == pytest.approx(mean, abs=1e-4)
    assert any("charts/episodic_return" in row for row in rows) and any("losses/td_loss" in row for row in rows)
    videos = {row["global_step"]: row["videos/eval"] for row in rows if "videos/eval" in row}
    assert sorted(videos) == [1000, 2000] and all(v.format == "mp4" and os.path.isfile(v.path) for v in videos.values())
    # wandb itself, offline, takes those calls and writes its run file into the folder.
    for name, value in {
        "WANDB_MODE": "offline",
        "WANDB_SILENT": "true",
        "WANDB_DIR": str(tmp_path / "wandb"),
        "WANDB_CONFIG_DIR": str(tmp_path / "wandb-config"),
        "WANDB_CACHE_DIR": str(tmp_path / "wandb-cache"),
        "WANDB_DATA_DIR": str(tmp_path / "wandb-data"),
    }.items():
        monkeypatch.setenv(name, value)
    assert upload(run_dir, "test-project") == "CartPole-v1__dqn__1__123"
    files = glob.glob(str(tmp_path / "wandb" / "wandb" / "offline-run-*" / "run-CartPole-v1__dqn__1__123.wandb"))
    assert len(files) == 1 and os.path.getsize(files[0]) > 0, os.listdir(tmp_path / "wandb")
    assert "wandb" not in os.listdir(run_dir)  # wandb's files (and its latest-run symlink) stay out of the run folder


def test_track_streams_to_wandb_while_the_run_runs_and_a_resume_continues_the_same_run(tmp_path):
    """DQN with --capture-video --track, W&B offline, killed by SIGKILL mid-run: the W&B run already holds every
    charts/SPS tick tensorboard got half a second (two of wandb's file flushes) before the kill, none out of order;
    --resume continues the same W&B run (the folder's name its id) to the end, with its films."""
    env = dict(os.environ, WANDB_MODE="offline", WANDB_SILENT="true")
    env.pop("WANDB_SERVICE", None)  # this process's wandb service, if a test started one, is not the runs'
    env.update(
        {f"WANDB_{k}_DIR" if k else "WANDB_DIR": str(tmp_path / f"w{k}") for k in ("", "CONFIG", "CACHE", "DATA")}
    )
    run_dir = str(tmp_path / "CartPole-v1__dqn__1__456")
    _, fast, _, _ = RUNS["dqn"]
    script = [sys.executable, os.path.join(ROOT, "algos", "dqn_prioritized.py"), *fast, "--capture-video", "--track"]
    long = ["--total-timesteps", "1000000", "--checkpoint-every", "1000", "--eval-every", "1000000"]
    run = subprocess.Popen([*script, *long, "--run-dir", run_dir], env=env, stdout=subprocess.DEVNULL)

    def ticks():  # (step, wall time) of each charts/SPS tensorboard got
        found = tensorboard_scalars(run_dir, wall_time=True) if os.path.isdir(run_dir) else []
        return [(step, wall) for step, tag, wall in found if tag == "charts/SPS"]

    deadline = time.time() + 240
    while time.time() < deadline and run.poll() is None:
        if len(ticks()) >= 4 and os.path.exists(os.path.join(run_dir, "checkpoint.npz")):
            break
        time.sleep(0.2)
    time.sleep(1.0)  # mid-run
    killed_at = time.time()
    run.kill()
    assert run.wait(timeout=60) == -signal.SIGKILL
    time.sleep(2.0)  # wandb's own process writes what it has, then ends
    first = glob.glob(str(tmp_path / "w" / "wandb" / "offline-run-*-CartPole-v1__dqn__1__456" / "*.wandb"))
    assert len(first) == 1
    streamed = [row["global_step"] for row in wandb_history(first[0]) if "charts/SPS" in row]
    written = [step for step, _ in ticks()]
    due = [step for step, wall in ticks() if wall <= killed_at - 0.5]
    assert streamed == written[: len(streamed)] and len(streamed) >= len(due) >= 4, (streamed, written, due)
    # --resume: the same W&B run, from the checkpoint to the end, the final evaluation filmed.
    saved = dqn.load_npz(run_dir, "checkpoint")[0]["global_step"]
    total = saved + 1500
    resumed = subprocess.run(
        [*script, "--resume", run_dir, "--total-timesteps", str(total)], env=env, capture_output=True, timeout=300
    )
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    files = sorted(glob.glob(str(tmp_path / "w" / "wandb" / "offline-run-*-CartPole-v1__dqn__1__456" / "*.wandb")))
    assert len(files) == 2 and first[0] in files
    rows = wandb_history(next(f for f in files if f != first[0]))
    assert [row["global_step"] for row in rows if "charts/SPS" in row][-1] == total
    films = [row["global_step"] for row in rows if row.get("videos/eval/_type") == "video-file"]
    assert films == [step for step in range(saved + 1, total) if step % 1000 == 0] + [total]  # --eval-every 1000
    assert not any(os.path.islink(os.path.join(run_dir, name)) for name in os.listdir(run_dir))


def run_on_a_full_disk(tmp_path, monkeypatch, module):
    """A run folder with an eval.csv, and `module`'s os.replace failing as on a full disk."""
    pytest.importorskip("matplotlib")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "eval.csv").write_text("step,mean,std,episodes\n100,1.0,0.5,2\n200,2.0,0.5,2\n")

    def full(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(module.os, "replace", full)
    return run_dir


def test_plot_run_on_a_full_disk_fails_and_leaves_no_temp_file(tmp_path, monkeypatch):
    """tools/plot_run.py is run by hand after a run, so a failed write is its error (not swallowed);
    it leaves neither a temp file nor a curve.png."""
    plot = load_tool("plot_run")
    run_dir = run_on_a_full_disk(tmp_path, monkeypatch, plot)
    with pytest.raises(OSError, match="No space left on device"):
        plot.write_curve(str(run_dir))
    assert sorted(os.listdir(run_dir)) == ["eval.csv"]
    monkeypatch.undo()  # without the fault: the picture (no events here: an empty right panel)
    assert plot.write_curve(str(run_dir)) == str(run_dir / "curve.png")
    assert sorted(os.listdir(run_dir)) == ["curve.png", "eval.csv"]


def test_apex_logger_streams_each_scalar_to_wandb_with_track(tmp_path, monkeypatch):
    """Ape-X's own Logger (its runs need Ray: tests/test_apex.py) sends W&B what it writes to tensorboard."""
    apex = load_script("apex_dqn")
    wandb = StandInWandb()
    monkeypatch.setitem(sys.modules, "wandb", wandb)
    run_dir = tmp_path / "CartPole-v1__apex_dqn__1__7"
    run_dir.mkdir()
    args = apex.Args(track=True, wandb_project_name="p", run_dir=str(run_dir))
    logger = apex.Logger(str(run_dir), args)
    logger.scalars(100, {"charts/SPS": 5.0})
    logger.eval(200, np.array([1.0, 3.0]))
    logger.close(failed=True)
    assert (wandb.calls["init"]["project"], wandb.calls["init"]["id"]) == ("p", "CartPole-v1__apex_dqn__1__7")
    assert wandb.calls["exit_codes"] == [1]
    assert wandb.calls["log"] == [
        {"charts/SPS": 5.0, "global_step": 100},
        {"eval/episodic_return": 2.0, "eval/episodic_return_std": 1.0, "global_step": 200},
    ]
    assert wandb.calls["finished"] == 1 and tensorboard_scalars(str(run_dir))[0] == (100, "charts/SPS", 5.0)
