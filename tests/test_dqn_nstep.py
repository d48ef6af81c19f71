"""n-step assembly against a brute-force reference over whole recorded episodes."""

import numpy as np
import pytest
from helpers import load_script

dqn = load_script("dqn_prioritized")


def brute_force(episodes, n, gamma):
    """All n-step transitions of complete recorded episodes, computed directly.

    Each episode is (obs[T+1], actions[T], rewards[T], terminated_at_end). Transition t spans
    k = min(n, T - t) steps; it bootstraps from obs[t+k] with gamma^k unless it reaches a
    terminal end.
    """
    out = []
    for obs, actions, rewards, terminated in episodes:
        T = len(actions)
        for t in range(T):
            k = min(n, T - t)
            ret = sum(gamma**j * rewards[t + j] for j in range(k))
            ends_terminal = terminated and t + k == T
            out.append(
                (
                    tuple(np.round(obs[t], 5)),
                    int(actions[t]),
                    round(float(ret), 4),
                    tuple(np.round(obs[t + k], 5)),
                    round(0.0 if ends_terminal else gamma**k, 5),
                )
            )
    return sorted(out)


def simulate(num_envs, n, gamma, steps, seed, clip=None, script=None):
    """Random streams with random terminations/truncations, fed to the assembler step by step
    (dqn_prioritized.py's, or the copy in another script)."""
    rng = np.random.default_rng(seed)
    asm = (script or dqn).NStepAssembler(n, gamma, num_envs, (2,), np.float32, clip_reward=clip)
    episodes = [[] for _ in range(num_envs)]
    current = [{"obs": [rng.normal(size=2).astype(np.float32)], "a": [], "r": []} for _ in range(num_envs)]
    emitted = []
    obs = np.stack([c["obs"][0] for c in current])
    for _ in range(steps):
        action = rng.integers(0, 5, num_envs)
        reward = rng.normal(size=num_envs).astype(np.float32) * 3
        final = rng.normal(size=(num_envs, 2)).astype(np.float32)
        u = rng.random(num_envs)
        terminated, truncated = u < 0.08, (u >= 0.08) & (u < 0.14)
        out = asm.push(obs, action, reward, final, terminated, truncated)
        if out is not None:
            for i in range(len(out["action"])):
                emitted.append(
                    (
                        tuple(np.round(out["obs"][i], 5)),
                        int(out["action"][i]),
                        round(float(out["reward"][i]), 4),
                        tuple(np.round(out["next_obs"][i], 5)),
                        round(float(out["discount"][i]), 5),
                    )
                )
        next_obs = final.copy()
        for e in range(num_envs):
            c = current[e]
            c["a"].append(action[e])
            c["r"].append(np.clip(reward[e], -clip, clip) if clip else reward[e])
            c["obs"].append(final[e])
            if terminated[e] or truncated[e]:
                episodes[e].append(
                    (np.array(c["obs"]), np.array(c["a"]), np.array(c["r"], np.float64), bool(terminated[e]))
                )
                reset = rng.normal(size=2).astype(np.float32)
                current[e] = {"obs": [reset], "a": [], "r": []}
                next_obs[e] = reset
        obs = next_obs
    complete = [ep for eps in episodes for ep in eps]
    return sorted(emitted), complete, current


@pytest.mark.parametrize("script", ["dqn_prioritized", "apex_dqn"])
@pytest.mark.parametrize("num_envs,n", [(1, 1), (1, 3), (4, 3), (3, 5)])
def test_nstep_matches_brute_force(num_envs, n, script):
    gamma = 0.9
    emitted, complete, unfinished = simulate(
        num_envs, n, gamma, 400, seed=num_envs * 10 + n, script=load_script(script)
    )
    assert any(not ep[3] for ep in complete) and any(ep[3] for ep in complete)  # both kinds of ends
    expected = brute_force(complete, n, gamma)
    # Unfinished episodes: their first T - (n - 1) transitions are already out (full n steps).
    for c in unfinished:
        T = len(c["a"])
        full = [
            (
                tuple(np.round(c["obs"][t], 5)),
                int(c["a"][t]),
                round(float(sum(gamma**j * np.float64(c["r"][t + j]) for j in range(n))), 4),
                tuple(np.round(c["obs"][t + n], 5)),
                round(gamma**n, 5),
            )
            for t in range(T - n + 1)
        ]
        expected += full
    expected = sorted(expected)
    assert len(emitted) == len(expected)
    for got, want in zip(emitted, expected):
        assert got[0] == want[0] and got[1] == want[1] and got[3] == want[3] and got[4] == want[4]
        assert got[2] == pytest.approx(want[2], abs=2e-3)


def test_reward_clipping_applies_per_step():
    emitted, complete, unfinished = simulate(2, 3, 0.99, 200, seed=7, clip=1.0)
    expected = brute_force(complete, 3, 0.99)
    got_by_key = {(e[0], e[1]): e[2] for e in emitted}
    for want in expected:
        assert got_by_key[(want[0], want[1])] == pytest.approx(want[2], abs=2e-3)
