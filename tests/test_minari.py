"""BC on real Minari datasets: folders written by minari's own DataCollector (no hand-made
imitation of its layout), read back row by row, the env id and reference scores taken from its
metadata, files with spaces or contents the reader cannot use refused in one line, and a short
end-to-end run of bc_offline.py --dataset FOLDER."""

import csv
import json
import os
import warnings

import gymnasium as gym
import h5py
import numpy as np
import pytest
from helpers import load_script

minari = pytest.importorskip("minari")  # requirements.txt: minari[hdf5] (tests only)
bc = load_script("bc_offline")
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
FIELDS = ("observations", "next_observations", "actions", "rewards", "terminals", "timeouts")


@pytest.fixture(autouse=True)
def minari_root(tmp_path, monkeypatch):
    """minari writes under $MINARI_DATASETS_PATH (default ~/.minari): keep it inside tmp_path."""
    root = tmp_path / "minari_datasets"
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(root))
    return root


def collect(env, dataset_id, steps_per_episode, seed, **create_kwargs):
    """Random actions through minari.DataCollector; returns the dataset folder and the rows as
    the env produced them (the truth the reader is checked against). An episode that reaches
    its step count unfinished stays open until create_dataset, which marks it truncated."""
    env = minari.DataCollector(env)
    env.action_space.seed(seed)
    rows = {k: [] for k in FIELDS}
    for episode, limit in enumerate(steps_per_episode):
        obs, _ = env.reset(seed=seed + episode)
        for _ in range(limit):
            action = env.action_space.sample()
            next_obs, reward, terminated, truncated, _ = env.step(action)
            for key, value in zip(FIELDS, (obs, next_obs, action, reward, terminated, truncated)):
                rows[key].append(value)
            obs = next_obs
            if terminated or truncated:
                break
    with warnings.catch_warnings():  # minari asks for authors, permalinks and descriptions
        warnings.simplefilter("ignore")
        env.create_dataset(dataset_id=dataset_id, algorithm_name="random", **create_kwargs)
    env.close()
    folder = os.path.join(os.environ["MINARI_DATASETS_PATH"], dataset_id)
    return folder, {k: np.asarray(v) for k, v in rows.items()}


def check_rows(ds, rows):
    """Every row of the reader's Dataset against the recorded transitions."""
    n = len(rows["rewards"])
    assert len(ds.rewards) == n
    np.testing.assert_array_equal(ds.observations, rows["observations"].reshape(n, -1).astype(np.float32))
    np.testing.assert_array_equal(ds.actions, rows["actions"].reshape(ds.actions.shape))
    np.testing.assert_array_equal(ds.rewards, rows["rewards"].astype(np.float32))
    np.testing.assert_array_equal(ds.terminals, rows["terminals"])
    np.testing.assert_array_equal(ds.timeouts, rows["timeouts"])
    # The reader keeps T observations of an episode's T+1 (BC needs no next observation): the
    # next observation of every row inside a trajectory is the following row's observation.
    inside = ~(rows["terminals"] | rows["timeouts"])
    np.testing.assert_array_equal(
        ds.observations[1:][inside[:-1]],
        rows["next_observations"][:-1][inside[:-1]].reshape(-1, ds.observations.shape[1]),
    )


def check_against_minari(folder_id, rows):
    """minari's own reader sees the same transitions as recorded: the file is the real thing."""
    episodes = list(minari.load_dataset(folder_id).iterate_episodes())
    obs = np.concatenate([e.observations[:-1] for e in episodes])
    next_obs = np.concatenate([e.observations[1:] for e in episodes])
    np.testing.assert_array_equal(obs, rows["observations"])
    np.testing.assert_array_equal(next_obs, rows["next_observations"])
    np.testing.assert_array_equal(np.concatenate([e.actions for e in episodes]), rows["actions"])
    np.testing.assert_array_equal(np.concatenate([e.rewards for e in episodes]), rows["rewards"])
    np.testing.assert_array_equal(np.concatenate([e.terminations for e in episodes]), rows["terminals"])
    np.testing.assert_array_equal(np.concatenate([e.truncations for e in episodes]), rows["timeouts"])


def test_discrete_cartpole_with_terminations_and_truncations(tmp_path):
    # Random CartPole falls within about 10-40 steps; a 15-step limit truncates the others.
    # Collected on CartPole-v0 with CartPole-v1 as Minari's eval_env: the eval env wins, as in
    # minari's recover_environment(eval_env=True), since the ref scores are measured there.
    env = gym.make("CartPole-v0", max_episode_steps=15)
    folder, rows = collect(
        env,
        "test/cartpole-random-v0",
        [100] * 12,
        seed=3,
        eval_env="CartPole-v1",
        ref_min_score=9.0,
        ref_max_score=500.0,
    )
    assert os.path.isfile(os.path.join(folder, "data", "metadata.json"))  # minari's real layout
    assert rows["terminals"].sum() >= 2 and rows["timeouts"].sum() >= 2, "need both kinds of ending"
    check_against_minari("test/cartpole-random-v0", rows)
    ds = bc.read_dataset(folder)
    check_rows(ds, rows)
    assert ds.actions.dtype == np.int64 and ds.actions.ndim == 1
    assert ds.metadata["env_id"] == "CartPole-v1"
    assert ds.metadata["ref_min_score"] == 9.0 and ds.metadata["ref_max_score"] == 500.0
    # The data/ folder itself, where minari keeps both files, is read the same way.
    check_rows(bc.read_dataset(os.path.join(folder, "data")), rows)


def test_box_pendulum_truncations_and_an_unfinished_last_episode(tmp_path):
    env = gym.make("Pendulum-v1", max_episode_steps=20)
    # Pendulum never terminates: three 20-step truncated episodes, then one left after 7 steps,
    # which minari marks truncated when the dataset is written.
    folder, rows = collect(
        env, "test/pendulum-random-v0", [100, 100, 100, 7], seed=5, ref_min_score=-1200.0, ref_max_score=-150.0
    )
    assert rows["timeouts"].sum() == 3 and not rows["terminals"].any()
    rows["timeouts"][-1] = True
    check_against_minari("test/pendulum-random-v0", rows)
    ds = bc.read_dataset(folder)
    check_rows(ds, rows)
    assert ds.actions.dtype == np.float32 and ds.actions.shape == (67, 1)
    assert ds.metadata["env_id"] == "Pendulum-v1"
    assert ds.metadata["ref_min_score"] == -1200.0 and ds.metadata["ref_max_score"] == -150.0
    np.testing.assert_array_equal(
        bc.trajectory_bounds(ds.terminals, ds.timeouts), [[0, 20], [20, 40], [40, 60], [60, 67]]
    )


def test_run_takes_the_env_id_and_reference_scores_from_minari(tmp_path, capsys, monkeypatch):
    folder, _ = collect(
        gym.make("Pendulum-v1", max_episode_steps=50),
        "test/pendulum-run-v0",
        [100] * 4,
        seed=7,
        ref_min_score=-1500.0,
        ref_max_score=-100.0,
    )
    monkeypatch.chdir(tmp_path)  # the default run folder, runs/<env_id>__..., lands here
    assert bc.cli(FAST + ["--dataset", folder, "--total-updates", "100"]) == 0
    out = capsys.readouterr().out
    assert "200 examples from 1 file(s), env Pendulum-v1" in out
    (run,) = os.listdir(tmp_path / "runs")
    assert run.startswith("Pendulum-v1__bc_offline__1__")
    with open(tmp_path / "runs" / run / "eval.csv") as f:
        final = list(csv.DictReader(f))[-1]
    expected = 100 * (float(final["mean"]) - -1500.0) / (-100.0 - -1500.0)
    assert abs(float(final["normalized_score"]) - expected) < 0.02  # the scores of minari's metadata


class DictObs(gym.ObservationWrapper):
    def __init__(self, env):
        super().__init__(env)
        self.observation_space = gym.spaces.Dict({"state": env.observation_space})

    def observation(self, obs):
        return {"state": obs}


class TupleObs(gym.ObservationWrapper):
    def __init__(self, env):
        super().__init__(env)
        self.observation_space = gym.spaces.Tuple((env.observation_space,))

    def observation(self, obs):
        return (obs,)


@pytest.mark.parametrize("wrapper,kind", [(DictObs, "Dict"), (TupleObs, "Tuple")])
@pytest.mark.parametrize("without_metadata", [False, True])
def test_dict_and_tuple_observations_are_refused_clearly(tmp_path, capsys, wrapper, kind, without_metadata):
    folder, _ = collect(wrapper(gym.make("Pendulum-v1", max_episode_steps=5)), f"test/{kind.lower()}-v0", [100], seed=0)
    if without_metadata:  # the episode groups alone still give it away
        os.remove(os.path.join(folder, "data", "metadata.json"))
        kind = "Dict or Tuple"
    assert bc.cli(["--dataset", folder, "--env-id", "Pendulum-v1", "--total-updates", "10"]) == 2
    err = capsys.readouterr().err.strip()
    assert f"{kind} space" in err and folder in err and len(err.splitlines()) == 1, err


def _edit_episode(name, key, make):
    def edit(f, meta):
        del f[name][key]
        f[name].create_dataset(key, data=make(f))

    return edit


HOSTILE = {
    "short_observations": (
        _edit_episode("episode_1", "observations", lambda f: np.zeros((5, 3), np.float32)),
        "episode_1: 5 observations for 5 actions (needs T+1)",
    ),
    "rewards_2d": (
        _edit_episode("episode_0", "rewards", lambda f: np.zeros((5, 2))),
        "episode_0: rewards of shape (5, 2), expected (5,)",
    ),
    "flags_not_boolean": (
        _edit_episode("episode_0", "terminations", lambda f: np.full(5, 0.5)),
        "episode_0: terminations are not booleans",
    ),
    "text_observations": (
        _edit_episode("episode_0", "observations", lambda f: np.array(["a"] * 6, dtype=object)),
        "episode_0: observations are not numbers",
    ),
    "narrower_observations": (
        _edit_episode("episode_1", "observations", lambda f: np.zeros((6, 2), np.float32)),
        "episode_1: observations of shape (2,), episode_0's are (3,)",
    ),
    "integer_actions": (
        _edit_episode("episode_1", "actions", lambda f: np.zeros((5, 1), np.int64)),
        "episode_1: actions int64 of shape (1,), episode_0's are float32 of shape (1,)",
    ),
    "stray_member": (lambda f, meta: f.create_dataset("notes", data=np.zeros(3)), "'notes' is not an episode group"),
    "missing_rewards": (lambda f, meta: f["episode_0"].__delitem__("rewards"), "episode_0 is missing rewards"),
    "episode_count": (
        lambda f, meta: meta.update(total_episodes=5),
        "metadata.json says 5 episodes, main_data.hdf5 holds 2",
    ),
    "arrow": (lambda f, meta: meta.update(data_format="arrow"), "data_format 'arrow'"),
    "ref_score_text": (lambda f, meta: meta.update(ref_max_score="high"), "ref_max_score must be a number"),
}


@pytest.mark.parametrize("problem", sorted(HOSTILE))
def test_hostile_minari_files_are_one_clear_line(tmp_path, capsys, problem):
    folder, _ = collect(gym.make("Pendulum-v1", max_episode_steps=5), "test/hostile-v0", [100, 100], seed=1)
    edit, message = HOSTILE[problem]
    meta_path = os.path.join(folder, "data", "metadata.json")
    with open(meta_path) as f:
        meta = json.load(f)
    with h5py.File(os.path.join(folder, "data", "main_data.hdf5"), "a") as f:
        edit(f, meta)
    with open(meta_path, "w") as f:
        json.dump(meta, f)
    assert bc.cli(["--dataset", folder, "--total-updates", "10"]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and folder in err and len(err.splitlines()) == 1, err


def test_unparseable_metadata_json_is_refused(tmp_path, capsys):
    folder, _ = collect(gym.make("Pendulum-v1", max_episode_steps=5), "test/badjson-v0", [100], seed=1)
    with open(os.path.join(folder, "data", "metadata.json"), "w") as f:
        f.write("{not json")
    assert bc.cli(["--dataset", folder, "--total-updates", "10"]) == 2
    err = capsys.readouterr().err.strip()
    assert "metadata.json: not valid JSON" in err and len(err.splitlines()) == 1, err
