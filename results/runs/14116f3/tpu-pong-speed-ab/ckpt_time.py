"""Issue 57 item 1: time a checkpoint write and read of a full --preset atari replay (the script's own save_npz,
load_npz and load_state_dict) in each of DIRS. usage: python3 .whl-tpu/ckpt_time.py BUFFER DIR [DIR ...]"""
import json, os, sys, time
import gymnasium as gym
import numpy as np
sys.path.insert(0, "algos")
import dqn_prioritized as dqn

size, dirs = int(sys.argv[1]), sys.argv[2:]
args = dqn.parse_args(["--env-id", "ALE/Pong-v5", "--preset", "atari", "--buffer-size", str(size)])
space = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
t = time.time()
replay, _ = dqn.make_replay(args, space)
fs = replay.frames
fs.frames[:] = (np.arange(fs.capacity, dtype=np.uint8) % 251)[:, None, None]  # not zeros: no sparse files
fs.written = fs.capacity + 5
chunk = 100_000
for start in range(0, size, chunk):
    n = min(chunk, size - start)
    f = (start + np.arange(n))[:, None] + np.arange(4)
    replay.buffer.add(obs=f, action=np.zeros(n, np.int64), reward=np.ones(n, np.float32), next_obs=f + 1,
                      discount=np.full(n, 0.99, np.float32), priorities=np.ones(n))
replay.priority[:size] = 1.0
print(f"filled {size:,} rows, {fs.capacity:,} frames ({fs.frames.nbytes / 1e9:.2f} GB) in {time.time() - t:.1f} s", flush=True)
meta = {"format": dqn.FORMAT, "script": dqn.SCRIPT, "kind": "checkpoint", "args": {}}
for d in dirs:
    path = os.path.join(d, "ckpt-time.npz")
    t = time.time(); dqn.save_npz(path, meta, replay.state_dict()); w = time.time() - t
    gb = os.path.getsize(path) / 1e9
    t = time.time(); _, arrays = dqn.load_npz(path, "checkpoint"); replay.load_state_dict(arrays, path, 6); r = time.time() - t
    del arrays; os.remove(path)
    print(json.dumps(dict(dir=d, rows=size, file_gb=round(gb, 2), write_s=round(w, 1), read_s=round(r, 1))), flush=True)
