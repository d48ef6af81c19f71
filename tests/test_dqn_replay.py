"""Prioritized replay: insertion priority, IS weights, beta schedule, stale-slot guard, uniform
mode, checkpoint state; and sample_batches / write_priorities on thread pools as train() runs them
(one thread samples ahead, another writes the priorities back)."""

import concurrent.futures
import time

import jax.numpy as jnp
import numpy as np
import pytest
from helpers import load_script

dqn = load_script("dqn_prioritized")


def rows(n, start=0, obs_dim=2):
    v = np.arange(start, start + n, dtype=np.float32)
    return {
        "obs": np.repeat(v[:, None], obs_dim, 1),
        "next_obs": np.repeat(v[:, None], obs_dim, 1) + 0.5,
        "action": np.arange(start, start + n) % 3,
        "reward": v,
        "discount": np.full(n, 0.9, np.float32),
    }


def make(capacity=16, alpha=0.6, eps=1e-6):
    return dqn.PrioritizedReplay(capacity, (2,), np.float32, alpha, eps)


def test_staged_rows_reach_the_buffer_on_flush_and_keep_their_contents():
    rp = make(capacity=300)
    rp.add(rows(5))
    assert rp.buffer.get_stored_size() == 0  # staged, not yet in cpprb
    rp.flush()
    assert rp.buffer.get_stored_size() == 5
    rp.add(rows(200, start=5))  # crosses the staging size: flushes by itself
    rp.flush()
    assert rp.buffer.get_stored_size() == 205
    batch, idx, _ = rp.sample(64)
    assert batch["reward"].shape == (1, 64) and batch["obs"].shape == (1, 64, 2)  # [K, B, ...]
    np.testing.assert_array_equal(batch["reward"].reshape(-1), idx.astype(np.float32))  # slot i holds row i
    np.testing.assert_array_equal(batch["obs"][0, :, 0], idx.astype(np.float32))


def test_new_transitions_get_the_max_priority_so_far():
    rp = make(alpha=1.0, eps=0.0)
    rp.add(rows(4))
    rp.flush()
    _, idx, stamps = rp.sample(4)
    rp.update_priorities(np.array([0, 1, 2, 3]), np.zeros(4, np.int64) + 1, np.array([1.0, 2.0, 7.0, 3.0]))
    rp.add(rows(2, start=4))
    rp.flush()
    assert rp.priority[4] == rp.priority[5] == 7.0
    assert rp.buffer.get_max_priority() == 7.0


def test_importance_weights_match_hand_computation():
    alpha, eps, beta = 0.6, 0.01, 0.5
    rp = make(capacity=8, alpha=alpha, eps=eps)
    rp.add(rows(5))
    rp.flush()
    p = np.array([0.5, 1.0, 2.0, 4.0, 0.1])
    rp.update_priorities(np.arange(5), np.ones(5, np.int64), p)
    # P(i) = (p_i + eps)^alpha / sum; w_i = (N P(i))^-beta / max_j (N P(j))^-beta
    scaled = (p + eps) ** alpha
    P = scaled / scaled.sum()
    w = (5 * P) ** -beta
    expected = w / w.max()
    batch, idx, _ = rp.sample(2000, beta=beta)
    np.testing.assert_allclose(batch["weights"].reshape(-1), expected[idx], rtol=1e-4)
    # Sampling frequencies follow P.
    freq = np.bincount(idx, minlength=5) / len(idx)
    np.testing.assert_allclose(freq, P, atol=0.03)


def test_uniform_mode_is_alpha_zero():
    rp = make(capacity=8, alpha=0.0)
    rp.add(rows(8))
    rp.flush()
    rp.update_priorities(np.arange(8), np.ones(8, np.int64), np.array([100.0, 1, 1, 1, 1, 1, 1, 0.01]))
    batch, idx, _ = rp.sample(4000, beta=0.7)
    np.testing.assert_array_equal(batch["weights"], np.ones((1, 4000), np.float32))
    np.testing.assert_allclose(np.bincount(idx, minlength=8) / 4000, np.full(8, 1 / 8), atol=0.03)


def test_stale_priorities_never_land_on_overwritten_slots():
    rp = make(capacity=4, alpha=1.0, eps=0.0)
    rp.add(rows(4))
    rp.flush()
    _, idx, stamps = rp.sample(64)
    assert set(idx.tolist()) == {0, 1, 2, 3}
    # Slots 0 and 1 are overwritten by new transitions after the sample was drawn.
    rp.add(rows(2, start=10))
    rp.flush()
    new_max = rp.buffer.get_max_priority()
    kept = rp.update_priorities(idx, stamps, np.full(len(idx), 50.0))
    assert kept == int(np.isin(idx, [2, 3]).sum())
    assert rp.priority[0] == rp.priority[1] == new_max  # the new rows keep their insert priority
    assert rp.priority[2] == rp.priority[3] == 50.0


def test_beta_schedule_linear_to_one():
    assert dqn.linear_schedule(0.4, 1.0, 1000, 0) == pytest.approx(0.4)
    assert dqn.linear_schedule(0.4, 1.0, 1000, 500) == pytest.approx(0.7)
    assert dqn.linear_schedule(0.4, 1.0, 1000, 1000) == pytest.approx(1.0)
    assert dqn.linear_schedule(0.4, 1.0, 1000, 5000) == pytest.approx(1.0)


@pytest.mark.parametrize("stored,next_index", [(5, 5), (8, 3), (8, 0)])
def test_state_dict_round_trip_restores_slots_priorities_and_insert_position(stored, next_index):
    rp = make(capacity=8, alpha=1.0, eps=0.0)
    rp.add(rows(stored + (next_index if stored == 8 else 0)))
    rp.flush()
    assert rp.buffer.get_next_index() == next_index
    rp.update_priorities(np.arange(stored), rp.write_count[:stored].copy(), np.arange(1, stored + 1) * 1.5)
    rp.update_priorities(np.array([0]), rp.write_count[:1].copy(), np.array([99.0]))
    rp.update_priorities(np.array([0]), rp.write_count[:1].copy(), np.array([1.5]))  # max stays 99
    state = rp.state_dict()

    other = make(capacity=8, alpha=1.0, eps=0.0)
    other.load_state_dict(state, "state", num_actions=3)
    assert other.buffer.get_stored_size() == stored
    assert other.buffer.get_next_index() == next_index
    assert other.buffer.get_max_priority() == 99.0
    np.testing.assert_array_equal(other.priority[:stored], rp.priority[:stored])
    a, b = rp.buffer.get_all_transitions(), other.buffer.get_all_transitions()
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])
    # Sampling distributions agree (same priorities in the same slots).
    _, idx, _ = other.sample(4000)
    expected = rp.priority[:stored] / rp.priority[:stored].sum()
    np.testing.assert_allclose(np.bincount(idx, minlength=stored) / 4000, expected, atol=0.03)


@pytest.mark.parametrize(
    "member,value",
    [("replay/action", 3), ("replay/action", -1), ("replay/discount", 1.5), ("replay/priority", 100.0)],
)
def test_load_state_dict_refuses_rows_out_of_range(member, value):
    """Actions must lie in [0, num_actions), discounts in [0, 1], priorities at most the max."""
    rp = make(capacity=8, alpha=1.0, eps=0.0)
    rp.add(rows(5))
    rp.flush()
    state = {k: v.copy() for k, v in rp.state_dict().items()}
    make(capacity=8, alpha=1.0, eps=0.0).load_state_dict(state, "state", num_actions=3)  # as saved: loads
    state[member][2] = value
    other = make(capacity=8, alpha=1.0, eps=0.0)
    with pytest.raises(dqn.ConfigError, match="out of range"):
        other.load_state_dict(state, "state", num_actions=3)
    assert other.buffer.get_stored_size() == 0  # nothing of the bad file went in


def test_sample_right_after_add_refuses_in_one_line_until_flush():
    """add() stages rows (128 at a time); sample() draws from what cpprb holds, and says so when that is none."""
    rp = make(capacity=300)
    rp.add(rows(100))
    with pytest.raises(ValueError, match=r"no rows in cpprb yet \(100 staged: flush\(\) hands them over\)"):
        rp.sample(8)
    assert len(rp) == 0
    rp.flush()
    assert len(rp) == 100 and rp.sample(8)[0]["obs"].shape == (1, 8, 2)


# --- the Learner's sample and write_priorities on thread pools, as train() runs them ---------------


def learner_for(rp, args):
    """The Learner train() would build for this replay (a small MLP: its train state is not used here)."""
    return dqn.Learner(args, dqn.QNetwork(3, (4,)), rp, (2,))


def sampling_setup(k=2, b=4, capacity=32):
    """A filled replay (slot i holds obs [i, i]), the Args and the learner train() would use."""
    rp = make(capacity=capacity, alpha=0.6)
    rp.add(rows(capacity))
    rp.flush()
    args = dqn.Args(batch_size=b, updates_per_call=k)
    return rp, args, learner_for(rp, args)


def test_sample_batches_ahead_delivers_every_call_in_order_and_stops_cleanly():
    k, b, prefetch = 2, 4, 3
    rp, args, learner = sampling_setup(k, b)
    drawn, real_sample = [], rp.sample

    def recording_sample(*a, **kw):  # what each draw on the prefetch thread returned, in call order
        out = real_sample(*a, **kw)
        drawn.append(out[1].copy())
        return out

    rp.sample = recording_sample
    sampler = concurrent.futures.ThreadPoolExecutor(1, "prefetch")
    ahead, got = [], []
    for _ in range(50):
        while len(ahead) < prefetch:
            ahead.append(sampler.submit(learner.sample, 0.4))
        batches, indexes, stamps, _ = ahead.pop(0).result()
        assert batches["obs"].sharding == learner.shardings.split  # on the learner's device(s), split along B
        obs = np.asarray(batches["obs"])
        assert obs.shape == (k, b, 2) and np.asarray(batches["weights"]).shape == (k, b)
        np.testing.assert_array_equal(obs[..., 0].reshape(-1), indexes)  # rows and indexes together
        np.testing.assert_array_equal(stamps, rp.write_count[indexes])
        got.append(indexes)
    assert len(drawn) >= 50
    for i, indexes in enumerate(got):  # the i-th batch taken is the i-th drawn
        np.testing.assert_array_equal(indexes, drawn[i])
    assert len({tuple(i) for i in got}) > 40  # independent draws, so an order mix-up would show
    t0 = time.perf_counter()
    sampler.shutdown(cancel_futures=True)
    assert time.perf_counter() - t0 < 2.0
    assert not any(t.is_alive() for t in sampler._threads)


def test_a_sampling_error_is_raised_by_the_future_of_that_call():
    rp, args, learner = sampling_setup()
    calls, real_sample = [], rp.sample

    def failing_sample(*a, **kw):
        calls.append(1)
        if len(calls) > 2:
            raise ValueError("boom")
        return real_sample(*a, **kw)

    rp.sample = failing_sample
    with concurrent.futures.ThreadPoolExecutor(1, "prefetch") as sampler:
        ahead = [sampler.submit(learner.sample, 0.4) for _ in range(3)]
        assert all(len(f.result()[1]) == args.updates_per_call * args.batch_size for f in ahead[:2])
        with pytest.raises(ValueError, match="boom"):
            ahead[2].result()


def writer_of(rp):
    """prioritized -> the write_priorities of a learner with --prioritized or --no-prioritized."""
    return lambda prioritized: learner_for(rp, dqn.Args(prioritized=prioritized)).write_priorities


def test_write_priorities_writes_back_in_submission_order_and_reports_errors():
    rp = make(capacity=8, alpha=1.0, eps=0.0)
    write_priorities = writer_of(rp)
    rp.add(rows(8))
    rp.flush()
    _, idx, stamps = rp.sample(8, 2)
    td = jnp.arange(16, dtype=jnp.float32).reshape(2, 8)  # [K, B] on the device, as the learner returns
    with concurrent.futures.ThreadPoolExecutor(1, "priority-writer") as writer:
        assert writer.submit(write_priorities(True), idx, stamps, td, 0).result() is None
        last = {}
        for i, p in zip(idx, np.asarray(td).reshape(-1)):
            last[int(i)] = p
        for i, p in last.items():
            assert rp.priority[i] == p
        # Two calls' writes to the same slots, queued together: the later call's values stay.
        first = writer.submit(write_priorities(True), idx[:4], stamps[:4], np.full((1, 4), 3.0), 32)
        second = writer.submit(write_priorities(True), idx[:4], stamps[:4], np.full((1, 4), 9.0), 33)
        first.result(), second.result()
        assert np.all(rp.priority[idx[:4]] == 9.0)
        bad = writer.submit(write_priorities(True), idx[:3], stamps[:2], np.ones((1, 3)), 34)
        with pytest.raises(ValueError):  # mismatched lengths: fails in the thread, raised by result()
            bad.result()


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_a_non_finite_td_stops_the_run_naming_the_step_and_never_reaches_the_tree(bad):
    rp = make(capacity=8, alpha=1.0, eps=0.0)
    write_priorities = writer_of(rp)
    rp.add(rows(8))
    rp.flush()
    _, idx, stamps = rp.sample(4, 3)
    rp.update_priorities(np.arange(8), rp.write_count.copy(), np.linspace(1.0, 2.0, 8))
    before, max_before = rp.priority.copy(), rp.buffer.get_max_priority()
    td = np.ones((3, 4))
    td[2, 1] = bad  # the third of the K = 3 steps after SGD step 100
    with concurrent.futures.ThreadPoolExecutor(1, "priority-writer") as writer:
        future = writer.submit(write_priorities(True), idx, stamps, jnp.asarray(td), 100)
        with pytest.raises(dqn.RunFailed, match="the learner diverged: non-finite TD error at SGD step 103"):
            future.result()
    np.testing.assert_array_equal(rp.priority, before)  # not even the finite steps' rows were written
    assert rp.buffer.get_max_priority() == max_before
    batch, sampled, _ = rp.sample(2000)
    assert np.isfinite(batch["weights"]).all()
    # cpprb's tree still holds the priorities from before: slots drawn in proportion to them.
    np.testing.assert_allclose(np.bincount(sampled, minlength=8) / 2000, before[:8] / before[:8].sum(), atol=0.04)
    # The replay itself refuses what would poison cpprb's sums, whoever calls it.
    for poison in (np.nan, -1.0):
        with pytest.raises(ValueError, match="finite and >= 0"):
            rp.update_priorities(idx[:1], stamps[:1], np.array([poison]))


def test_uniform_runs_check_for_divergence_but_write_nothing():
    rp = make(capacity=8, alpha=0.0, eps=1e-6)
    write_priorities = writer_of(rp)
    rp.add(rows(8))
    rp.flush()
    before = rp.priority.copy()
    _, idx, stamps = rp.sample(4, 2)
    with concurrent.futures.ThreadPoolExecutor(1, "priority-writer") as writer:
        writer.submit(write_priorities(False), idx, stamps, np.full((2, 4), 5.0), 0).result()
        np.testing.assert_array_equal(rp.priority, before)
        future = writer.submit(write_priorities(False), idx, stamps, np.full((2, 4), np.nan), 64)
        with pytest.raises(dqn.RunFailed, match="SGD step 65"):
            future.result()
