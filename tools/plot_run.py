"""Plot a run: RUN_DIR/curve.png with the evaluation returns (eval.csv: mean and a band of one std) beside
the training episodes' returns (bc_offline.py's runs: the training loss) read back from the run's
tensorboard events.

    python tools/plot_run.py runs/<run>
"""

import csv
import json
import os
import sys

import numpy as np


def write_curve(run_dir: str) -> str:
    try:
        with open(os.path.join(run_dir, "args.json"), "rb") as f:
            offline = json.loads(f.read()).get("script") == "bc_offline"
    except (OSError, ValueError, AttributeError):
        offline = False
    tag, x = ("losses/bc_loss", "SGD updates") if offline else ("charts/episodic_return", "env steps")
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
    from tensorboard.util.tensor_util import make_ndarray

    with open(os.path.join(run_dir, "eval.csv"), newline="") as f:
        rows = sorted((int(r["step"]), float(r["mean"]), float(r["std"])) for r in csv.DictReader(f))
    train = []
    for name in sorted(n for n in os.listdir(run_dir) if n.startswith("events.out.tfevents.")):
        for event in EventFileLoader(os.path.join(run_dir, name)).Load():  # scalars come back as tensors
            train += [(event.step, make_ndarray(v.tensor).item()) for v in event.summary.value if v.tag == tag]
    fig = Figure(figsize=(11, 4), layout="constrained")
    FigureCanvasAgg(fig)
    left, right = fig.subplots(1, 2)
    if rows:
        steps, mean, std = (np.array(column) for column in zip(*rows))
        left.plot(steps, mean, marker="o")
        left.fill_between(steps, mean - std, mean + std, alpha=0.25)
    left.set(title="evaluation return (mean, band of one std)", xlabel=x, ylabel="return")
    if train:
        right.plot(*zip(*sorted(train)), linewidth=0.8)
    right.set(title=f"training ({tag})", xlabel=x)
    fig.suptitle(os.path.basename(os.path.abspath(run_dir)))
    path = os.path.join(run_dir, "curve.png")
    tmp = f"{path}.tmp.{os.getpid()}"
    try:
        fig.savefig(tmp, format="png", dpi=100)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return path


if __name__ == "__main__":
    if len(sys.argv) != 2 or not os.path.isfile(os.path.join(sys.argv[1], "eval.csv")):
        sys.exit("usage: python tools/plot_run.py RUN_DIR (a run folder with an eval.csv)")
    print(write_curve(sys.argv[1]))
