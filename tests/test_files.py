"""Files someone else wrote (issue 12): a checkpoint or model is read without pickle, and every
hostile, cut-short or foreign file ends in one line, exit 2, with no code run and no traceback.
Writes are atomic: an interrupted or failed write leaves the previous file whole. DQN (issue 26)
loads a model through tools/dqn_evaluate.py, checks the values in a checkpoint too (actions,
discounts, priorities, counters) and writes into no run folder that holds a symlink."""

import json
import os
import pickle
import shutil
import subprocess
import sys

import numpy as np
import pytest
from helpers import ROOT, load_script

dqn, sac, bc = (load_script(n) for n in ("dqn_prioritized", "sac", "bc_offline"))
MODULES = {"dqn": dqn, "sac": sac, "bc": bc}
TOOLS = {name: os.path.join(ROOT, "tools", f"{name}_evaluate.py") for name in ("dqn", "sac", "bc")}
# DQN's and SAC's small run
ONLINE = (
    "--hidden-sizes 16 --learning-starts 100 --batch-size 16 --buffer-size 1000 "
    "--updates-per-call 4 --eval-episodes 1 --eval-every 10000 --total-timesteps 300"
).split()
RUNS = {
    "dqn": ONLINE,
    "sac": ONLINE,
    "bc": [
        "--hidden-sizes",
        "16",
        "--batch-size",
        "16",
        "--updates-per-call",
        "10",
        "--eval-episodes",
        "1",
        "--eval-every",
        "10000",
        "--total-updates",
        "50",
        "--dataset",
        os.path.join(ROOT, "data", "pendulum-sac-expert.hdf5"),
    ],
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """One finished small run per script: its folder holds args.json, checkpoint.npz, model.npz."""
    out = {}
    for name, argv in RUNS.items():
        run_dir = str(tmp_path_factory.mktemp(name) / "run")
        assert MODULES[name].cli(argv + ["--run-dir", run_dir]) == 0
        out[name] = run_dir
    return out


def read(path):
    with np.load(path, allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


def write(path, arrays, meta=None):
    if meta is not None:
        arrays = {**arrays, "meta.json": np.frombuffer(json.dumps(meta).encode(), np.uint8)}
    with open(path, "wb") as f:
        np.savez(f, **arrays)


def meta_of(arrays):
    return json.loads(arrays["meta.json"].tobytes())


class Evil:
    """Unpickling this runs a shell command that leaves a marker file."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def copy_run(src, dst):
    shutil.copytree(src, dst)
    return str(dst)


def refused(module, argv, capsys, *words):
    capsys.readouterr()
    assert module.cli(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    for word in words:
        assert word in err, err
    return err


def evaluation_refused(script, path, *words):
    """tools/dqn_evaluate.py (bc_evaluate.py) FILE, in a process of its own: exit 2 and one line."""
    out = subprocess.run([sys.executable, TOOLS[script], str(path)], capture_output=True, text=True, timeout=300)
    err = out.stderr.strip()
    assert out.returncode == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, (out.returncode, err)
    for word in words:
        assert word in err, err
    return err


def saver(module):
    """(the writer of .npz files, the format tag)."""
    return module.save_npz, module.FORMAT


# --- what a hostile or damaged file can be --------------------------------------------------


def _pickle_protocol_5(path, arrays, marker):
    with open(path, "wb") as f:
        pickle.dump({"format": "x", "evil": Evil(marker)}, f, protocol=5)


def _pickle_protocol_0(path, arrays, marker):  # no \x80 header: np.load itself must refuse it
    with open(path, "wb") as f:
        pickle.dump(Evil(marker), f, protocol=0)


def _object_member(path, arrays, marker):  # a pickle inside the zip, as an object array
    arrays = dict(arrays)
    arrays["evil"] = np.array([Evil(marker)], dtype=object)
    with open(path, "wb") as f:
        np.savez(f, **arrays)


def _cut_short(path, arrays, marker):  # what a full disk or an interrupted copy leaves
    write(path, arrays)
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.truncate(size // 2)


def _garbage(path, arrays, marker):
    # Fixed bytes: random ones start with pickle's PROTO opcode 0x80 one time in 256, and that
    # file is (rightly) refused as an old pickle instead, with another message.
    data = np.random.default_rng(0).bytes(3000)
    assert data[:1] != b"\x80"
    with open(path, "wb") as f:
        f.write(data)


def _no_meta(path, arrays, marker):
    write(path, {k: v for k, v in arrays.items() if k != "meta.json"})


def _meta_not_json(path, arrays, marker):
    write(path, {**arrays, "meta.json": np.frombuffer(b"{not json", np.uint8)})


def _foreign_format(path, arrays, marker):
    other = "sac/2" if meta_of(arrays)["format"] != "sac/2" else "dqn_prioritized/2"
    write(path, {k: v for k, v in arrays.items() if k != "meta.json"}, {**meta_of(arrays), "format": other})


def _wrong_shape(path, arrays, marker):
    arrays = dict(arrays)
    name = next(k for k in arrays if k.endswith("kernel"))
    arrays[name] = np.zeros(arrays[name].shape[:-1] + (arrays[name].shape[-1] + 1,), np.float32)
    write(path, arrays)


def _wrong_dtype(path, arrays, marker):
    arrays = dict(arrays)
    name = next(k for k in arrays if k.endswith("kernel"))
    arrays[name] = arrays[name].astype(np.float64)
    write(path, arrays)


def _missing_leaf(path, arrays, marker):
    name = next(k for k in arrays if k.endswith("bias"))
    write(path, {k: v for k, v in arrays.items() if k != name})


def _extra_leaf(path, arrays, marker):
    prefix = next(k for k in arrays if k.endswith("kernel")).split("/")[0]
    write(path, {**arrays, f"{prefix}/params/Dense_9/kernel": np.zeros((2, 2), np.float32)})


def _flag_of_wrong_type(path, arrays, marker):
    meta = meta_of(arrays)
    meta["args"]["hidden_sizes"] = "16; rm -rf /"
    write(path, {k: v for k, v in arrays.items() if k != "meta.json"}, meta)


def _env_id_naming_a_module(path, arrays, marker):
    meta = meta_of(arrays)
    meta["args"]["env_id"] = "os:system"
    if "env_id" in meta:
        meta["env_id"] = "os:system"
    write(path, {k: v for k, v in arrays.items() if k != "meta.json"}, meta)


def _member_not_npy(path, arrays, marker):  # np.load hands such a member back as raw bytes
    import zipfile

    write(path, arrays)
    with zipfile.ZipFile(path, "a") as z:
        z.writestr("key", b"raw bytes, not an array")


def _meta_nested_too_deep(path, arrays, marker):  # json.loads raises RecursionError
    write(path, {**arrays, "meta.json": np.frombuffer(b"[" * 200_000, np.uint8)})


HOSTILE = {
    "member-not-npy": (_member_not_npy, "not an array"),
    "meta-too-deep": (_meta_nested_too_deep, "not a"),
    "pickle5": (_pickle_protocol_5, "pickle"),
    "pickle0": (_pickle_protocol_0, "not a readable"),
    "object-array": (_object_member, "not a readable"),
    "cut-short": (_cut_short, "not a readable"),
    "garbage": (_garbage, "not a readable"),
    "no-meta": (_no_meta, "not a"),
    "meta-not-json": (_meta_not_json, "not a"),
    "foreign-format": (_foreign_format, "not a"),
    "wrong-shape": (_wrong_shape, "expected float32"),
    "wrong-dtype": (_wrong_dtype, "expected float32"),
    "missing-leaf": (_missing_leaf, "missing"),
    "extra-leaf": (_extra_leaf, "unexpected array"),
    "flag-type": (_flag_of_wrong_type, "hidden"),
    "env-module": (_env_id_naming_a_module, "module"),
}


@pytest.mark.parametrize("kind", ["model", "checkpoint"])
@pytest.mark.parametrize("hostile", list(HOSTILE))
@pytest.mark.parametrize("script", list(MODULES))
def test_hostile_file_is_refused_in_one_line_and_runs_no_code(script, hostile, kind, runs, tmp_path, capsys):
    # DQN's and BC's evaluation tools read a checkpoint's own flags: those are tested through them.
    by_tool = script in TOOLS and (kind == "model" or hostile in ("flag-type", "env-module"))
    if kind == "checkpoint" and hostile in ("flag-type", "env-module") and not by_tool:
        pytest.skip("--resume takes the flags from args.json: test_hostile_args_json")
    module, make = MODULES[script], HOSTILE[hostile][0]
    marker = tmp_path / "code-ran"
    run_dir = copy_run(runs[script], tmp_path / "run")
    target = os.path.join(run_dir, f"{kind}.npz")
    make(target, read(target), marker)
    if by_tool:
        evaluation_refused(script, target, HOSTILE[hostile][1])
        assert not marker.exists(), "loading the file ran code"
        return
    if kind == "model":
        argv = ["--eval-only", "--load", target]
    else:
        argv = ["--resume", run_dir, "--total-updates" if script == "bc" else "--total-timesteps", "400"]
    refused(module, argv, capsys, HOSTILE[hostile][1])
    assert not marker.exists(), "loading the file ran code"


@pytest.mark.parametrize("script", list(MODULES))
def test_hostile_args_json(script, runs, tmp_path, capsys):
    """--resume reads the run's flags from args.json: checked like any file from elsewhere."""
    flag = "--total-updates" if script == "bc" else "--total-timesteps"
    good = json.loads(open(os.path.join(runs[script], "args.json")).read())
    for i, (text, word) in enumerate(
        (
            ("{not json", "not JSON"),
            (json.dumps([1, 2]), "not made by"),
            (json.dumps({**good, "script": "other"}), "not made by"),
            (json.dumps({**good, "args": {**good["args"], "batch_size": "64"}}), "batch"),
            (json.dumps({**good, "args": {**good["args"], "env_id": "os:system"}}), "module"),
            (json.dumps({**good, "args": {**good["args"], "gamma": 7.0}}), "--gamma"),
        )
    ):
        if script == "bc" and "gamma" in text:
            continue  # BC has no discount
        if script in TOOLS and word == "not made by":
            word = "not a run of"  # DQN's wording
        run_dir = copy_run(runs[script], tmp_path / f"run{i}")
        with open(os.path.join(run_dir, "args.json"), "w") as f:
            f.write(text)
        refused(MODULES[script], ["--resume", run_dir, flag, "400"], capsys, word)


def test_dqn_hostile_values_in_args_json(runs, tmp_path, capsys):
    """Values of the right type that no run of this script has: a seed that would overflow the
    envs' int32 seeds, networks and env counts that would take the machine's memory. Refused in
    one line before anything is built (before: a seed of 2^31 - 1 and a million eval envs ran)."""
    good = json.loads(open(os.path.join(runs["dqn"], "args.json")).read())
    for i, (change, word) in enumerate(
        (
            ({"seed": 2**31 - 1}, "--seed must be in"),
            ({"seed": -1}, "--seed should be greater than or equal to 0"),
            ({"hidden_sizes": [10**6]}, "--hidden-sizes should be less than or equal to 65536"),
            ({"hidden_sizes": []}, "at least 1 item"),
            ({"eval_episodes": 10**6}, "--eval-episodes should be less than or equal to 1024"),
            ({"num_envs": 10**5}, "--num-envs should be less than or equal to 1024"),
            ({"total_timesteps": 2**40}, "--total-timesteps should be less than 2147483648"),
        )
    ):
        run_dir = copy_run(runs["dqn"], tmp_path / f"run{i}")
        with open(os.path.join(run_dir, "args.json"), "w") as f:
            json.dump({**good, "args": {**good["args"], **change}}, f)
        refused(dqn, ["--resume", run_dir], capsys, word)


@pytest.mark.parametrize("script", list(MODULES))
def test_a_flag_the_script_no_longer_has_is_refused_on_resume_and_ignored_by_the_tool(script, runs, tmp_path, capsys):
    """A run folder of an earlier version naming a flag since removed (SAC's --n-step 3) is not resumed
    with that setting silently dropped: one line naming the flag. Evaluating its model, which that flag
    did not change, still works."""
    flag = "--total-updates" if script == "bc" else "--total-timesteps"
    run_dir = copy_run(runs[script], tmp_path / "run")
    good = json.loads(open(os.path.join(run_dir, "args.json")).read())
    with open(os.path.join(run_dir, "args.json"), "w") as f:
        json.dump({**good, "args": {**good["args"], "n_step_removed": 3}}, f)
    err = refused(MODULES[script], ["--resume", run_dir, flag, "400"], capsys, "--n-step-removed")
    assert "args.json" in err, err
    path = os.path.join(run_dir, "model.npz")
    meta, arrays = MODULES[script].load_npz(path, "model")
    MODULES[script].save_npz(path, {**meta, "args": {**meta["args"], "n_step_removed": 3}}, arrays)
    out = subprocess.run([sys.executable, TOOLS[script], path, "--episodes", "1"], capture_output=True, text=True)
    assert out.returncode == 0 and "over 1 episodes" in out.stdout, out.stderr[-2000:]


@pytest.mark.parametrize("script", ["sac", "bc"])
def test_hostile_values_in_args_json_of_sac_and_bc(script, runs, tmp_path, capsys):
    """The same pydantic ranges hold SAC's and BC's flags (issue 27): a seed past the envs' int32
    seeds, a network or an evaluation that would take the machine's memory, refused in one line."""
    flag = "--total-updates" if script == "bc" else "--total-timesteps"
    good = json.loads(open(os.path.join(runs[script], "args.json")).read())
    for i, (change, word) in enumerate(
        (
            ({"seed": 2**31 - 1}, "--seed"),
            ({"hidden_sizes": [10**6]}, "--hidden-sizes should be less than or equal to 65536"),
            ({"eval_episodes": 10**6}, "--eval-episodes should be less than or equal to 1024"),
            ({"batch_size": 0}, "--batch-size should be greater than or equal to 1"),
        )
    ):
        run_dir = copy_run(runs[script], tmp_path / f"run{i}")
        with open(os.path.join(run_dir, "args.json"), "w") as f:
            json.dump({**good, "args": {**good["args"], **change}}, f)
        err = refused(MODULES[script], ["--resume", run_dir, flag, "400"], capsys, word)
        assert "args.json" in err, err


@pytest.mark.parametrize("script", list(MODULES))
def test_old_pkl_file_is_refused_with_how_to_convert(script, runs, tmp_path, capsys):
    path = tmp_path / "model.pkl"
    marker = tmp_path / "code-ran"
    with open(path, "wb") as f:
        pickle.dump({"format": f"{MODULES[script].SCRIPT}/1", "evil": Evil(marker)}, f)
    if script in TOOLS:
        evaluation_refused(script, path, "earlier version", "Old .pkl files")
    else:
        refused(MODULES[script], ["--eval-only", "--load", str(path)], capsys, "earlier version", "Old .pkl files")
    assert not marker.exists()


def _set(name, index, value):
    return lambda a: a[name].__setitem__(index, value)


def _put(name, value):
    return lambda a: a.__setitem__(name, np.asarray(value, a[name].dtype))


def _priority_and_max(value):  # a priority and the max that would admit it
    return lambda a: (_set("replay/priority", 0, value)(a), _put("replay/max_priority", value)(a))


def _meta(**changes):
    def change(a):
        a["meta.json"] = np.frombuffer(json.dumps({**meta_of(a), **changes}).encode(), np.uint8)

    return change


def test_dqn_replay_with_bad_contents_is_refused(runs, tmp_path, capsys):
    """Replay arrays are checked too: priorities that would poison cpprb's sum tree (NaN, or over
    1e30, which cpprb's float32 tree and its sums overflow), an insert position out of range, a
    column of the wrong width, actions that are not the env's (the loss would gather Q out of
    range), discounts outside [0, 1], rewards that are not finite; and the counters in meta.json
    (before: the actions, discounts, large priorities and counters went through)."""
    for change, word in (
        (_set("replay/priority", 0, np.nan), "not finite"),
        (_put("replay/next_index", 10**9), "out of range"),
        (lambda a: a.__setitem__("replay/obs", a["replay/obs"][:, :3].copy()), "replay/obs"),
        (_set("replay/action", 0, 2), "out of range"),  # CartPole has actions 0 and 1
        (_set("replay/action", 5, -1), "out of range"),
        (_set("replay/discount", 0, 1.5), "out of range"),
        (_set("replay/discount", 3, -0.25), "out of range"),
        (_priority_and_max(1e35), "out of range"),
        (_priority_and_max(1e39), "out of range"),  # inf in float32
        (lambda a: _set("replay/priority", 0, 2 * float(a["replay/max_priority"]))(a), "out of range"),
        (_put("replay/max_priority", 0.0), "out of range"),
        (_set("replay/reward", 0, np.inf), "not finite"),
        (_meta(global_step=-1), "bad counters"),
        (_meta(global_step=2**40), "bad counters"),
        (_meta(episodes="12"), "bad counters"),
    ):
        run_dir = copy_run(runs["dqn"], tmp_path / f"run{len(os.listdir(tmp_path))}")
        target = os.path.join(run_dir, "checkpoint.npz")
        arrays = read(target)
        change(arrays)
        write(target, arrays)
        refused(dqn, ["--resume", run_dir, "--total-timesteps", "400"], capsys, word)


def test_dqn_hostile_checkpoint_values_are_refused_by_the_loader_itself(runs):
    """PrioritizedReplay.load_state_dict, which tools and code call without train(): the same
    checks, as a ConfigError."""
    meta, good = dqn.load_npz(runs["dqn"], "checkpoint")
    args = dqn.args_from_json(meta["args"], "meta")
    space = dqn.gym.spaces.Box(-np.inf, np.inf, (4,), np.float32)
    replay, _ = dqn.make_replay(args, space)
    replay.load_state_dict(good, "good", 2)  # the file as written loads
    for change in (_set("replay/action", 0, 2), _set("replay/discount", 0, 1.5), _priority_and_max(1e35)):
        arrays = {k: v.copy() for k, v in good.items()}
        change(arrays)
        with pytest.raises(dqn.ConfigError, match="out of range"):
            dqn.make_replay(args, space)[0].load_state_dict(arrays, "hostile", 2)


def test_sac_replay_with_negative_priority_is_refused(runs, tmp_path, capsys):
    run_dir = copy_run(runs["sac"], tmp_path / "run")
    target = os.path.join(run_dir, "checkpoint.npz")
    arrays = read(target)
    arrays["replay/priority"][3] = -1.0
    write(target, arrays)
    refused(sac, ["--resume", run_dir, "--total-timesteps", "400"], capsys, "out of range")


def test_bc_model_for_another_env_is_refused(runs, tmp_path, capsys):
    run_dir = copy_run(runs["bc"], tmp_path / "run")
    target = os.path.join(run_dir, "model.npz")
    arrays = read(target)
    meta = meta_of(arrays)
    meta["env_id"] = "CartPole-v1"  # a continuous-action policy over 3 features
    write(target, {k: v for k, v in arrays.items() if k != "meta.json"}, meta)
    evaluation_refused("bc", target, "CartPole-v1 has observations")


@pytest.mark.parametrize("script", list(MODULES))
def test_writer_and_reader_round_trip_a_train_state(script, tmp_path):
    """A state built here (random values, the optimiser's int counters) goes through
    tree_arrays + save_npz and comes back through load_npz + restore_tree bit for bit."""
    import jax
    import optax

    module = MODULES[script]
    rng = np.random.default_rng(0)
    params = {
        "params": {
            "Dense_0": {
                "kernel": rng.normal(size=(3, 5)).astype(np.float32),
                "bias": rng.normal(size=5).astype(np.float32),
            }
        }
    }
    state = (params, optax.adam(1e-3).init(params), np.int32(7))
    state = jax.tree_util.tree_map(lambda x: np.asarray(x) + (1 if np.asarray(x).dtype.kind == "f" else 0), state)
    path = str(tmp_path / "checkpoint.npz")
    save, fmt = saver(module)
    save(path, {"format": fmt, "kind": "checkpoint", "x": [1, "a"]}, module.tree_arrays("train_state/", state))
    meta, arrays = module.load_npz(path, "checkpoint")
    assert meta["x"] == [1, "a"]
    zeros = jax.tree_util.tree_map(np.zeros_like, state)
    restored = module.restore_tree(zeros, arrays, "train_state/", path)
    for a, b in zip(jax.tree_util.tree_leaves(restored), jax.tree_util.tree_leaves(state)):
        assert np.asarray(a).dtype == np.asarray(b).dtype
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("script", list(MODULES))
def test_interrupted_write_keeps_previous_file(script, tmp_path, monkeypatch):
    module = MODULES[script]
    path = str(tmp_path / "checkpoint.npz")
    save, fmt = saver(module)
    meta = {"format": fmt, "kind": "checkpoint", "value": 1}
    save(path, meta, {"a": np.arange(3)})
    real_savez = np.savez

    def savez_then_die(f, **arrays):  # half a file on disk, then a kill (KeyboardInterrupt here)
        real_savez(f, **arrays)
        f.truncate(f.tell() // 2)
        raise KeyboardInterrupt

    monkeypatch.setattr(module.np, "savez", savez_then_die)
    with pytest.raises(KeyboardInterrupt):
        save(path, {**meta, "value": 2}, {"a": np.zeros(100_000)})
    monkeypatch.setattr(module.np, "savez", real_savez)
    assert module.load_npz(path, "checkpoint")[0]["value"] == 1
    assert os.listdir(tmp_path) == ["checkpoint.npz"]  # the temp file is gone too


@pytest.mark.parametrize("script", list(MODULES))
def test_full_disk_ends_the_run_in_one_line_and_keeps_the_checkpoint(script, runs, tmp_path, monkeypatch, capsys):
    """A checkpoint write that fails (ENOSPC) stops a resumed run with exit 1 and one line;
    the checkpoint it was replacing still loads and resumes."""
    module = MODULES[script]
    run_dir = copy_run(runs[script], tmp_path / "run")
    before = read(os.path.join(run_dir, "checkpoint.npz"))
    real_savez = np.savez

    def savez_disk_full(f, **arrays):
        f.write(b"PK\x03\x04" + b"\0" * 100)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(module.np, "savez", savez_disk_full)
    flag = "--total-updates" if script == "bc" else "--total-timesteps"
    capsys.readouterr()
    assert module.cli(["--resume", run_dir, flag, "400"]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "No space left on device" in err and "unchanged" in err, err
    after = read(os.path.join(run_dir, "checkpoint.npz"))
    assert set(after) == set(before) and all(np.array_equal(after[k], before[k]) for k in before)
    assert not [n for n in os.listdir(run_dir) if ".tmp." in n]
    monkeypatch.setattr(module.np, "savez", real_savez)
    assert module.cli(["--resume", run_dir, flag, "400"]) == 0


@pytest.mark.parametrize("script", list(MODULES))
def test_old_model_pkl_converts_with_the_explicit_tool(script, runs, tmp_path, capsys):
    """tools/convert_pkl.py: an earlier version's model.pkl (built here in that layout: the
    format tag /1, the flags, the parameter leaves in flatten order) becomes a model.npz that
    --eval-only loads, with the same arrays."""
    import subprocess
    import sys

    module = MODULES[script]
    meta, arrays = module.load_npz(os.path.join(runs[script], "model.npz"), "model")
    # The old scripts pickled dataclasses.asdict(args): tuples, not JSON's lists.
    old_args = module.dataclasses.asdict(module.args_from_json(meta["args"], "meta"))
    assert isinstance(old_args["hidden_sizes"], tuple)
    old = {
        "format": f"{module.SCRIPT}/1",
        "args": old_args,
        "params": [v for k, v in arrays.items() if k.startswith("params/")],
    }
    if script == "bc":
        old.update(
            {k: meta[k] for k in ("env_id", "mode", "out_dim", "ref_min", "ref_max")},
            obs_mean=arrays["obs_mean"],
            obs_std=arrays["obs_std"],
        )
    path = tmp_path / "model.pkl"
    with open(path, "wb") as f:
        pickle.dump(old, f)
    out = subprocess.run(
        [sys.executable, os.path.join(ROOT, "tools", "convert_pkl.py"), str(path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    _, converted = module.load_npz(str(tmp_path / "model.npz"), "model")
    assert set(converted) == set(arrays)
    for name, value in arrays.items():
        np.testing.assert_array_equal(converted[name], value)
    capsys.readouterr()
    if script in TOOLS:
        out = subprocess.run(
            [sys.executable, TOOLS[script], str(tmp_path / "model.npz"), "--episodes", "1"],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert out.returncode == 0 and "over 1 episodes" in out.stdout, out.stderr
    else:
        assert module.cli(["--eval-only", "--load", str(tmp_path / "model.npz"), "--eval-episodes", "1"]) == 0


@pytest.mark.parametrize("script", ["dqn", "sac"])
def test_args_json_does_not_choose_files_to_write(script, runs, tmp_path, capsys):
    """A shared run folder's args.json naming another --run-dir and --resume folder: not obeyed on
    --resume (only what is typed decides where to write); one naming --save-dataset, a flag of an
    earlier version, is refused in one line."""
    run_dir = copy_run(runs[script], tmp_path / "run")
    target = tmp_path / "elsewhere" / "pwned.hdf5"
    target.parent.mkdir()
    saved = json.loads(open(os.path.join(run_dir, "args.json")).read())
    saved["args"]["save_dataset"] = str(target)
    with open(os.path.join(run_dir, "args.json"), "w") as f:
        json.dump(saved, f)
    refused(MODULES[script], ["--resume", run_dir, "--total-timesteps", "400"], capsys, "--save-dataset")
    del saved["args"]["save_dataset"]
    saved["args"]["run_dir"] = saved["args"]["resume"] = str(target.parent)
    with open(os.path.join(run_dir, "args.json"), "w") as f:
        json.dump(saved, f)
    assert MODULES[script].cli(["--resume", run_dir, "--total-timesteps", "400"]) == 0
    assert not target.exists()
    assert os.listdir(target.parent) == []
    assert MODULES[script].load_npz(run_dir, "checkpoint")[0]["global_step"] == 400  # it went on in its own folder


@pytest.mark.parametrize("script", list(MODULES))
def test_run_folder_of_an_earlier_version_says_so(script, runs, tmp_path, capsys):
    run_dir = copy_run(runs[script], tmp_path / "run")
    os.rename(os.path.join(run_dir, "checkpoint.npz"), os.path.join(run_dir, "checkpoint.pkl"))
    flag = "--total-updates" if script == "bc" else "--total-timesteps"
    # DQN and BC name the missing file only: no hint about .pkl files beside it (issues 26, 27)
    words = ("no such file", "checkpoint.npz") if script in TOOLS else ("no such file", "Old .pkl files")
    refused(MODULES[script], ["--resume", run_dir, flag, "400"], capsys, *words)


def folder_state(folder):
    out = {}
    for name in sorted(os.listdir(folder)):
        path = os.path.join(folder, name)
        if os.path.islink(path):
            out[name] = ("link", os.readlink(path))
        elif os.path.isdir(path):
            out[name] = ("dir", folder_state(path))
        else:
            with open(path, "rb") as f:
                out[name] = (f.read(), os.stat(path).st_mtime_ns)
    return out


@pytest.mark.parametrize("name", ["eval.csv", "videos", "checkpoint-100.npz", "unrelated", "wandb"])
def test_dqn_run_folder_holding_a_symlink_is_refused(name, runs, tmp_path, capsys):
    """A symlink in a run folder could send a write out of it (eval.csv appended through it,
    videos filmed into its target): --resume refuses the folder in one line, and neither the
    folder nor the link's target changes (before: the run went on and wrote)."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious.txt").write_text("keep me\n")
    run_dir = copy_run(runs["dqn"], tmp_path / "run")
    link = os.path.join(run_dir, name)
    if os.path.exists(link):
        os.remove(link)
    os.symlink(outside if name in ("videos", "unrelated", "wandb") else outside / "precious.txt", link)
    before, outside_before = folder_state(run_dir), folder_state(outside)
    refused(dqn, ["--resume", run_dir, "--total-timesteps", "400"], capsys, "symlink")
    assert folder_state(run_dir) == before and folder_state(outside) == outside_before


def test_dqn_fresh_run_into_a_folder_holding_a_symlink_is_refused(tmp_path, capsys):
    outside = tmp_path / "outside"
    outside.mkdir()
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    os.symlink(outside, run_dir / "videos")
    err = refused(dqn, ONLINE + ["--run-dir", str(run_dir)], capsys)
    assert "symlink" in err or "is not empty" in err, err
    assert os.listdir(run_dir) == ["videos"] and os.listdir(outside) == []
