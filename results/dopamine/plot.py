"""A 10M-frame Atari run's training return per 1M frames (250k agent steps) beside Dopamine's per-run curves (the CSVs
here), on Dopamine's metric: the mean return of the training episodes ending in each iteration. Writes
RUN_FOLDER/GAME-vs-dopamine.png and prints the figures docs/atari_minatar.md cites.

    python results/dopamine/plot.py results/runs/e4d1c38/tpu-pong-10m pong
    python results/dopamine/plot.py results/runs/183c628/tpu-breakout-10m breakout
    python results/dopamine/plot.py results/runs/e4d1c38/tpu-breakout-6m breakout
"""

import csv
import glob
import os
import statistics
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

folder, game = sys.argv[1], sys.argv[2]
returns = []
for path in sorted(glob.glob(os.path.join(folder, "events.out.tfevents.*"))):
    events = EventAccumulator(path, size_guidance={"scalars": 0})
    events.Reload()
    returns += [(e.step, e.value) for e in events.Scalars("charts/episodic_return")]
windows = [[v for s, v in returns if i * 250_000 < s <= (i + 1) * 250_000] for i in range(10)]
ours = [statistics.mean(w) for w in windows if w]  # a run stopped early: its last window is cut where it stopped
runs = {}
with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), f"{game}.csv")) as f:
    for row in csv.DictReader(f):
        if int(row["iteration"]) < 10:
            runs.setdefault((row["agent"], row["run"]), []).append(float(row["return"]))
colours = {"DQN": "tab:blue", "DQN (Adam + MSE in JAX)": "tab:green", "Rainbow": "tab:red"}
fig, ax = plt.subplots(figsize=(7, 4.5))
for (agent, run), values in sorted(runs.items()):
    if agent in colours:
        ax.plot(range(1, 11), values, color=colours[agent], alpha=0.45, lw=1, label=agent if run == "0" else None)
label = "ours: --preset atari --num-envs 32, seed 1"
ax.plot(range(1, len(ours) + 1), ours, color="black", lw=2.5, marker="o", label=label)
title = f"ALE/{game.capitalize()}-v5, sticky actions 0.25"
ax.set(xlabel="frames (millions)", ylabel="mean training return in that million frames", title=title)
ax.legend(fontsize=8)
fig.tight_layout()
fig.savefig(os.path.join(folder, f"{game}-vs-dopamine.png"), dpi=110)
print("ours by million frames:", [round(x, 2) for x in ours])
for agent in colours:
    at9 = [v[9] for (a, _), v in runs.items() if a == agent]
    print(f"{agent} at 9-10M frames: mean {statistics.mean(at9):.1f}, runs {min(at9):.1f} to {max(at9):.1f}")
