#!/usr/bin/env bash
# DQN CartPole-v1 defaults, seeds 1-20, two at a time on this 2-core VM; eval.csv copies here.
cd "$(git rev-parse --show-toplevel)"
seq 1 20 | xargs -P 2 -I{} sh -c '.venv/bin/python algos/dqn_prioritized.py --seed {} --run-dir /tmp/seeds/{} > results/runs/15e5eea/cartpole-seeds-logs/seed{}.log 2>&1; cp /tmp/seeds/{}/eval.csv results/runs/15e5eea/dqn-cartpole-seed{}.csv'
