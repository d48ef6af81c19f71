"""./benchmark.sh argument checks, and benchmark/'s helpers (the summary, the accelerator table, the peers'
event files) on tiny runs made here."""

import argparse
import csv
import glob
import importlib.util
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys

import numpy as np
import pytest
from helpers import ROOT

BENCH = os.path.join(ROOT, "benchmark.sh")


def load_summary():
    spec = importlib.util.spec_from_file_location(
        "benchmark_summary", os.path.join(ROOT, "benchmark", "benchmark_summary.py")
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules["benchmark_summary"] = module
    spec.loader.exec_module(module)
    return module


def bench(*argv, **kw):
    env = {**os.environ, "PYTHON": sys.executable}
    return subprocess.run([BENCH, *argv], capture_output=True, text=True, env=env, timeout=300, **kw)


@pytest.mark.parametrize(
    "argv, message",
    [
        ([], "no mode given"),
        (["bogus"], "unknown mode 'bogus'"),
        (["quick", "full"], "one mode at a time"),
        (["-j", "0", "quick"], "-j needs a positive whole number, got '0'"),
        (["-j"], "-j needs a value"),
        (["--seeds", "x", "quick"], "--seeds needs a positive whole number, got 'x'"),
        (["--seeds", "-3", "quick"], "--seeds needs a positive whole number"),
        (["--frob", "quick"], "unknown option '--frob'"),
        (["accelerator"], "accelerator needs one part of: dqn"),
        (["accelerator", "bogus"], "accelerator needs one part of: dqn"),
    ],
)
def test_benchmark_sh_rejects_bad_arguments(argv, message, tmp_path):
    result = bench("--runs", str(tmp_path / "runs"), *argv)
    assert result.returncode == 2
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("benchmark.sh: error:") and message in last, result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "runs").exists(), "nothing may run on bad arguments"


def test_accelerator_mode_on_a_cpu_only_machine_says_so_and_runs_nothing(tmp_path):
    result = bench("--runs", str(tmp_path / "runs"), "--out", str(tmp_path / "out"), "accelerator", "dqn")
    assert result.returncode == 0 and "no accelerator" in result.stdout, result.stdout + result.stderr
    assert not (tmp_path / "runs").exists() and not (tmp_path / "out").exists()


def test_accelerator_table_pairs_each_workload_with_its_host_cpu_and_peer(tmp_path):
    sys.path.insert(0, os.path.join(ROOT, "benchmark"))
    import accelerator

    dqn, cleanrl = accelerator.PARTS["dqn"][1][0], accelerator.PARTS["cleanrl"][0][0]
    rows = [
        dict(part="dqn", label=dqn, platform="accelerator", wall_s=40.0, rc=0, rate=5000.0, date="d"),
        dict(part="dqn", label=dqn, platform="accelerator", wall_s=30.0, rc=0, rate=6000.0, date="d", commit="c1"),
        dict(part="dqn", label=dqn, platform="cpu", wall_s=20.0, rc=0, rate=4000.0, date="d", commit="c1"),
        dict(part="dqn", label=dqn, platform="cpu", wall_s=9.0, rc=0, rate=9000.0, date="d", invalid="why"),
        dict(part="cleanrl", label=cleanrl, platform="accelerator", wall_s=120.0, rc=0, rate=900.0, date="d"),
    ]
    accelerator.write_md(rows, tmp_path / "a.md", "TPU", "abc")
    text = (tmp_path / "a.md").read_text()
    assert f"| {dqn} | 6,000, 30.0 s | 4,000, 20.0 s | 1.50x | d, c1 |" in text  # the newest valid rows
    assert f"{cleanrl} 120.0 s: 4.00x" in text


def test_accelerator_table_says_where_a_run_cut_by_the_call_limit_stopped(tmp_path):
    sys.path.insert(0, os.path.join(ROOT, "benchmark"))
    import accelerator

    peer = accelerator.PARTS["cleanrl-atari"][0][0]
    row = dict(part="cleanrl-atari", label=peer, platform="accelerator", wall_s=545.0, rc=-2, rate=194.3, date="d")
    accelerator.write_md([dict(row, stopped_at=122_300)], tmp_path / "a.md", "TPU", "abc")
    assert f"| {peer} | 194, 545.0 s (stopped at 122,300 steps) | - | - | d, - |" in (tmp_path / "a.md").read_text()
    accelerator.write_md([row], tmp_path / "b.md", "TPU", "abc")  # a non-zero exit without a stop is a failure
    assert "194, 545.0 s (failed)" in (tmp_path / "b.md").read_text()


def test_summary_of_an_empty_folder_is_one_clear_error(tmp_path):
    result = bench("summary", "--runs", str(tmp_path), "--out", str(tmp_path / "out"))
    assert result.returncode != 0
    assert "no runs under" in result.stderr and "Traceback" not in result.stderr


def test_bootstrap_ci_brackets_the_mean():
    summary = load_summary()
    rng = np.random.default_rng(0)
    assert summary.bootstrap_ci([3.0, 3.0, 3.0], rng) == (3.0, 3.0)
    values = [100.0, 200.0, 300.0, 400.0, 500.0]
    low, high = summary.bootstrap_ci(values, rng)
    assert min(values) <= low < np.mean(values) < high <= max(values)
    # Half the spread gives half the interval around the same mean (the bootstrap is linear in x).
    low2, high2 = summary.bootstrap_ci([(v + 300.0) / 2 for v in values], np.random.default_rng(0))
    low1, high1 = summary.bootstrap_ci(values, np.random.default_rng(0))
    assert np.isclose(low2, (low1 + 300) / 2) and np.isclose(high2, (high1 + 300) / 2)


def make_run(stem, script, *flags):
    """What benchmark.sh's run() does: run dir, .log, .exit."""
    os.makedirs(os.path.dirname(stem), exist_ok=True)
    with open(stem + ".log", "w") as log:
        rc = subprocess.run(
            [sys.executable, os.path.join(ROOT, "algos", script), *flags, "--run-dir", stem],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            timeout=300,
        ).returncode
    with open(stem + ".exit", "w") as f:
        f.write(f"{rc}\n")
    return rc


def eval_rows(stem):
    with open(os.path.join(stem, "eval.csv"), newline="") as f:
        return list(csv.DictReader(f))


def test_summary_reads_back_what_the_runs_logged_and_reports_crashes(tmp_path):
    runs, out = tmp_path / "runs", tmp_path / "results"
    dqn = [
        "--total-timesteps",
        "3000",
        "--learning-starts",
        "500",
        "--eval-every",
        "1000",
        "--eval-episodes",
        "2",
        "--log-every",
        "500",
        "--updates-per-call",
        "4",
        "--checkpoint-every",
        "0",
    ]
    stems = [str(runs / "tiny" / "dqn" / "CartPole-v1" / f"seed{s}") for s in (1, 2, 3)]
    assert make_run(stems[0], "dqn_prioritized.py", "--seed", "1", *dqn) == 0
    assert make_run(stems[1], "dqn_prioritized.py", "--seed", "2", *dqn) == 0
    assert make_run(stems[2], "dqn_prioritized.py", "--seed", "3", *dqn, "--batch-size", "0") == 2
    unfinished = runs / "tiny" / "dqn" / "CartPole-v1" / "seed4"
    unfinished.mkdir()  # started, never ended: no exit status, no model
    bc_stem = str(runs / "tiny" / "bc" / "pendulum-sac-expert" / "seed1")
    assert (
        make_run(
            bc_stem,
            "bc_offline.py",
            "--total-updates",
            "200",
            "--updates-per-call",
            "50",
            "--eval-every",
            "100",
            "--eval-episodes",
            "2",
            "--log-every",
            "50",
        )
        == 0
    )

    # The side file of `./benchmark.sh atari`: a real (small) replay-memory measurement.
    memory = subprocess.run(
        [
            sys.executable,
            os.path.join(ROOT, "tests", "replay_memory.py"),
            "--layout",
            "compressed",
            "--capacity",
            "2000",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert memory.returncode == 0, memory.stderr
    (runs / "tiny" / "replay-memory.jsonl").write_text(memory.stdout)
    measured = json.loads(memory.stdout)

    result = bench("summary", "--runs", str(runs), "--out", str(out))
    assert result.returncode == 0, result.stderr
    text = (out / "summary.md").read_text()
    assert (
        f"| compressed | 2,000 | {measured['rss_bytes'] / 2**30:.2f} GiB | "
        f"{measured['rss_bytes_per_transition']:,.0f} B |" in text
    )

    # DQN row: final eval = last eval.csv row of each finished seed; mean and std over seeds.
    finals = [float(eval_rows(s)[-1]["mean"]) for s in stems[:2]]
    best = [max(float(r["mean"]) for r in eval_rows(s)) for s in stems[:2]]
    row = next(line for line in text.splitlines() if line.startswith("| dqn | CartPole-v1 |"))
    assert f"{np.mean(finals):.1f} ± {np.std(finals):.1f}" in row
    assert f"| {np.mean(best):.1f} ± {np.std(best):.1f} |" in row  # beside it, the best evaluation
    assert row.rstrip().endswith("| 2/4 |")
    assert "seed 3: **crashed (exit 2)**" in text and "seed 4: **unfinished**" in text

    summary = load_summary()
    loaded = {r.path: r for r in summary.discover(str(runs))}
    assert [r.status for r in (loaded[s] for s in stems)] == ["ok", "ok", "crashed (exit 2)"]
    for stem in stems[:2]:
        run = loaded[stem]
        assert run.curve == [(int(r["step"]), float(r["mean"])) for r in eval_rows(stem)]
        assert run.env_id == "CartPole-v1"
        # Throughput read back equals what the run logged to tensorboard.
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

        acc = EventAccumulator(glob.glob(os.path.join(stem, "events.out.tfevents.*"))[0])
        acc.Reload()
        logged = [e.value for e in acc.Scalars("perf/updates_per_second") if e.value > 0]
        assert run.updates_per_second == pytest.approx(statistics.median(logged))
        sps = acc.Scalars("charts/SPS")
        assert run.env_sps == pytest.approx(sps[-1].step / (sps[-1].wall_time - acc.FirstEventTimestamp()))

    # BC row: the normalised score column is the last eval's score.
    bc = loaded[bc_stem]
    assert bc.status == "ok" and bc.normalized == [float(r["normalized_score"]) for r in eval_rows(bc_stem)]
    row = next(line for line in text.splitlines() if line.startswith("| bc | pendulum-sac-expert |"))
    assert f"| {bc.normalized[-1]:,.1f} |" in row and row.rstrip().endswith("| 1/1 |")
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return
    assert (out / "tiny_CartPole-v1.png").stat().st_size > 0 and "(tiny_CartPole-v1.png)" in text


def test_speed_vs_peers_reads_each_side_from_its_event_files(tmp_path, monkeypatch):
    """benchmark/speed_vs_peers.py: a peer's learning-phase rate is its env steps over the wall time
    between its first and last charts/SPS events (accelerator.py's cleanrl-atari: from a given step on),
    and "last returns" the mean of the last 10 episodes in step order, found in event files however deep
    the peer puts them."""
    sys.path.insert(0, os.path.join(ROOT, "benchmark"))
    import speed_vs_peers
    from tensorboard.compat.proto import event_pb2, summary_pb2
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    deep = tmp_path / "runs" / "CartPole-v1__dqn_jax__1__0"
    writer = EventFileWriter(str(deep))
    rows = [("charts/SPS", 10_000 + 100 * i, 1_000.0 + 0.05 * i, 1.0) for i in range(11)]  # 2,000 steps/s
    rows += [("charts/episodic_return", 20_000 - 100 * i, 1_000.0, float(i)) for i in range(12)]  # 11 is oldest
    for tag, step, wall, value in rows:
        summary = summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag=tag, simple_value=value)])
        writer.add_event(event_pb2.Event(wall_time=wall, step=step, summary=summary))
    writer.close()
    assert speed_vs_peers.window_rate(str(tmp_path)) == pytest.approx(2_000.0)
    assert speed_vs_peers.window_rate(str(tmp_path), 10_500) == pytest.approx(2_000.0)  # steps 10.5k-11k
    assert speed_vs_peers.window_rate(str(tmp_path), 11_000) is None  # one event: no window
    assert speed_vs_peers.training_return(str(tmp_path), 2**63, 10) == pytest.approx(statistics.mean(range(10)))
    assert speed_vs_peers.training_return(str(tmp_path / "empty"), 2**63, 10) is None

    # The CleanRL side of a sitting reads its run back the same way (its run stubbed: no CleanRL here).
    def cleanrl_writes_its_run(cmd, log, cwd):
        shutil.copytree(deep, os.path.join(cwd, "runs", deep.name))
        return 0.0, 1.0

    monkeypatch.setattr(speed_vs_peers, "timed", cleanrl_writes_its_run)
    args = argparse.Namespace(out=str(tmp_path / "out"), cleanrl_python="python", cleanrl_dqn="dqn_jax.py")
    record = speed_vs_peers.same_settings(args, "dqn", "cleanrl", 1)
    assert record["learning_env_steps_per_s"] == pytest.approx(2_000.0)
    assert record["last_returns"] == pytest.approx(statistics.mean(range(10)))


def write_returns(folder, returns_at):
    """An event file of charts/episodic_return events, (step, value) each, in the order given."""
    from tensorboard.compat.proto import event_pb2, summary_pb2
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    writer = EventFileWriter(str(folder))
    for step, value in returns_at:
        value = summary_pb2.Summary.Value(tag="charts/episodic_return", simple_value=value)
        writer.add_event(event_pb2.Event(wall_time=1.0, step=step, summary=summary_pb2.Summary(value=[value])))
    writer.close()


def test_minatar_table_reads_the_papers_metric_at_the_budget(tmp_path):
    """The MinAtar paper's metric: the mean of the last 100 training returns ending at or before the
    budget (episodes logged after it, or out of step order, do not count), per seed, beside the
    paper's DQN at that budget and the share of it."""
    summary = load_summary()
    rng = np.random.default_rng(0)
    expected = []
    for seed in (1, 2):
        stem = tmp_path / "runs" / "minatar" / "preset" / "Breakout-v0" / f"seed{seed}"
        stem.mkdir(parents=True)
        steps = rng.choice(np.arange(1, 1_200_000), size=400, replace=False)
        values = rng.normal(8 + seed, 2, size=400).astype(np.float32)
        write_returns(stem, zip(steps.tolist(), values.tolist()))
        order = np.argsort(steps)
        kept = values[order][steps[order] <= 1_000_000][-100:]
        expected.append(float(kept.mean()))
        flags = {"env_id": "MinAtar/Breakout-v0", "total_timesteps": 10**6}
        (stem / "args.json").write_text(json.dumps({"args": flags}))
        (stem / "eval.csv").write_text(f"step,mean,std,episodes\n1000000,{10 + seed},1.0,10\n")
        (tmp_path / "runs" / "minatar" / "preset" / "Breakout-v0" / f"seed{seed}.exit").write_text("0\n")
        assert summary.training_return(str(stem), 10**6) == pytest.approx(expected[-1], rel=1e-6)
    for task in ("Breakout-v0", "Freeway-v0"):  # a crashed run beside them; Freeway's only run
        crashed = tmp_path / "runs" / "minatar" / "preset" / task / "seed3"
        crashed.mkdir(parents=True)
        (crashed.parent / "seed3.exit").write_text("1\n")
    text = open(summary.write_summary(str(tmp_path / "runs"), str(tmp_path / "out"))).read()
    row = next(line for line in text.splitlines() if line.startswith("| Breakout | preset |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[2] == "1,000,000" and cells[3] == ", ".join(f"{e:,.1f}" for e in expected)
    assert cells[5] == "9.3" and cells[6] == f"{100 * np.mean(expected) / 9.3:.0f}%"
    assert cells[7] == "11.0, 12.0" and cells[8] == "2/3"
    assert "| Freeway | preset | - | - | - | - | - | - | 0/1 |" in text  # counted, not averaged
    assert "minatar_games.png" in text and (tmp_path / "out" / "minatar_games.png").exists()


def test_thread_profile_finds_where_each_thread_waits(tmp_path):
    script = tmp_path / "sleepy.py"
    script.write_text(
        "import sys, threading, time\n"
        "def napping():\n    time.sleep(0.6)\n"
        "def spinning():\n    end = time.time() + 0.6\n    while time.time() < end:\n        pass\n"
        "t = threading.Thread(target=napping, name='napper')\nt.start()\nspinning()\nt.join()\nsys.exit(3)\n"
    )
    stacks, profile = tmp_path / "stacks.txt", os.path.join(ROOT, "tools", "thread_profile.py")
    run = subprocess.run([sys.executable, profile, "run", str(stacks), str(script)], capture_output=True, timeout=60)
    assert run.returncode == 3  # the script's own exit, its stacks written at exit all the same
    out = subprocess.run([sys.executable, profile, "summary", str(stacks), "sleepy.py"], capture_output=True, text=True)
    sections = {block.split(":")[0]: block for block in out.stdout.split("thread ")[1:]}
    top = {name: block.splitlines()[1] for name, block in sections.items()}
    assert "napping (sleepy.py:3) -> napping (sleepy.py:3)" in top["napper"], out.stdout
    assert "spinning (sleepy.py:" in top["MainThread"], out.stdout


def test_a_peer_run_past_its_limit_is_stopped_and_says_so(tmp_path, monkeypatch):
    sys.path.insert(0, os.path.join(ROOT, "benchmark"))
    import accelerator

    script = tmp_path / "slow.py"
    script.write_text("import time\ntime.sleep(60)\n")
    monkeypatch.setenv("CLEANRL_PYTHON", sys.executable)
    monkeypatch.setenv("CLEANRL_ATARI_DQN", str(script))
    monkeypatch.setenv("CLEANRL_ATARI_LIMIT", "3")
    # A shell's background job (xdist's workers too) ignores SIGINT, and so would the child: run it as from a
    # terminal, where a handler here means the default disposition there.
    ignored = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        row = accelerator.run("cleanrl-atari", "peer", "cleanrl-atari", "", "accelerator")
    finally:
        signal.signal(signal.SIGINT, ignored)
    assert row["rc"] != 0 and row["wall_s"] < 30 and row["tail"][-1] == "KeyboardInterrupt"  # SIGINT, as ^C
    assert row["stopped_at"] == 0 and row["rate"] is None  # stopped before it logged a step


def test_stress_runs_stop_cleanly_and_their_checkpoints_resume(tmp_path):
    """./benchmark.sh stress, short: two seed loops of dqn_prioritized.py's train() stopped by one Ctrl-C each
    (runs 0 and 1 draw no second one); each must stop by KeyboardInterrupt, not abort, and its stop checkpoint
    must resume. Seen failing (rc -6, exit 1) against a copy that aborts after its stop checkpoint."""
    stress = [sys.executable, os.path.join(ROOT, "benchmark", "stress.py"), "dqn", "--runs", "2", "--jobs", "2"]
    flags = ["--earliest", "8", "--latest", "10", "--out", str(tmp_path)]
    done = subprocess.run(stress + flags, capture_output=True, text=True, timeout=600)
    with open(tmp_path / "dqn" / "results.jsonl") as f:
        results = [json.loads(line) for line in f]
    assert done.returncode == 0 and len(results) == 2, done.stdout + done.stderr
    for result in results:
        assert result["rc"] == -signal.SIGINT and not result["abort"], result
        assert result["checkpoint"] and result["loaded"], result
