"""Where should Ape-X's replay live? Measured side by side, in one process, on a local Ray:

  in the learner: the learner adds the actors' chunks and samples from memory (apex_dqn.py);
  a Ray actor:   the replay is its own process; chunks go to it and every sample comes back
                 through Ray's object store (an extra round trip per learner call).

For the same replay class (apex_dqn.PrioritizedReplay), rows and call sizes, this times
  sample: one learner call's worth (K minibatches of B rows), until the arrays are in the
          learner's process;
  add:    one actor chunk (50 rows with their priorities).
Median of --repeats calls after a warm-up, for CartPole's rows (K = 32, B = 128) and Atari's
(84x84x4 uint8 stacks, K = 1, B = 512).

    python benchmark/apex_replay_placement.py [--repeats 200] [--out results/apex_replay_placement.json]
"""

import argparse
import json
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # loopback only
from benchmark_summary import machine  # noqa: E402
from helpers import load_script  # noqa: E402

apex = load_script("apex_dqn")
import numpy as np  # noqa: E402
import ray  # noqa: E402

ray.cloudpickle.register_pickle_by_value(apex)  # the replay actor gets the class by value

CASES = {
    "cartpole": {"obs_shape": (4,), "obs_dtype": np.float32, "capacity": 50_000, "K": 32, "B": 128},
    "atari": {"obs_shape": (4, 84, 84), "obs_dtype": np.uint8, "capacity": 4_000, "K": 1, "B": 512},
}
CHUNK = 50


def chunk(case: dict, rng) -> tuple:
    obs = rng.integers(0, 255, (CHUNK,) + case["obs_shape"]).astype(case["obs_dtype"])
    rows = {
        "obs": obs,
        "next_obs": obs.copy(),
        "action": rng.integers(0, 4, CHUNK),
        "reward": rng.normal(size=CHUNK).astype(np.float32),
        "discount": np.full(CHUNK, 0.99, np.float32),
    }
    return rows, rng.random(CHUNK) + 0.1


class ReplayServer:
    """The replay as a Ray actor."""

    def __init__(self, case: dict):
        self.replay = apex.PrioritizedReplay(case["capacity"], case["obs_shape"], case["obs_dtype"], 0.6, 1e-6)

    def add(self, rows, priorities):
        self.replay.add(rows, priorities)

    def sample(self, batch_size, num_batches):
        return self.replay.sample(batch_size, num_batches)


def median_us(call, repeats: int) -> float:
    for _ in range(10):
        call()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        call()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e6


def measure(name: str, case: dict, repeats: int) -> dict:
    rng = np.random.default_rng(0)
    fill = case["capacity"] // CHUNK
    local = apex.PrioritizedReplay(case["capacity"], case["obs_shape"], case["obs_dtype"], 0.6, 1e-6)
    server = ray.remote(num_cpus=0)(ReplayServer).remote(case)
    chunks = [chunk(case, rng) for _ in range(8)]
    # As an actor's chunk arrives: already in the object store; either side fetches it from there.
    refs = [(ray.put(rows), ray.put(priorities)) for rows, priorities in chunks]
    for i in range(fill):
        local.add(*chunks[i % 8])
        ray.get(server.add.remote(*refs[i % 8]))
    K, B = case["K"], case["B"]
    result = {
        "sample_in_learner_us": median_us(lambda: local.sample(B, K), repeats),
        "sample_ray_actor_us": median_us(lambda: ray.get(server.sample.remote(B, K)), repeats),
        "add_in_learner_us": median_us(lambda: local.add(*ray.get(list(refs[0]))), repeats),
        "add_ray_actor_us": median_us(lambda: ray.get(server.add.remote(*refs[0])), repeats),
    }
    result.update(case=name, K=K, B=B, rows=fill * CHUNK, repeats=repeats)
    result["obs_shape"], result["obs_dtype"] = list(case["obs_shape"]), np.dtype(case["obs_dtype"]).name
    ray.kill(server)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    ray.init(num_cpus=2, include_dashboard=False, configure_logging=False)
    try:
        results = [measure(name, CASES[name], args.repeats) for name in args.cases]
    finally:
        ray.shutdown()
    report = {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "machine": machine(),
        "ray": ray.__version__,
        "results": results,
    }
    for r in results:
        ratio = r["sample_ray_actor_us"] / r["sample_in_learner_us"]
        print(
            f"{r['case']:8s} sample K={r['K']} B={r['B']}: in learner {r['sample_in_learner_us']:8.0f} us, "
            f"Ray actor {r['sample_ray_actor_us']:8.0f} us ({ratio:.1f}x)"
            f"; add {CHUNK} rows: {r['add_in_learner_us']:6.0f} us vs {r['add_ray_actor_us']:6.0f} us"
        )
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=2)


if __name__ == "__main__":
    main()
