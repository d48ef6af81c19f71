"""`python benchmark/readme_table.py [results/runs]`: README's rows, and results/runs/NAME.png, from the
runs' eval.csv files kept as results/runs/COMMIT/NAME-seedN.csv."""

import glob
import os
import re
import sys

import matplotlib.pyplot as plt
import numpy as np

root = sys.argv[1] if len(sys.argv) > 1 else "results/runs"
groups = {}  # (NAME, COMMIT) -> [each run's rows: step, mean, std, episodes(, normalised score)]
for path in sorted(glob.glob(os.path.join(root, "*", "*-seed*.csv"))):
    key = (re.sub(r"-seed\d+\.csv$", "", os.path.basename(path)), os.path.basename(os.path.dirname(path)))
    groups.setdefault(key, []).append(np.loadtxt(path, delimiter=",", skiprows=1, ndmin=2))
print("| runs | seeds | final eval | best eval | normalised score: final (best) | commit |\n|---|---|---|---|---|---|")
for (name, commit), runs in sorted(groups.items()):
    finals, bests = np.array([r[-1, 1] for r in runs]), np.array([r[:, 1].max() for r in runs])
    scores = [(r[-1, 4], r[:, 4].max()) for r in runs if r.shape[1] > 4]  # normalised: final, best
    norm = "%.1f (%.1f)" % tuple(np.mean(scores, axis=0)) if scores else "-"
    final, best = f"{finals.mean():,.1f} ± {finals.std():,.1f}", f"{bests.mean():,.1f} ± {bests.std():,.1f}"
    print(f"| {name} | {len(runs)} | {final} | {best} | {norm} | {commit} |")
    fig, ax = plt.subplots(figsize=(5, 3.2), layout="tight")
    for r in runs:
        ax.plot(r[:, 0], r[:, 1], alpha=0.5, lw=1)
    ax.set(title=f"{name} ({commit}, {len(runs)} seeds)", xlabel="step", ylabel="evaluation return")
    fig.savefig(os.path.join(root, f"{name}.png"), dpi=80)
    plt.close(fig)
