"""Checkpoint a DQN training state plus its replay buffer two ways, and time them: npz and orbax.

  npz:   one uncompressed np.savez into a temp file in the same folder, flush + fsync, os.replace onto
         checkpoint.npz; restore with np.load(allow_pickle=False), reading every member into memory.
  orbax: ocp.CheckpointManager (max_to_keep=2, synchronous), StandardSave / StandardRestore into an
         abstract tree of jax.ShapeDtypeStruct.
The tree: MLP params 4-120-84-2 (jax float32), Adam mu and nu of the same shapes, and a replay buffer of
N rows (numpy: obs, next_obs, action int64, reward, discount, priority float64), N = 50_000 and 1_000_000.
Save and restore: median of 3, wall clock (restores read from the page cache). Also: the time to import
orbax.checkpoint in a fresh interpreter (less a bare `python -c pass`), how orbax answers a restore into a
wrong abstract tree or from a damaged folder, and which threads it leaves running.

    python benchmark/checkpoint_bench.py [--work /tmp/ckbench] [--out /tmp/ckbench/result.json]
"""

import argparse
import gc
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

REPEATS = 3
SIZES = (50_000, 1_000_000)
LAYERS = ((4, 120), (120, 84), (84, 2))


def build_tree(n, seed=0):
    import jax.numpy as jnp

    rng = np.random.default_rng(seed)

    def mlp():
        out = {}
        for i, (fan_in, fan_out) in enumerate(LAYERS):
            out[f"dense_{i}"] = {
                "kernel": jnp.asarray(rng.standard_normal((fan_in, fan_out), dtype=np.float32)),
                "bias": jnp.asarray(rng.standard_normal(fan_out, dtype=np.float32)),
            }
        return out

    replay = {
        "obs": rng.standard_normal((n, 4), dtype=np.float32),
        "next_obs": rng.standard_normal((n, 4), dtype=np.float32),
        "action": rng.integers(0, 2, size=(n, 1), dtype=np.int64),
        "reward": rng.standard_normal((n, 1), dtype=np.float32),
        "discount": np.full((n, 1), 0.99, np.float32),
        "priority": rng.random(n),
    }
    return {"params": mlp(), "opt_state": {"mu": mlp(), "nu": mlp()}, "replay": replay}


def flatten(tree, prefix=""):
    flat = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten(value, name + "/"))
        else:
            flat[name] = value
    return flat


def unflatten(flat):
    tree = {}
    for name, value in flat.items():
        *parents, leaf = name.split("/")
        node = tree
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return tree


def abstract(tree):
    import jax

    return jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), tree)


def same(a, b):
    fa, fb = flatten(a), flatten(b)
    return fa.keys() == fb.keys() and all(
        np.asarray(fa[k]).dtype == np.asarray(fb[k]).dtype and np.array_equal(np.asarray(fa[k]), np.asarray(fb[k]))
        for k in fa
    )


def folder_bytes(path):
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)


def npz_save(tree, path):
    flat = {k: np.asarray(v) for k, v in flatten(tree).items()}
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".checkpoint-", suffix=".npz")
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **flat)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def npz_restore(path):
    with np.load(path, allow_pickle=False) as z:
        return unflatten({k: z[k] for k in z.files})


def manager(directory):
    import orbax.checkpoint as ocp

    options = ocp.CheckpointManagerOptions(max_to_keep=2, enable_async_checkpointing=False)
    return ocp.CheckpointManager(directory, options=options)


def orbax_save(mngr, step, tree):
    import orbax.checkpoint as ocp

    mngr.save(step, args=ocp.args.StandardSave(tree))
    mngr.wait_until_finished()


def orbax_restore(mngr, step, target):
    import orbax.checkpoint as ocp

    return mngr.restore(step, args=ocp.args.StandardRestore(target))


def timed(fn):
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def median_times(fn):
    times, out = [], None
    for _ in range(REPEATS):
        seconds, out = timed(fn)
        times.append(seconds)
    return {"median_s": round(statistics.median(times), 4), "runs_s": [round(t, 4) for t in times]}, out


def bench_size(n, work):
    tree = build_tree(n)
    row = {"N": n, "leaf_bytes": int(sum(np.asarray(v).nbytes for v in flatten(tree).values()))}

    folder = os.path.join(work, f"npz_{n}")
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder)
    path = os.path.join(folder, "checkpoint.npz")
    save, _ = median_times(lambda: npz_save(tree, path))
    restore, back = median_times(lambda: npz_restore(path))
    row["npz"] = {"save": save, "restore": restore, "bytes": os.path.getsize(path), "roundtrip_equal": same(tree, back)}

    folder = os.path.join(work, f"orbax_{n}")
    shutil.rmtree(folder, ignore_errors=True)
    create_s, mngr = timed(lambda: manager(folder))
    steps = iter(range(REPEATS))
    save, _ = median_times(lambda: orbax_save(mngr, next(steps), tree))
    step = mngr.latest_step()
    target = abstract(tree)
    restore, back = median_times(lambda: orbax_restore(mngr, step, target))
    row["orbax"] = {
        "manager_create_s": round(create_s, 4),
        "save": save,
        "restore": restore,
        "bytes": folder_bytes(os.path.join(folder, str(step))),
        "files": sum(len(f) for _, _, f in os.walk(os.path.join(folder, str(step)))),
        "steps_kept": sorted(mngr.all_steps()),
        "roundtrip_equal": same(tree, back),
        "restored_types": sorted({type(v).__module__ + "." + type(v).__name__ for v in flatten(back).values()}),
    }
    mngr.close()
    return row


def import_seconds(code):
    times = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def import_cost():
    bare = import_seconds("pass")
    jax_s = import_seconds("import jax")
    orbax_s = import_seconds("import orbax.checkpoint")
    return {
        "bare_python_s": round(bare, 3),
        "import_jax_s": round(jax_s - bare, 3),
        "import_orbax_checkpoint_s": round(orbax_s - bare, 3),
    }


class StderrLines:
    """Count the lines written to file descriptor 2 (Python and C++ alike) inside the block."""

    def __enter__(self):
        sys.stderr.flush()
        self.saved = os.dup(2)
        self.file = tempfile.TemporaryFile()
        os.dup2(self.file.fileno(), 2)
        return self

    def __exit__(self, *exc):
        gc.collect()
        time.sleep(0.3)  # let the event loop's threads finish writing
        sys.stderr.flush()
        os.dup2(self.saved, 2)
        os.close(self.saved)
        self.file.seek(0)
        lines = self.file.read().decode(errors="replace").splitlines()
        self.lines = len(lines)
        heads = dict.fromkeys(line[:160] for line in lines if line and not line[0].isspace())
        self.sample = list(heads)[:6]
        self.file.close()


def attempt(folder, target, check):
    """Restore the latest step of folder into target; what came back, or what was raised."""
    with StderrLines() as noise:
        mngr = manager(folder)
        try:
            back = orbax_restore(mngr, mngr.latest_step(), target)
            result = {"raises": False, **check(flatten(back))}
        except Exception as e:
            text = str(e)
            result = {
                "raises": True,
                "type": type(e).__module__ + "." + type(e).__qualname__,
                "message_lines": len(text.splitlines()),
                "message_chars": len(text),
                "first_line": text.splitlines()[0][:200] if text else "",
            }
        finally:
            mngr.close()
    result["stderr_lines"] = noise.lines
    if noise.lines:
        result["stderr_distinct_heads"] = noise.sample
    return result


def leaf(name, want_shape, want_dtype, saved):
    def check(flat):
        if name not in flat:
            return {"restored": "leaf absent from result", "keys": len(flat)}
        got, old = np.asarray(flat[name]), np.asarray(saved)
        common = tuple(slice(0, min(a, b)) for a, b in zip(got.shape, old.shape))
        out = {
            "restored_type": type(flat[name]).__name__,
            "restored_shape": list(got.shape),
            "restored_dtype": str(got.dtype),
            "matches_request": list(got.shape) == list(want_shape) and got.dtype == np.dtype(want_dtype),
            "overlap_equal_to_saved": bool(np.array_equal(got[common], old[common].astype(got.dtype))),
        }
        if got.size > old.size:
            pad = np.ones(got.shape, bool)
            pad[common] = False
            out["extra_entries_all_zero"] = bool(np.all(got[pad] == 0))
        return out

    return check


def refusals(work):
    import jax

    tree = build_tree(1000, seed=1)
    tree["replay"]["action"][0, 0] = 2**33 + 5  # does a cast to int32 wrap it?
    base = os.path.join(work, "refuse_base")
    shutil.rmtree(base, ignore_errors=True)
    mngr = manager(base)
    orbax_save(mngr, 0, tree)
    mngr.close()
    replay, kernel = tree["replay"], tree["params"]["dense_0"]["kernel"]
    cases = {}

    def sds(shape, dtype):
        return jax.ShapeDtypeStruct(shape, dtype)

    def wrong(path, value, check):
        target = abstract(tree)
        node = target
        for part in path[:-1]:
            node = node[part]
        if value is None:
            del node[path[-1]]
        else:
            node[path[-1]] = value
        return attempt(base, target, check)

    obs = ("replay", "obs")
    cases["1_obs_shape_1000x5"] = wrong(
        obs, sds((1000, 5), np.float32), leaf("replay/obs", (1000, 5), np.float32, replay["obs"])
    )
    cases["1b_obs_shape_1000x5_numpy_target"] = wrong(
        obs, np.empty((1000, 5), np.float32), leaf("replay/obs", (1000, 5), np.float32, replay["obs"])
    )
    cases["1c_obs_shape_1000x3"] = wrong(
        obs, sds((1000, 3), np.float32), leaf("replay/obs", (1000, 3), np.float32, replay["obs"])
    )
    k0 = ("params", "dense_0", "kernel")
    cases["1d_jax_kernel_shape_4x121"] = wrong(
        k0, sds((4, 121), np.float32), leaf("params/dense_0/kernel", (4, 121), np.float32, kernel)
    )
    cases["1e_jax_kernel_shape_4x100"] = wrong(
        k0, sds((4, 100), np.float32), leaf("params/dense_0/kernel", (4, 100), np.float32, kernel)
    )

    def cast_check(flat):
        out = leaf("replay/action", (1000, 1), np.int32, replay["action"])(flat)
        out["row0_saved"] = int(replay["action"][0, 0])
        out["row0_restored"] = int(np.asarray(flat["replay/action"])[0, 0])
        return out

    cases["2_action_dtype_int32"] = wrong(("replay", "action"), sds((1000, 1), np.int32), cast_check)
    cases["2b_obs_dtype_float16"] = wrong(
        obs, sds((1000, 4), np.float16), leaf("replay/obs", (1000, 4), np.float16, replay["obs"])
    )

    cases["3_leaf_not_in_file"] = wrong(
        ("replay", "mask"), sds((1000, 1), np.float32), lambda flat: {"keys": len(flat)}
    )
    cases["3b_file_leaf_not_in_target"] = wrong(
        ("replay", "priority"), None, lambda flat: {"keys": len(flat), "priority_in_result": "replay/priority" in flat}
    )

    def differing(flat):
        saved = flatten(tree)
        bad = [k for k in saved if k not in flat or not np.array_equal(np.asarray(flat[k]), np.asarray(saved[k]))]
        return {"keys": len(flat), "equal_to_saved": not bad, "leaves_differing": bad}

    for how in ("deleted", "truncated", "corrupted_1of4", "corrupted_2of4", "corrupted_3of4"):
        folder = os.path.join(work, f"refuse_{how}")
        shutil.rmtree(folder, ignore_errors=True)
        shutil.copytree(base, folder)
        data = [
            os.path.join(d, f)
            for d, _, files in os.walk(os.path.join(folder, "0"))
            for f in files
            if os.path.basename(d) == "d"
        ]
        victim = max(data, key=os.path.getsize)
        size = os.path.getsize(victim)
        if how == "deleted":
            os.unlink(victim)
        elif how == "truncated":
            with open(victim, "r+b") as f:
                f.truncate(size // 2)
        else:  # same size, 4 KiB overwritten at k/4 of the file
            with open(victim, "r+b") as f:
                f.seek(size * int(how[-4]) // 4)
                f.write(b"\xa5" * 4096)
        result = attempt(folder, abstract(tree), differing)
        result["damaged"] = {"file": os.path.relpath(victim, folder), "bytes": size, "data_files": len(data)}
        cases[f"4_data_file_{how}"] = result
    return cases


def thread_names():
    return sorted(t.name for t in threading.enumerate())


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", default="/tmp/ckbench")
    parser.add_argument("--out", default=None, help="JSON summary (default: WORK/result.json)")
    args = parser.parse_args()
    os.makedirs(args.work, exist_ok=True)

    import absl.logging
    import jax
    import orbax.checkpoint as ocp

    absl.logging.set_verbosity(absl.logging.ERROR)
    threads = {"before_orbax": thread_names()}
    result = {
        "versions": {"orbax_checkpoint": ocp.__version__, "jax": jax.__version__, "numpy": np.__version__},
        "python": sys.version.split()[0],
        "cpus": os.cpu_count(),
        "sizes": [bench_size(n, args.work) for n in SIZES],
    }
    threads["after_benchmarks_closed"] = thread_names()
    result["refusals"] = refusals(args.work)
    threads["after_refusals_closed"] = thread_names()
    mngr = manager(os.path.join(args.work, "threads_probe"))
    orbax_save(mngr, 0, build_tree(1000))
    threads["after_save_manager_open"] = thread_names()
    orbax_restore(mngr, 0, abstract(build_tree(1000)))
    threads["after_restore_manager_open"] = thread_names()
    mngr.close()
    time.sleep(1.0)
    threads["after_close_plus_1s"] = thread_names()
    threads["count"] = {k: len(v) for k, v in threads.items()}
    threads["new_after_close"] = sorted(set(threads["after_close_plus_1s"]) - set(threads["before_orbax"]))
    result["threads"] = threads
    result["import"] = import_cost()

    text = json.dumps(result, indent=2)
    print(text)
    with open(args.out or os.path.join(args.work, "result.json"), "w") as f:
        f.write(text + "\n")


if __name__ == "__main__":
    main()
