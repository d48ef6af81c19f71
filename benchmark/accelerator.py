"""`./benchmark.sh accelerator PART`: each workload on the machine's accelerator and on its host CPU
(JAX_PLATFORMS=cpu), one process at a time. Each run's row goes to RUNS/accelerator.jsonl;
OUT/accelerator.md is rebuilt from the newest row of every (workload, platform). A PART fits in one
9-minute call of a lent machine; PARTS says what each runs, and:

  cleanrl  CleanRL's own dqn_jax.py (CLEANRL_PYTHON, CLEANRL_DQN); sbx: sbx's SAC (SBX_PYTHON)
  cleanrl-atari  CleanRL's dqn_atari_jax.py (CLEANRL_PYTHON, CLEANRL_ATARI_DQN; ale_py imported first, which
           registers the ALE ids that gymnasium 0.29 no longer finds by itself), accelerator only; its rate: its
           env steps over the wall time between its log events at 100k and at its last (its own SPS counts
           from its start). Its 200k take ~16 min on a TPU v5e: CLEANRL_ATARI_LIMIT seconds (540) end it by
           SIGINT, and its row says the step it stopped at
  learning DQN CartPole-v1 defaults, seeds 1-5, accelerator only: the final evaluations
  minatar, atari  the presets at issue 56's budgets (MinAtar 500k, Pong 200k with the 1M replay), accelerator only

Rate: the median charts/SPS (BC: perf/updates_per_second) over the second half of the run's steps.
"""

import json
import os
import signal
import subprocess
import sys
import tempfile
import time

from benchmark_summary import median, scalars, window_rate
from speed_vs_peers import CLEANRL

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NO_CHECKPOINTS = ["--checkpoint-every", "0"]
MINATAR = "--env-id MinAtar/Breakout-v0 --preset minatar --total-timesteps 500000 --updates-per-call 128"
HALFCHEETAH = "--env-id HalfCheetah-v5 --total-timesteps 25000 --learning-starts 5000 --eval-every 25000"
ATARI = "--env-id ALE/Pong-v5 --preset atari --total-timesteps 200000 --learning-starts 50000"  # the 1M replay
ATARI_CLEANRL = "--total-timesteps 200000 --learning-starts 50000"  # its own flags otherwise (issue 56)
WITH_ALE = "import ale_py, runpy, sys; sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')"
PARTS = {  # label (the key of its rows in accelerator.jsonl), kind, flags
    "dqn": [
        ("DQN CartPole-v1 defaults, 50k steps", "dqn", "--total-timesteps 50000 --eval-every 50000"),
        ("DQN CleanRL's CartPole line, 100k steps", "dqn", f"--total-timesteps 100000 --eval-every 100000 {CLEANRL}"),
    ],
    "minatar": [("DQN MinAtar/Breakout-v0 --preset minatar --updates-per-call 128, 500k", "dqn", MINATAR)],
    "sac": [("SAC HalfCheetah-v5, 25k steps (learning from 5k)", "sac", HALFCHEETAH)],
    "bc": [
        (
            "BC halfcheetah-sac-medium, 20k updates",
            "bc",
            "--dataset data/halfcheetah-sac-medium.hdf5 --eval-every 20000",
        )
    ],
    "cleanrl": [("CleanRL dqn_jax.py (its CartPole line), 100k steps", "cleanrl", "--total-timesteps 100000")],
    "sbx": [("sbx 0.28 SAC HalfCheetah-v5, 25k steps (learning from 5k)", "sbx", "")],
    "atari": [("DQN ALE/Pong-v5 --preset atari, 200k (learning from 50k)", "dqn", ATARI)],
    "cleanrl-atari": [
        ("CleanRL dqn_atari_jax.py (its Breakout line), 200k (learning from 50k)", "cleanrl-atari", ATARI_CLEANRL)
    ],
}
PEERS = {PARTS["cleanrl"][0][0]: PARTS["dqn"][1][0], PARTS["sbx"][0][0]: PARTS["sac"][0][0]}  # peer: ours
SCRIPTS = {"dqn": "algos/dqn_prioritized.py", "sac": "algos/sac.py", "bc": "algos/bc_offline.py"}


def median_second_half(folder: str, tag: str):
    values = scalars(folder, tag)
    last = max((step for step, _, _ in values), default=0)
    return median(v for step, _, v in values if step > last / 2)


def run(part: str, label: str, kind: str, flags: str, platform: str, seed: int = 1) -> dict:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    if platform == "cpu":
        env["JAX_PLATFORMS"] = "cpu"
    else:
        env.pop("JAX_PLATFORMS", None)
    work = tempfile.mkdtemp(prefix="accel-")
    if kind == "cleanrl":
        cmd = [os.environ["CLEANRL_PYTHON"], os.environ["CLEANRL_DQN"], "--seed", str(seed), *flags.split()]
    elif kind == "cleanrl-atari":
        script = os.environ["CLEANRL_ATARI_DQN"]
        cmd = [os.environ["CLEANRL_PYTHON"], "-c", WITH_ALE, script, "--seed", str(seed), *flags.split()]
    elif kind == "sbx":
        sbx = [os.path.join(ROOT, "benchmark/sbx_peer.py"), "sac", "--env-id", "HalfCheetah-v5"]
        cmd = [os.environ["SBX_PYTHON"], *sbx, "--total-timesteps", "25000", "--seed", str(seed)]
    else:
        run_dir = os.path.join(work, "run")
        cmd = [sys.executable, os.path.join(ROOT, SCRIPTS[kind]), "--seed", str(seed), *flags.split()]
        cmd += NO_CHECKPOINTS + ["--run-dir", run_dir]
    start, stopped = time.time(), False
    limit = float(os.environ.get("CLEANRL_ATARI_LIMIT", 540)) if kind == "cleanrl-atari" else None
    proc = subprocess.Popen(
        cmd, cwd=ROOT if kind in SCRIPTS else work, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    try:
        stdout, _ = proc.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGINT)
        try:
            (stdout, _), stopped = proc.communicate(timeout=60), True
        except subprocess.TimeoutExpired:  # it ignored SIGINT
            proc.kill()
            (stdout, _), stopped = proc.communicate(), True
    wall = time.time() - start
    tail = [line for line in stdout.splitlines() if line.strip() and "warn" not in line.lower()][-3:]
    row = dict(part=part, label=label, platform=platform, seed=seed, wall_s=round(wall, 1), rc=proc.returncode)
    row.update(date=time.strftime("%Y-%m-%d"), tail=tail)
    if kind in SCRIPTS:
        row["rate"] = median_second_half(run_dir, "perf/updates_per_second" if kind == "bc" else "charts/SPS")
        final = [line for line in stdout.splitlines() if line.startswith("final eval")]
        row["final"] = float(final[-1].split(":")[1].split()[0]) if final else None
    elif kind == "cleanrl":
        row["rate"] = median_second_half(work, "charts/SPS")  # CleanRL's SPS counts from its start
    elif kind == "cleanrl-atari":
        row["rate"] = window_rate(work, 100_000)
        if stopped:
            row["stopped_at"] = max((step for step, _, _ in scalars(work, "charts/SPS")), default=0)
    print(json.dumps(row), flush=True)
    return row


def write_md(rows: list, path: str, device: str, commit: str) -> None:
    newest = {}
    for r in (r for r in rows if not r.get("invalid") and r["part"] != "learning"):
        newest[(r["label"], r["platform"], r.get("seed", 1))] = r
    lines = [
        f"# Accelerator against its host CPU\n\nDevice: {device}. "
        "`./benchmark.sh accelerator PART`; rate: the median charts/SPS (BC: updates/s) over the "
        "second half of the run (CleanRL's Atari: its steps over its time from 100k); time: the whole process.\n",
        "| workload | accelerator: rate, time | host CPU: rate, time | rate ratio | date, commit |",
        "|---|---|---|---:|---|",
    ]
    labels = dict.fromkeys(k[0] for k in newest if k[2] == 1 and not k[0].startswith("BC input") and k[0] not in PEERS)
    for label in labels:
        a, c = newest.get((label, "accelerator", 1)), newest.get((label, "cpu", 1))

        def cell(r):
            return (
                "-"
                if r is None
                else (f"{r['rate']:,.0f}" if r.get("rate") else "-")
                + f", {r['wall_s']:.1f} s"
                + (f" (stopped at {r['stopped_at']:,} steps)" if r.get("stopped_at") else "")
                + ("" if r["rc"] == 0 or r.get("stopped_at") else " (failed)")
            )

        ratio = f"{a['rate'] / c['rate']:.2f}x" if a and c and a.get("rate") and c.get("rate") else "-"
        lines.append(
            f"| {label} | {cell(a)} | {cell(c)} | {ratio} | {(a or c)['date']}, {(a or c).get('commit', '-')} |"
        )
    for peer, ours in PEERS.items():
        for platform in ("accelerator", "cpu"):
            a, b = newest.get((ours, platform, 1)), newest.get((peer, platform, 1))
            if a and b and a["rc"] == 0 and b["rc"] == 0:
                lines.append(
                    f"\nWhole process on the {platform}: {ours} {a['wall_s']:.1f} s, {peer} {b['wall_s']:.1f} s: "
                    f"{b['wall_s'] / a['wall_s']:.2f}x."
                )
    finals = [r for r in rows if r["part"] == "learning" and r.get("final") is not None]
    if finals:
        seen = {r["seed"]: r["final"] for r in finals}
        lines.append(
            "\nDQN CartPole-v1 defaults on the accelerator, final evaluation by seed: "
            + ", ".join(f"{s}: {v:.1f}" for s, v in sorted(seen.items()))
        )
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def main() -> None:
    part, runs, out = sys.argv[1], sys.argv[2], sys.argv[3]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
    os.makedirs(runs, exist_ok=True)
    log = os.path.join(runs, "accelerator.jsonl")
    new = []
    if part == "learning":
        for seed in range(1, 6):
            new.append(run(part, "DQN CartPole-v1 defaults", "dqn", "", "accelerator", seed))
    for label, kind, flags in PARTS.get(part, []):
        sides = "accelerator" if part in ("minatar", "atari", "cleanrl-atari") else "accelerator cpu"  # the CPU: hours
        for platform in os.environ.get("PLATFORMS", sides).split():  # PLATFORMS=accelerator: one side
            new.append(run(part, label, kind, flags, platform))
    probe = (
        "import jax, os; print(f'{jax.devices()[0].device_kind}, host {os.cpu_count()} cores, JAX {jax.__version__}')"
    )
    device = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True).stdout.strip()
    with open(log, "a") as f:
        for row in new:
            f.write(json.dumps(dict(row, commit=commit.strip(), device=device)) + "\n")
    with open(log) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    os.makedirs(out, exist_ok=True)
    write_md(rows, os.path.join(out, "accelerator.md"), device, commit.strip())


if __name__ == "__main__":
    main()
