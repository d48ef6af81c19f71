"""Resident memory of dqn_prioritized.py's replay for 84x84 Atari frames (or MinAtar's bool
feature planes), per transition.

    python tests/replay_memory.py --layout compressed --capacity 1000000
    python tests/replay_memory.py --layout naive --capacity 100000
    python tests/replay_memory.py --layout planes --channels 4 --capacity 100000

Fills a replay of `capacity` transitions (frame stacks of 4, one env, 1-step rows, episodes of
`--episode` steps) and prints one JSON line: bytes per transition from the RSS growth (what the
process really holds) and from the arrays' sizes. 'compressed' is the script's FrameStore layout
(rows of frame numbers, each frame kept once); 'naive' stores obs and next_obs as pixel stacks;
'planes' stores MinAtar's 10x10xC bool observations as they are.
Used by tests/test_dqn_atari.py and by ./benchmark.sh atari.
"""

import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from helpers import load_script  # noqa: E402


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def fill(layout: str, capacity: int, episode: int, chunk: int = 1024, channels: int = 4) -> dict:
    load_script("dqn_prioritized")  # its imports (jax, cpprb, ...) are not the replay's memory
    before = rss_bytes()
    replay = (
        filled_planes(capacity, channels) if layout == "planes" else filled_replay(layout, capacity, episode, chunk)
    )
    replay.flush()
    grown = rss_bytes() - before
    arrays = replay.write_count.nbytes + replay.priority.nbytes
    arrays += sum(v.nbytes for v in replay.buffer.get_all_transitions().values())
    if replay.frames is not None:
        arrays += replay.frames.ring.nbytes
    return {
        "layout": layout,
        "capacity": capacity,
        "episode": episode,
        "rss_bytes": grown,
        "rss_bytes_per_transition": grown / capacity,
        "array_bytes_per_transition": arrays / capacity,
        "frames_written": replay.frames.written if replay.frames is not None else None,
        **({"channels": channels} if layout == "planes" else {}),
    }


def filled_planes(capacity: int, channels: int, chunk: int = 1024):
    """dqn_prioritized.PrioritizedReplay holding `capacity` transitions of random 10x10xC bool planes."""
    dqn = load_script("dqn_prioritized")
    rng = np.random.default_rng(0)
    replay = dqn.PrioritizedReplay(capacity, (10, 10, channels), np.bool_, 0.6, 1e-6)
    obs = rng.random((chunk + 1, 10, 10, channels)) < 0.1
    added = 0
    while added < capacity:
        rows = min(chunk, capacity - added)
        replay.add(
            {
                "obs": obs[:rows],
                "next_obs": obs[1 : rows + 1],
                "action": np.zeros(rows, np.int64),
                "reward": np.zeros(rows, np.float32),
                "discount": np.full(rows, 0.99, np.float32),
            }
        )
        added += rows
    replay.flush()
    return replay


def filled_replay(layout: str, capacity: int, episode: int, chunk: int = 1024):
    """dqn_prioritized.PrioritizedReplay holding `capacity` transitions of random 84x84 frames."""
    dqn = load_script("dqn_prioritized")
    rng = np.random.default_rng(0)
    frames = None
    if layout == "compressed":
        frames = dqn.FrameStore(capacity, 1, (84, 84))  # its ring: capacity + 10% + a constant
    replay = dqn.PrioritizedReplay(capacity, (4, 84, 84), np.uint8, 0.6, 1e-6, frames)
    # Random frames (incompressible); a chunk of stacks is built once per call and reused.
    obs = rng.integers(0, 256, (chunk + 4, 84, 84), dtype=np.uint8)
    stacks = np.lib.stride_tricks.sliding_window_view(obs, 4, axis=0).transpose(0, 3, 1, 2)

    def first_stack(i):  # an episode's first stack: zero frames, then its first (as the ALE's)
        return np.concatenate([np.zeros((1, 3, 84, 84), np.uint8), stacks[i : i + 1, -1:]], axis=1)

    if frames is not None:
        frames.start(first_stack(0), np.array([0]))
    added, t = 0, 0
    while added < capacity:
        rows = min(chunk, capacity - added)
        if frames is None:
            batch = {"obs": stacks[:rows], "next_obs": stacks[1 : rows + 1]}
        else:
            batch = {"obs": np.empty((rows, 4), np.int64), "next_obs": np.empty((rows, 4), np.int64)}
            for i in range(rows):
                batch["obs"][i] = frames.stack[0]
                done = np.array([(t + 1) % episode == 0])
                reached, _ = frames.advance(stacks[i + 1 : i + 2], first_stack(i) if done[0] else None, done)
                batch["next_obs"][i] = reached[0]
                t += 1
        batch.update(
            action=np.zeros(rows, np.int64), reward=np.zeros(rows, np.float32), discount=np.full(rows, 0.99, np.float32)
        )
        replay.add(batch)
        added += rows
    replay.flush()
    return replay


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--layout", choices=("compressed", "naive", "planes"), required=True)
    parser.add_argument("--capacity", type=int, required=True)
    parser.add_argument("--episode", type=int, default=1000, help="steps per episode")
    parser.add_argument("--channels", type=int, default=4, help="planes: MinAtar channels (Breakout 4, Seaquest 10)")
    a = parser.parse_args()
    print(json.dumps(fill(a.layout, a.capacity, a.episode, channels=a.channels)))
