"""BC: dataset readers (D4RL HDF5, Minari folder, npz), trajectory split and top fraction, the
writers' files, normalisation saved and restored, losses, bad input, import hygiene."""

import json
import os
import subprocess
import sys

import h5py
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import ROOT, import_in_fresh_process, load_script, load_tool

bc = load_script("bc_offline")
SCRIPT = os.path.join(ROOT, "algos", "bc_offline.py")
FAST = [
    "--hidden-sizes",
    "32",
    "32",
    "--batch-size",
    "64",
    "--updates-per-call",
    "10",
    "--eval-episodes",
    "2",
    "--eval-every",
    "100",
    "--log-every",
    "100",
]


def episodes_data(rng, lengths, obs_dim=3, action_dim=1, terminal_last=(True,)):
    """Per-episode arrays with T+1 observations (Minari's shape)."""
    eps = []
    for k, T in enumerate(lengths):
        term = np.zeros(T, bool)
        trunc = np.zeros(T, bool)
        if terminal_last[k % len(terminal_last)]:
            term[-1] = True
        else:
            trunc[-1] = True
        eps.append(
            {
                "observations": rng.normal(size=(T + 1, obs_dim)).astype(np.float32),
                "actions": rng.uniform(-2, 2, (T, action_dim)).astype(np.float32),
                "rewards": rng.normal(size=T).astype(np.float32),
                "terminations": term,
                "truncations": trunc,
            }
        )
    return eps


def flat_from_episodes(eps):
    return {
        "observations": np.concatenate([e["observations"][:-1] for e in eps]),
        "next_observations": np.concatenate([e["observations"][1:] for e in eps]),
        "actions": np.concatenate([e["actions"] for e in eps]),
        "rewards": np.concatenate([e["rewards"] for e in eps]),
        "terminals": np.concatenate([e["terminations"] for e in eps]),
        "timeouts": np.concatenate([e["truncations"] for e in eps]),
    }


def write_d4rl(path, flat, metadata=None):
    with h5py.File(path, "w") as f:
        for k, v in flat.items():
            f.create_dataset(k, data=v)
        g = f.create_group("metadata")
        for k, v in (metadata or {}).items():
            g.attrs[k] = v


def write_minari(folder, eps, env_id="Pendulum-v1"):
    """Minari 0.5's layout, both files in data/ (tests/test_minari.py uses minari itself)."""
    os.makedirs(os.path.join(folder, "data"))
    with h5py.File(os.path.join(folder, "data", "main_data.hdf5"), "w") as f:
        for i, e in enumerate(eps):
            g = f.create_group(f"episode_{i}")
            for k, v in e.items():
                g.create_dataset(k, data=v)
    with open(os.path.join(folder, "data", "metadata.json"), "w") as f:
        json.dump({"env_spec": json.dumps({"id": env_id}), "ref_min_score": -1200.0, "ref_max_score": -150.0}, f)


def test_three_readers_agree_including_the_t_plus_1_shift(tmp_path):
    rng = np.random.default_rng(0)
    eps = episodes_data(rng, [5, 7, 3], terminal_last=(True, False))
    flat = flat_from_episodes(eps)
    meta = {"env_id": "Pendulum-v1", "ref_min_score": -1200.0, "ref_max_score": -150.0}
    write_d4rl(tmp_path / "d.hdf5", flat, meta)
    np.savez(tmp_path / "d.npz", **flat, **{f"metadata/{k}": v for k, v in meta.items()})
    write_minari(str(tmp_path / "minari"), eps)
    for ds in (
        bc.read_dataset(str(tmp_path / "d.hdf5")),
        bc.read_dataset(str(tmp_path / "d.npz")),
        bc.read_dataset(str(tmp_path / "minari")),
    ):
        np.testing.assert_array_equal(ds.observations, flat["observations"])
        np.testing.assert_array_equal(ds.actions, flat["actions"])
        np.testing.assert_array_equal(ds.rewards, flat["rewards"])
        np.testing.assert_array_equal(ds.terminals, flat["terminals"])
        np.testing.assert_array_equal(ds.timeouts, flat["timeouts"])
        assert ds.metadata["env_id"] == "Pendulum-v1" and ds.metadata["ref_max_score"] == -150.0


def test_minari_episode_without_end_flag_still_ends_a_trajectory(tmp_path):
    eps = episodes_data(np.random.default_rng(1), [4, 4])
    eps[0]["terminations"][:] = False  # e.g. a stored episode cut by the collector
    write_minari(str(tmp_path / "m"), eps)
    ds = bc.read_dataset(str(tmp_path / "m"))
    np.testing.assert_array_equal(bc.trajectory_bounds(ds.terminals, ds.timeouts), [[0, 4], [4, 8]])


def test_trajectory_split_at_terminals_and_timeouts_and_top_fraction():
    rewards = np.array([1, 1, 1, 5, 5, 0, 0, 0, 0, 9], np.float32)
    terminals = np.array([0, 0, 1, 0, 0, 0, 0, 0, 0, 0], bool)
    timeouts = np.array([0, 0, 0, 0, 1, 0, 0, 0, 1, 0], bool)  # the last row is an unfinished tail
    bounds = bc.trajectory_bounds(terminals, timeouts)
    np.testing.assert_array_equal(bounds, [[0, 3], [3, 5], [5, 9], [9, 10]])  # returns 3, 10, 0, 9
    ds = bc.Dataset(np.zeros((10, 1), np.float32), np.zeros((10, 1), np.float32), rewards, terminals, timeouts, {})
    np.testing.assert_array_equal(np.flatnonzero(bc.top_fraction_mask(ds, 0.5)), [3, 4, 9])  # best 2 of 4
    np.testing.assert_array_equal(np.flatnonzero(bc.top_fraction_mask(ds, 0.1)), [3, 4])  # at least 1
    assert bc.top_fraction_mask(ds, 1.0).all()


def test_top_fraction_keeps_the_top_timesteps_as_decision_transformer_does():
    # %BC (Chen et al. 2021, 5.3): whole trajectories, best return first, while they fit in
    # floor(fraction * N) rows; the best one always; stop at the first that does not fit.
    # Trajectories in file order: D (4 rows, return 2), A (2, 10), E (1, 1), B (10, 8), C (3, 6);
    # by return A, B, C, D, E with cumulative lengths 2, 12, 15, 19, 20.
    lengths, returns = [4, 2, 1, 10, 3], [2.0, 10.0, 1.0, 8.0, 6.0]
    rewards = np.concatenate([np.full(n, r / n) for n, r in zip(lengths, returns)]).astype(np.float32)
    ends = np.cumsum(lengths) - 1
    terminals, timeouts = np.zeros(20, bool), np.zeros(20, bool)
    terminals[ends[[0, 2]]] = True
    timeouts[ends[[1, 3, 4]]] = True
    ds = bc.Dataset(np.zeros((20, 1), np.float32), np.zeros((20, 1), np.float32), rewards, terminals, timeouts, {})
    rows = {"D": range(0, 4), "A": range(4, 6), "E": range(6, 7), "B": range(7, 17), "C": range(17, 20)}

    def kept(fraction):
        mask = bc.top_fraction_mask(ds, fraction)
        names = "".join(sorted(k for k, r in rows.items() if mask[list(r)].all()))
        assert mask.sum() == sum(len(rows[k]) for k in names)  # whole trajectories only
        return names

    assert kept(0.5) == "A"  # 10 rows: A (2) fits, B (12) does not, and C is not tried
    assert kept(0.6) == "AB"  # 12 rows
    assert kept(0.75) == "ABC"  # 15 rows; 3 of 5 trajectories, not ceil(0.75 * 5) = 4
    assert kept(0.05) == "A"  # 1 row: the best trajectory is kept whole
    assert kept(0.95) == "ABCD"  # 19 rows
    assert kept(1.0) == "ABCDE"


def test_a_file_ending_mid_trajectory_ends_it_there(tmp_path):
    # The first file stops 3 rows into an episode (no flag on its last row): concatenated with a
    # second file, that tail must stay a trajectory of its own, not join the next file's first
    # episode (nor be ranked by --top-fraction with that episode's return).
    rng = np.random.default_rng(6)
    first = flat_from_episodes(episodes_data(rng, [4, 3]))
    first["terminals"][-1] = False
    second = flat_from_episodes(episodes_data(rng, [5]))
    second["rewards"][:] = 10.0  # a good episode: joined to the tail, it would carry the tail in
    meta = {"env_id": "Pendulum-v1"}
    write_d4rl(tmp_path / "a.hdf5", first, meta)
    np.savez(tmp_path / "a.npz", **first, **{f"metadata/{k}": v for k, v in meta.items()})
    write_d4rl(tmp_path / "b.hdf5", second, meta)
    for name in ("a.hdf5", "a.npz"):
        paths = [str(tmp_path / name), str(tmp_path / "b.hdf5")]
        ds = bc.load_training_data(bc.Args(dataset=paths)).dataset
        np.testing.assert_array_equal(bc.trajectory_bounds(ds.terminals, ds.timeouts), [[0, 4], [4, 7], [7, 12]])
        assert ds.timeouts[6] and not ds.terminals[6]  # cut off, not finished
        np.testing.assert_array_equal(np.flatnonzero(bc.top_fraction_mask(ds, 5 / 12)), np.arange(7, 12))


def test_losses_and_priorities_match_references():
    rng = np.random.default_rng(2)
    obs = rng.normal(size=(16, 3)).astype(np.float32)
    # discrete: cross-entropy, which is also the priority
    pol = bc.Policy(4, (8,), False)
    params = pol.init(jax.random.PRNGKey(0), jnp.zeros((1, 3)))
    actions = rng.integers(0, 4, 16)
    logits = np.asarray(pol.apply(params, obs)[0])
    ref = -(logits[np.arange(16), actions] - np.log(np.exp(logits).sum(1)))
    loss, prio = bc.per_example_loss(pol, "discrete", params, obs, actions)
    np.testing.assert_allclose(loss, ref, rtol=1e-5)
    np.testing.assert_allclose(prio, ref, rtol=1e-5)
    # mse on tanh outputs, also the priority
    pol = bc.Policy(2, (8,), False)
    params = pol.init(jax.random.PRNGKey(1), jnp.zeros((1, 3)))
    a = rng.uniform(-1, 1, (16, 2)).astype(np.float32)
    ref = ((np.tanh(np.asarray(pol.apply(params, obs)[0])) - a) ** 2).sum(1)
    loss, prio = bc.per_example_loss(pol, "mse", params, obs, a)
    np.testing.assert_allclose(loss, ref, rtol=1e-5)
    np.testing.assert_allclose(prio, ref, rtol=1e-5)
    # nll of the tanh-Gaussian; its priority is the misfit term 0.5 * sum ((u - mu) / sigma)^2
    pol = bc.Policy(2, (8,), True)
    params = pol.init(jax.random.PRNGKey(2), jnp.zeros((1, 3)))
    mu, log_std = (np.asarray(x) for x in pol.apply(params, obs))
    u, sigma = np.arctanh(a), np.exp(log_std)
    ref = -(-0.5 * ((u - mu) / sigma) ** 2 - np.log(sigma * np.sqrt(2 * np.pi)) - np.log(1 - a**2)).sum(1)
    loss, prio = bc.per_example_loss(pol, "nll", params, obs, a)
    np.testing.assert_allclose(loss, ref, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(prio, 0.5 * (((u - mu) / sigma) ** 2).sum(1), rtol=1e-4, atol=1e-5)


def test_nll_priority_is_non_negative_where_the_nll_is_negative():
    """A well-fitted example has a negative nll (a density above 1); its priority must still be
    >= 0, or cpprb's sum tree turns NaN (issue 11: --loss nll --prioritized ended in NaN)."""
    pol = bc.Policy(1, (8,), True)
    params = pol.init(jax.random.PRNGKey(0), jnp.zeros((1, 2)))
    obs = np.zeros((4, 2), np.float32)
    # Shrink sigma by hand (shift the log-std head's bias) and put the data at the mean.
    log_std_head = params["params"]["Dense_2"]  # Dense_0: hidden, Dense_1: mean, Dense_2: log-std
    log_std_head["bias"] = log_std_head["bias"] - 6.0
    mu, _ = (np.asarray(x) for x in pol.apply(params, obs))
    loss, prio = bc.per_example_loss(pol, "nll", params, obs, np.tanh(mu))
    assert np.all(np.asarray(loss) < 0)
    assert np.all(np.asarray(prio) >= 0) and np.all(np.isfinite(np.asarray(prio)))


def test_writers_files_are_read_and_normalisation_is_saved_and_restored(tmp_path, capsys):
    sac = load_script("sac")
    data = str(tmp_path / "pend.hdf5")
    assert (
        sac.cli(
            [
                "--total-timesteps",
                "300",
                "--learning-starts",
                "256",
                "--batch-size",
                "64",
                "--hidden-sizes",
                "16",
                "--eval-every",
                "300",
                "--eval-episodes",
                "2",
                "--run-dir",
                str(tmp_path / "sac"),
            ]
        )
        == 0
    )
    # SAC's datasets come from tools/sac_dataset.py, on the run's model.npz.
    assert load_tool("sac_dataset").main([str(tmp_path / "sac"), data, "--episodes", "2", "--noise", "0.3"]) == 0
    ds = bc.read_dataset(data)
    assert len(ds.rewards) == 400 and ds.timeouts.sum() == 2 and ds.metadata["env_id"] == "Pendulum-v1"
    assert ds.metadata["ref_min_score"] < 0 and "ref_max_score" in ds.metadata
    dqn = load_script("dqn_prioritized")
    data2 = str(tmp_path / "cart.hdf5")
    assert (
        dqn.cli(
            [
                "--total-timesteps",
                "300",
                "--learning-starts",
                "256",
                "--batch-size",
                "32",
                "--hidden-sizes",
                "16",
                "--eval-every",
                "300",
                "--eval-episodes",
                "2",
                "--run-dir",
                str(tmp_path / "dqn"),
            ]
        )
        == 0
    )
    # DQN's datasets come from tools/dqn_dataset.py, on the run's model.npz.
    dataset_tool = load_tool("dqn_dataset")
    assert dataset_tool.main([str(tmp_path / "dqn"), data2, "--episodes", "3", "--epsilon", "0.5"]) == 0
    ds2 = bc.read_dataset(data2)
    assert ds2.actions.ndim == 1 and (ds2.terminals | ds2.timeouts).sum() == 3
    assert ds2.metadata["env_id"] == "CartPole-v1" and ds2.metadata["dataset_epsilon"] == 0.5
    assert ds2.metadata["ref_min_score"] > 0 and "ref_max_score" in ds2.metadata
    # Every step of the 3 episodes is in it: their mean return is the rewards' sum over 3.
    assert ds2.metadata["episodes"] == 3 and ds2.metadata["mean_return"] == pytest.approx(ds2.rewards.sum() / 3)

    run = str(tmp_path / "bc")
    assert bc.cli(FAST + ["--dataset", data, "--total-updates", "200", "--run-dir", run]) == 0
    model = bc.load_npz(os.path.join(run, "model.npz"), "model")[1]
    np.testing.assert_allclose(model["obs_mean"], ds.observations.mean(0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(model["obs_std"], ds.observations.std(0), rtol=1e-5, atol=1e-6)
    capsys.readouterr()
    # A saved model is evaluated by tools/bc_evaluate.py.
    assert load_tool("bc_evaluate").main([os.path.join(run, "model.npz"), "--episodes", "2"]) == 0
    assert "normalised score" in capsys.readouterr().out
    # Resume continues the update counter; the checkpoint holds the priorities.
    assert bc.cli(["--resume", run, "--total-updates", "300"]) == 0
    ckpt = bc.load_npz(run, "checkpoint")[1]
    assert int(ckpt["train_state/sgd_steps"]) == 300 and len(ckpt["priority"]) == 400
    # Two files at once (their union), discrete data trains with cross-entropy.
    assert (
        bc.cli(
            FAST
            + ["--dataset", data2, "--dataset", data2, "--total-updates", "100", "--run-dir", str(tmp_path / "bc2")]
        )
        == 0
    )
    assert "examples from 2 file(s)" in capsys.readouterr().out


@pytest.mark.parametrize(
    "problem,message",
    [
        ("missing", "missing key(s) timeouts"),
        ("lengths", "arrays of different lengths"),
        ("nan", "observations contain NaN or inf"),
        ("empty", "the dataset is empty"),
        ("garbage", "unreadable dataset"),
        ("action_shape", "do not match the env"),
        ("bounds", "outside the env's bounds"),
        ("no_env", "no env_id in the metadata"),
        ("env_module", "names a module to import"),
        ("text_terminals", "arrays that are not numbers"),  # numpy would read any non-empty text as True
    ],
)
def test_bad_datasets_are_one_clear_line_naming_the_file(tmp_path, capsys, problem, message):
    rng = np.random.default_rng(3)
    flat = flat_from_episodes(episodes_data(rng, [6, 6]))
    meta = {"env_id": "Pendulum-v1"}
    path = str(tmp_path / f"{problem}.hdf5")
    if problem == "missing":
        del flat["timeouts"]
    elif problem == "lengths":
        flat["rewards"] = flat["rewards"][:-1]
    elif problem == "nan":
        flat["observations"][3, 1] = np.nan
    elif problem == "empty":
        flat = {k: v[:0] for k, v in flat.items()}
    elif problem == "action_shape":
        flat["actions"] = np.zeros((12, 2), np.float32)
    elif problem == "bounds":
        flat["actions"][0] = 7.0
    elif problem == "no_env":
        meta = {}
    elif problem == "env_module":  # gym.make would import the module before ':'
        meta = {"env_id": "os:Pendulum-v1"}
    elif problem == "text_terminals":
        flat["terminals"] = np.array([b"0"] * len(flat["terminals"]))
    if problem == "garbage":
        with open(path, "wb") as f:
            f.write(b"this is not hdf5")
    else:
        write_d4rl(path, flat, meta)
    assert bc.cli(["--dataset", path, "--total-updates", "10"]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and path in err and len(err.splitlines()) == 1


def test_other_bad_input(tmp_path, capsys):
    cases = [
        (["--dataset", str(tmp_path / "nope.hdf5")], "no such file"),
        (["--top-fraction", "0"], "--top-fraction should be greater than 0"),
        (["--per-eps", "nan"], "--per-eps should be a finite number"),
    ]
    with pytest.raises(SystemExit) as exit:  # a choice outside the Literal is tyro's own usage error
        bc.cli(["--loss", "l1"])
    assert exit.value.code == 2
    capsys.readouterr()
    # Discrete dataset against a continuous env.
    flat = flat_from_episodes(episodes_data(np.random.default_rng(4), [5]))
    flat["actions"] = np.zeros(5, np.int64)
    flat["observations"] = flat["observations"]
    write_d4rl(tmp_path / "disc.hdf5", flat, {"env_id": "Pendulum-v1"})
    cases.append((["--dataset", str(tmp_path / "disc.hdf5")], "do not match the env"))
    for argv, message in cases:
        assert bc.cli(argv) == 2
        err = capsys.readouterr().err.strip()
        assert message in err and len(err.splitlines()) == 1


def test_import_has_no_side_effects_and_cli_errors_have_no_traceback(tmp_path):
    out = import_in_fresh_process("bc_offline")
    assert out.returncode == 0 and "clean" in out.stdout, out.stderr
    bad = tmp_path / "bad.npz"
    np.savez(bad, observations=np.zeros((3, 3)))
    out = subprocess.run([sys.executable, SCRIPT, "--dataset", str(bad)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "Traceback" not in out.stderr and "missing key(s)" in out.stderr


def test_a_copied_file_without_the_repo_says_which_dataset_to_give(tmp_path):
    """bc_offline.py copied alone into a folder, run with no flags: one line naming --dataset, exit 2
    (its default dataset is the repo's data/ file, which is not there)."""
    import shutil

    shutil.copy(SCRIPT, tmp_path / "bc_offline.py")
    out = subprocess.run([sys.executable, "bc_offline.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    err = out.stderr.strip()
    assert out.returncode == 2 and len(err.splitlines()) == 1 and "give --dataset PATH" in err, err
