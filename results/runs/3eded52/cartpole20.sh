#!/usr/bin/env bash
# DQN defaults on CartPole-v1, seeds 1-20, two at a time (issue 58 item 7: 475+ in at least 19); each
# run's eval.csv is kept here as dqn-cartpole-seedN.csv
cd "$(dirname "$0")/../../.."  # the repository root
run() { .venv/bin/python algos/dqn_prioritized.py --seed $1 --run-dir runs/cp20/seed$1 > runs/cp20/seed$1.log 2>&1; echo "seed $1 rc $?"; }
rm -rf runs/cp20 && mkdir -p runs/cp20
for s in $(seq 1 2 20); do run $s & run $((s+1)) & wait; done
