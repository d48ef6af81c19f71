#!/usr/bin/env bash
# Reproducible benchmarks. Figures go to stdout as markdown tables; runs go to runs/bench/.
#
#   ./benchmark.sh dqn-solve [SEEDS]    default DQN run on CartPole-v1 per seed (default 1..5):
#                                       env steps and wall time until eval >= 475, final eval
#   ./benchmark.sh dqn-speed [REPEATS]  env steps/s at CleanRL dqn_jax.py's CartPole settings
#                                       (500k steps), PER and 3-step on; num_envs 1 and 8
#
# Set PYTHON to choose the interpreter (default: .venv/bin/python if present, else python3).
set -euo pipefail
cd "$(dirname "$0")"
PYTHON=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
OUT=runs/bench
mkdir -p "$OUT"

usage() { sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
is_count() { [[ "$1" =~ ^[1-9][0-9]*$ ]] || { echo "benchmark.sh: error: '$1' is not a positive count" >&2; exit 2; }; }

summarise() {  # summarise THRESHOLD RUN_DIR...: one table row per run, read from its event file
  "$PYTHON" - "$@" <<'PY'
import glob, statistics, sys
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
threshold, dirs = float(sys.argv[1]), sys.argv[2:]
print("| run | steps to eval >= %g | wall s to it | final eval | env steps/s |" % threshold)
print("|---|---|---|---|---|")
walls, steps, sps = [], [], []
for d in dirs:
    files = glob.glob(f"{d}/events.out.tfevents.*")
    if not files:
        print(f"| {d} | crashed (no events) | | | |"); continue
    ea = EventAccumulator(files[0], size_guidance={"scalars": 0}); ea.Reload()
    start = ea.FirstEventTimestamp()
    evals = ea.Scalars("eval/episodic_return") if "eval/episodic_return" in ea.Tags()["scalars"] else []
    hit = next((e for e in evals if e.value >= threshold), None)
    last = evals[-1] if evals else None
    rate = ea.Scalars("charts/SPS")
    overall = rate[-1].step / (rate[-1].wall_time - start) if rate else float("nan")
    sps.append(overall)
    if hit:
        steps.append(hit.step); walls.append(hit.wall_time - start)
    print(f"| {d} | {hit.step if hit else 'not reached'} | {f'{hit.wall_time - start:.1f}' if hit else '-'} "
          f"| {f'{last.value:.1f}' if last else 'crashed'} | {overall:.0f} |")
if steps:
    print(f"| median | {statistics.median(steps):.0f} | {statistics.median(walls):.1f} | | {statistics.median(sps):.0f} |")
PY
}

mode=${1:-}
case "$mode" in
  dqn-solve)
    seeds=${2:-5}; is_count "$seeds"
    dirs=()
    for s in $(seq 1 "$seeds"); do
      d="$OUT/dqn-solve-seed$s"; rm -rf "$d"; dirs+=("$d")
      "$PYTHON" algos/dqn_prioritized.py --seed "$s" --eval-every 5000 --run-dir "$d" > "$d.log" 2>&1 \
        || echo "seed $s crashed, see $d.log" >&2
    done
    summarise 475 "${dirs[@]}"
    ;;
  dqn-speed)
    repeats=${2:-3}; is_count "$repeats"
    cleanrl=(--total-timesteps 500000 --train-frequency 10 --batch-size 128 --buffer-size 10000
             --learning-rate 2.5e-4 --target-network-frequency 500 --learning-starts 10000
             --exploration-fraction 0.5 --end-e 0.05 --hidden-sizes 120 84 --no-anneal-lr
             --eval-every 500000 --checkpoint-every 0)
    for envs in 1 8; do
      dirs=()
      for r in $(seq 1 "$repeats"); do
        d="$OUT/dqn-speed-envs$envs-$r"; rm -rf "$d"; dirs+=("$d")
        "$PYTHON" algos/dqn_prioritized.py "${cleanrl[@]}" --num-envs "$envs" --seed "$r" --run-dir "$d" \
          > "$d.log" 2>&1 || echo "run $d crashed, see $d.log" >&2
      done
      echo; echo "num_envs=$envs"
      summarise 475 "${dirs[@]}"
    done
    ;;
  *) usage ;;
esac
