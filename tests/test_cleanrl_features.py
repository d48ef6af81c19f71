"""What CleanRL users reach for: --capture-video, the progress bar (tqdm), curve.png (tools/plot_run.py)
and Weights & Biases (tools/wandb_upload.py), in all three scripts; an evaluation of a saved model is
tools/<script>_evaluate.py's."""

import csv
import functools
import glob
import io
import os
import re
import subprocess
import sys
import types

import imageio.v3 as iio
import jax
import jax.numpy as jnp
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
    assert module.cli(fast + ["--capture-video", "--run-dir", run_dir]) == 0
    monkeypatch.undo()
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


@pytest.mark.parametrize("name", list(RUNS))
def test_capture_video_without_moviepy_is_one_line_before_training(name, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "moviepy", None)
    module, fast, _, _ = RUNS[name]
    run_dir = tmp_path / "run"
    assert module.cli(fast + ["--capture-video", "--run-dir", str(run_dir)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "pip install moviepy" in err and "--capture-video" in err, err
    assert not run_dir.exists()  # refused before anything ran
    # A saved run's flags do not ask for the package (a model for --eval-only, or for DQN's
    # tools/dqn_evaluate.py). An earlier version's W&B flags are dropped, not refused (a resume of its runs).
    args = module.args_from_json({"capture_video": True, "track": True, "wandb_entity": "me"}, "model.npz")
    assert args.capture_video and not hasattr(args, "track")


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
    files = glob.glob(os.path.join(run_dir, "wandb", "offline-run-*", "run-CartPole-v1__dqn__1__123.wandb"))
    assert len(files) == 1 and os.path.getsize(files[0]) > 0, os.listdir(run_dir)


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
