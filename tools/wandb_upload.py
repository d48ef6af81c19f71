"""Upload a run folder to Weights & Biases: its flags (args.json) as the config, every tensorboard scalar
at its global step, and the evaluation videos (videos/*-step-N-episode-0.mp4) at theirs. It reads what any
run of any of the scripts wrote, during the run or after it.
The W&B run's id is the folder's name, so a second upload of the same folder goes to the same run (and so
does a run with --track: this tool is for folders written without it). wandb's files go to WANDB_DIR, else
./wandb, never into the run folder (a symlink there would stop its --resume).

    python tools/wandb_upload.py runs/<run> --project jax-offpolicy-rl [--entity TEAM]
    WANDB_MODE=offline python tools/wandb_upload.py runs/<run>   # no login; `wandb sync` uploads it later
"""

import argparse
import collections
import glob
import json
import os
import re
import sys


def upload(run_dir: str, project: str, entity=None) -> str:
    import wandb
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
    from tensorboard.util.tensor_util import make_ndarray

    with open(os.path.join(run_dir, "args.json"), "rb") as f:
        saved = json.loads(f.read())
    config = saved.get("args") if isinstance(saved, dict) else None
    if not isinstance(config, dict):
        raise ValueError(f"{run_dir}/args.json holds no flags")
    rows = collections.defaultdict(dict)  # global step: {tag: value}
    for path in sorted(glob.glob(os.path.join(run_dir, "events.out.tfevents.*"))):
        for event in EventFileLoader(path).Load():  # a resumed run's files repeat steps: the later file wins
            for value in event.summary.value:
                rows[event.step][value.tag] = make_ndarray(value.tensor).item()
    for video in glob.glob(os.path.join(run_dir, "videos", "*-step-*-episode-0.mp4")):
        if os.path.islink(video):  # the folder's own files only
            continue
        step = int(re.search(r"-step-(\d+)-episode-0\.mp4$", video).group(1))
        rows[step]["videos/eval"] = wandb.Video(video, format="mp4")
    name = os.path.basename(os.path.abspath(run_dir))
    run_id = re.sub(r"[^A-Za-z0-9_-]", "-", name)[-64:]
    run = wandb.init(project=project, entity=entity, name=name, id=run_id, config=config, resume="allow")
    run.define_metric("*", step_metric="global_step")
    for step in sorted(rows):
        run.log({**rows[step], "global_step": step})
    run.finish()
    return run_id


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir")
    parser.add_argument("--project", default="jax-offpolicy-rl")
    parser.add_argument("--entity", default=None)
    options = parser.parse_args()
    if not os.path.isfile(os.path.join(options.run_dir, "args.json")):
        sys.exit(f"wandb_upload.py: error: {options.run_dir} is not a run folder (no args.json)")
    print(upload(options.run_dir, options.project, options.entity))
