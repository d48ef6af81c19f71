"""Learning, tested for real: seeded end-to-end runs that must reach a return threshold."""

import csv
import os

import pytest
from helpers import ROOT, load_script


def test_dqn_default_run_solves_cartpole(tmp_path):
    """Solved = an evaluation (10 greedy episodes) averages >= 475 within 100k steps. The final
    evaluation is not asserted: in about 1 of 20 default runs the greedy policy collapses from
    500 to ~200 in the last 20k steps (README), and runs are not bit-reproducible."""
    dqn = load_script("dqn_prioritized")
    result = dqn.main(dqn.Args(seed=1, run_dir=str(tmp_path / "dqn")))
    assert result["global_step"] <= 100_000
    with open(os.path.join(result["run_dir"], "eval.csv")) as f:
        evals = [float(row["mean"]) for row in csv.DictReader(f)]
    assert len(evals) == 10 and max(evals) >= 475, evals


def test_sac_default_run_reaches_pendulum_threshold(tmp_path):
    sac = load_script("sac")
    result = sac.main(sac.Args(seed=1, run_dir=str(tmp_path / "sac")))
    assert result["global_step"] <= 20_000
    assert result["eval_mean"] >= -200, result


@pytest.mark.parametrize("name", ["pendulum-sac-expert.hdf5", "cartpole-dqn-expert.hdf5", "halfcheetah-sac-medium.hdf5"])
def test_bc_on_shipped_datasets_reaches_90_percent_of_the_data(tmp_path, name):
    bc = load_script("bc_offline")
    path = os.path.join(ROOT, "data", name)
    ds = bc.read_dataset(path)
    meta = ds.metadata
    data_score = 100 * (meta["mean_return"] - meta["ref_min_score"]) / (meta["ref_max_score"] - meta["ref_min_score"])
    result = bc.main(bc.Args(dataset=[path], seed=1, run_dir=str(tmp_path / "bc")))
    assert result["score"] >= 0.9 * data_score, (result, data_score)
