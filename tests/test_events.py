"""The scripts' tensorboard events (issue 15): written on the loop's own thread through
tensorboard's record writer, read back here by tensorboard's own reader (EventAccumulator), and
on disk at every log tick, so that a run killed mid-way keeps its curves up to the last tick."""

import glob
import os
import re
import signal
import subprocess
import sys
import threading

import numpy as np
import pytest
from helpers import ROOT, load_script
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

QUIET = ["--checkpoint-every", "0"]


def events(run_dir):
    files = glob.glob(os.path.join(run_dir, "events.out.tfevents.*"))
    assert len(files) == 1, files
    acc = EventAccumulator(files[0], size_guidance={"scalars": 0})
    acc.Reload()
    return acc


@pytest.mark.parametrize("script", ["dqn_prioritized", "sac"])
def test_every_episode_and_log_tick_reads_back_in_tensorboard(script, tmp_path):
    total, log_every = 3000, 500
    flags = {
        "dqn_prioritized": ["--learning-starts", "500", "--updates-per-call", "4"],
        "sac": ["--env-id", "Pendulum-v1", "--learning-starts", "2500", "--hidden-sizes", "32", "32"],
    }[script]
    run_dir = str(tmp_path / "run")
    out = subprocess.run(
        [sys.executable, os.path.join(ROOT, "algos", f"{script}.py"), *flags, *QUIET]
        + ["--total-timesteps", str(total), "--log-every", str(log_every), "--eval-every", "3000"]
        + ["--eval-episodes", "2", "--run-dir", run_dir],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    acc = events(run_dir)
    assert acc.file_version == 2.0  # the accumulator parses "brain.Event:2"
    assert [e.step for e in acc.Scalars("charts/SPS")] == list(range(log_every, total + 1, log_every))
    lengths = [e.value for e in acc.Scalars("charts/episodic_length")]
    returns = acc.Scalars("charts/episodic_return")
    assert len(returns) == len(lengths) > 0
    # Every finished episode is there: their lengths add up to the steps done, less the one cut
    # off by the end of the run (a 1-env run).
    unfinished = total - sum(lengths)
    assert 0 <= unfinished < (200 if script == "sac" else 500)
    assert [e.step for e in acc.Scalars("eval/episodic_return")] == [total]


@pytest.mark.parametrize("script", ["dqn_prioritized", "sac", "bc_offline"])
def test_a_killed_run_keeps_its_events_up_to_the_last_log_tick(script, tmp_path):
    """The plain progress line is printed after the tick's events are flushed, so once it says
    step S a SIGKILL leaves every tick up to S readable. (The events go through a buffered file:
    without the flush at each tick, all three runs lose them.)"""
    counter = "--total-updates" if script == "bc_offline" else "--total-timesteps"
    flags = {
        "dqn_prioritized": ["--learning-starts", "1000000"],
        "sac": ["--env-id", "Pendulum-v1", "--learning-starts", "1000000"],
        "bc_offline": ["--updates-per-call", "10"],
    }[script]
    log_every = 20 if script == "bc_offline" else 200
    run_dir = str(tmp_path / "run")
    proc = subprocess.Popen(
        [sys.executable, os.path.join(ROOT, "algos", f"{script}.py"), *flags, *QUIET]
        + [counter, "100000000", "--log-every", str(log_every), "--eval-every", "100000000"]
        + ["--run-dir", run_dir],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    printed = []
    deadline = threading.Timer(300, proc.kill)  # a run that stalls fails the test instead of hanging it
    deadline.start()
    try:
        for line in proc.stdout:
            match = re.match(r"\s*(?:step|update)s?\s+(\d+)", line)
            if match:
                printed.append(int(match.group(1)))
            if len(printed) == 3:
                break
        else:
            pytest.fail("the run ended before printing three progress lines")
        proc.send_signal(signal.SIGKILL)
    finally:
        deadline.cancel()
        proc.kill()
        proc.wait(timeout=60)
    # bc_offline.py prints a line at every tick, the others at every 10th
    tag, ticks_per_line = ("perf/updates_per_second", 1) if script == "bc_offline" else ("charts/SPS", 10)
    assert printed == [k * ticks_per_line * log_every for k in (1, 2, 3)]
    steps = [e.step for e in events(run_dir).Scalars(tag)]
    assert steps == list(range(log_every, log_every * (len(steps) + 1), log_every))
    assert steps[-1] >= printed[-1]


@pytest.mark.parametrize("script", ["dqn_prioritized", "sac", "bc_offline", "apex_dqn"])
def test_logger_writes_what_tensorboard_reads(script, tmp_path):
    """Each script's Logger on its own (apex_dqn.py's runs need Ray; its Logger does not): the
    first event is on disk at once, scalars and evaluations read back after the loop flushes its
    buffered file, a second Logger in the same folder (a resume) writes a second file that sorts
    after the first, close() writes out what came after the last flush, and may come twice."""
    module = load_script(script)

    def new_logger():
        return module.Logger(str(tmp_path), module.Args())

    logger = new_logger()
    flush = logger.file.flush
    assert events(str(tmp_path)).file_version == 2.0  # before anything is flushed by hand
    logger.scalars(100, {"charts/SPS": 12.5, "losses/td_loss": 0.25})
    returns = np.array([1.0, 3.0])
    if script == "bc_offline":
        logger.eval(200, returns, 50.0)  # and its normalised score
    else:
        logger.eval(200, returns)
    flush()
    acc = events(str(tmp_path))
    assert [(e.step, e.value) for e in acc.Scalars("charts/SPS")] == [(100, 12.5)]
    assert [(e.step, e.value) for e in acc.Scalars("eval/episodic_return")] == [(200, 2.0)]
    logger.scalars(300, {"charts/SPS": 7.0})  # after the last flush: close() must write it out
    logger.close()
    assert [e.step for e in events(str(tmp_path)).Scalars("charts/SPS")] == [100, 300]
    logger.close()
    second = new_logger()
    second.close()
    files = sorted(glob.glob(os.path.join(str(tmp_path), "events.out.tfevents.*")))
    assert len(files) == 2 and os.path.getsize(files[0]) > os.path.getsize(files[1]) > 0
