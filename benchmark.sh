#!/usr/bin/env bash
# The runs behind README's and docs/'s tables, then results/summary.md and results/*.png.
#
#   ./benchmark.sh [-j N] [--seeds N] [--force] [--runs DIR] [--out DIR] MODE
#
#   quick     each script's defaults on its default task; 3 seeds
#   full      docs/benchmarks.md's results: DQN on 4 classic-control tasks, SAC on Pendulum-v1 and
#             4 MuJoCo tasks (100k steps, only --env-id set), BC on the 3 shipped datasets; 5 seeds
#   ablation  PER on/off and 5- vs 1-step for DQN, PER on/off for SAC and BC; 5 seeds
#   speed     this project, sbx and CleanRL's dqn_jax.py side by side (own venvs .venv-sbx and
#             .venv-cleanrl, built once): results/speed_vs_peers.md; 3 rounds
#   atari     DQN on pixels: replay memory per transition (compressed at 1M and 100k, naive at 100k)
#             and --preset atari on ALE/Pong-v5 (30k steps); 2 seeds
#   atari10m  --preset atari --num-envs 32 on ALE/Pong-v5 and ALE/Breakout-v5 to 10M frames (2.5M agent
#             steps), seed 1: a GPU or TPU machine (the 1M replay: ~8 GB of RAM); on a TPU v5e about 12 min
#             a game; in 10-min calls, `timeout -s TERM 540 ./benchmark.sh atari10m` again until both are done
#   apex      Ape-X on CartPole-v1, 1, 2 and 4 actors, beside dqn_prioritized.py; 3 seeds
#   minatar   MinAtar's five games (-v0) at 1M steps against the MinAtar paper's DQN: --preset minatar
#             on all five, the paper's replay (uniform, 1-step) on Asterix and Breakout (2 seeds), then
#             Asterix at 5M (seed 1); one run at a time: on a TPU v5e about 5 min a 1M run (100 min in all);
#             a run stopped by SIGTERM resumes when the mode is run again
#   accelerator PART   on a GPU or TPU machine: PART (dqn, minatar, sac, bc, cleanrl, sbx, atari, cleanrl-atari
#             or learning; benchmark/accelerator.py) there and on its host CPU: results/accelerator.md; minatar
#             (500k, 1.5 min on a TPU v5e), atari (Pong 200k, 2 min), cleanrl-atari (stopped at 9 min) there only
#   stress    Ctrl-C at random moments (half of the runs twice) of a seed loop calling train(), two at a time:
#             aborts counted, every checkpoint resumed (benchmark/stress.py); DQN, SAC and Ape-X, 50 runs each
#             (--seeds N: N runs each); exit 1 on an abort or a checkpoint that does not load
#   summary   only rebuild the summary from the runs already there
#
#   -j N       runs in parallel (default: the number of cores; speed, atari and apex: one at a time)
#   --seeds N  seeds 1..N instead of the mode's default (speed: rounds)
#   --force    rerun finished runs (by default kept; a run stopped after a checkpoint resumes)
#   --runs DIR where runs go (default runs/bench): DIR/<mode>/<config>/<task>/seed<N>{,.log,.exit}
#   --out DIR  where summary.md and the plots go (default results)
#
# PYTHON chooses the interpreter (default: .venv/bin/python if present, else python3).
set -euo pipefail
cd "$(dirname "$0")"  # the repository root: the paths below start there
PYTHON=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
MODES="quick, full, ablation, speed, atari, atari10m, apex, minatar, stress, accelerator or summary"

die() { echo "benchmark.sh: error: $*" >&2; exit 2; }
usage() { sed -n '2,/^# PYTHON/p' benchmark.sh | sed 's/^# \{0,1\}//'; }
is_count() { [[ "$2" =~ ^[1-9][0-9]*$ ]] || die "$1 needs a positive whole number, got '$2'"; }

JOBS=$(nproc 2>/dev/null || echo 2) SEEDS="" FORCE="" RUNS=runs/bench OUT=results MODE="" PART=""
while (( $# )); do
  case "$1" in
    -j) (( $# >= 2 )) || die "-j needs a value"; is_count -j "$2"; JOBS=$2; shift 2 ;;
    -j*) is_count -j "${1#-j}"; JOBS=${1#-j}; shift ;;
    --seeds) (( $# >= 2 )) || die "--seeds needs a value"; is_count --seeds "$2"; SEEDS=$2; shift 2 ;;
    --force) FORCE=1; shift ;;
    --runs) (( $# >= 2 )) || die "--runs needs a directory"; RUNS=$2; shift 2 ;;
    --out) (( $# >= 2 )) || die "--out needs a directory"; OUT=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    -*) die "unknown option '$1' (see ./benchmark.sh --help)" ;;
    *) if [ -z "$MODE" ]; then MODE=$1; elif [ "$MODE" = accelerator ] && [ -z "$PART" ]; then PART=$1
       else die "one mode at a time, got '$MODE' and '$1'"; fi; shift ;;
  esac
done
case "$MODE" in
  quick|full|ablation|speed|atari|atari10m|apex|minatar|summary) ;;
  stress)
    for script in dqn sac apex; do
      "$PYTHON" benchmark/stress.py "$script" --runs "${SEEDS:-50}" --jobs 2 --out "$RUNS/stress" || exit 1
    done
    exit 0 ;;
  accelerator)
    PARTS="dqn minatar sac bc cleanrl sbx atari cleanrl-atari learning"
    [[ " $PARTS " == *" $PART "* ]] || die "accelerator needs one part of: $PARTS"
    if [ "$("$PYTHON" -c 'import jax; print(jax.default_backend())')" = cpu ]; then
      echo "benchmark.sh accelerator: JAX sees no accelerator here (only the CPU): nothing to measure"; exit 0
    fi
    exec "$PYTHON" benchmark/accelerator.py "$PART" "$RUNS" "$OUT" ;;
  "") usage >&2; die "no mode given: $MODES" ;;
  *) die "unknown mode '$MODE': $MODES" ;;
esac

# run STEM CMD...: one run with --run-dir STEM, output in STEM.log, exit status in STEM.exit.
run() {
  local stem=$1; shift
  if [ -z "$FORCE" ] && [ "$(cat "$stem.exit" 2>/dev/null)" = 0 ]; then
    echo "kept   $stem (finished before; --force reruns it)"; return 0
  fi
  local rc=0 code
  code=$(cat "$stem.exit" 2>/dev/null || true)
  if [ -z "$FORCE" ] && [ -f "$stem/checkpoint.npz" ] && [[ "$code" =~ ^(|130|137|143)$ ]]; then
    # Stopped by a signal or killed after a checkpoint: continue it with its own flags (args.json).
    rm -f "$stem.exit"
    echo "resume $stem"
    "$1" "$2" --resume "$stem" >> "$stem.log" 2>&1 || rc=$?
  else
    rm -rf "$stem" "$stem.log" "$stem.exit"; mkdir -p "$(dirname "$stem")"
    echo "start  $stem"
    "$@" --run-dir "$stem" > "$stem.log" 2>&1 || rc=$?
  fi
  echo "$rc" > "$stem.exit"
  if [ "$rc" = 0 ]; then echo "done   $stem"; else echo "FAILED $stem (exit $rc, see $stem.log)" >&2; fi
}
# launch ...: run in the background, at most JOBS at a time.
launch() {
  while (( $(jobs -rp | wc -l) >= JOBS )); do wait -n || true; done
  run "$@" &
}
# seeds MODE CONFIG TASK SCRIPT FLAGS...: one run per seed.
seeds() {
  local suite=$1 config=$2 task=$3 script=$4; shift 4
  for s in $(seq 1 "$NSEEDS"); do
    launch "$RUNS/$suite/$config/$task/seed$s" "$PYTHON" "algos/$script" --seed "$s" "$@"
  done
}

DQN=dqn_prioritized.py SAC=sac.py BC=bc_offline.py APEX=apex_dqn.py
MUJOCO=(--total-timesteps 100000)  # the defaults a user gets with only --env-id (issue 11)
MEDIUM=data/halfcheetah-sac-medium.hdf5
case "$MODE" in
  quick)
    NSEEDS=${SEEDS:-3}
    seeds quick dqn CartPole-v1 $DQN
    seeds quick sac Pendulum-v1 $SAC
    seeds quick bc pendulum-sac-expert $BC --dataset data/pendulum-sac-expert.hdf5
    seeds quick bc cartpole-dqn-expert $BC --dataset data/cartpole-dqn-expert.hdf5
    ;;
  full)
    NSEEDS=${SEEDS:-5}
    [ -f "$MEDIUM" ] || die "$MEDIUM is missing: make it with the command in docs/offline.md"
    seeds full dqn CartPole-v1 $DQN
    seeds full dqn Acrobot-v1 $DQN --env-id Acrobot-v1
    seeds full dqn MountainCar-v0 $DQN --env-id MountainCar-v0 --total-timesteps 500000 --eval-every 25000
    seeds full dqn LunarLander-v3 $DQN --env-id LunarLander-v3 --total-timesteps 500000 \
      --buffer-size 100000 --eval-every 25000
    seeds full sac Pendulum-v1 $SAC
    for env in HalfCheetah-v5 Hopper-v5 Walker2d-v5 Ant-v5; do
      seeds full sac $env $SAC --env-id $env "${MUJOCO[@]}"
    done
    seeds full bc pendulum-sac-expert $BC --dataset data/pendulum-sac-expert.hdf5
    seeds full bc cartpole-dqn-expert $BC --dataset data/cartpole-dqn-expert.hdf5
    seeds full bc halfcheetah-sac-medium $BC --dataset "$MEDIUM"
    ;;
  ablation)
    NSEEDS=${SEEDS:-5}
    seeds ablation dqn CartPole-v1 $DQN
    seeds ablation dqn-no-per CartPole-v1 $DQN --no-prioritized
    seeds ablation dqn-1step CartPole-v1 $DQN --n-step 1
    seeds ablation sac Pendulum-v1 $SAC
    seeds ablation sac-per Pendulum-v1 $SAC --prioritized
    seeds ablation sac HalfCheetah-v5 $SAC --env-id HalfCheetah-v5 "${MUJOCO[@]}"
    seeds ablation sac-per HalfCheetah-v5 $SAC --env-id HalfCheetah-v5 "${MUJOCO[@]}" --prioritized
    for d in pendulum-sac-expert cartpole-dqn-expert halfcheetah-sac-medium; do
      seeds ablation bc $d $BC --dataset data/$d.hdf5
      seeds ablation bc-per $d $BC --dataset data/$d.hdf5 --prioritized
    done
    ;;
  speed)
    # Each peer in its own venv: sbx pins its own jax; dqn_jax.py needs the gymnasium 0.29,
    # stable-baselines3 and torch it was written for.
    SBX_VENV=${SBX_VENV:-.venv-sbx} CLEANRL_VENV=${CLEANRL_VENV:-.venv-cleanrl}
    if [ ! -x "$SBX_VENV/bin/python" ]; then
      python3 -m venv "$SBX_VENV"
      "$SBX_VENV/bin/python" -m pip install --quiet "sbx-rl==0.28.0" "gymnasium[classic-control]>=1.1,<2" tensorboard
    fi
    if [ ! -f "$CLEANRL_VENV/dqn_jax.py" ]; then  # the file as the cleanrl 1.2.0 wheel ships it
      python3 -m venv "$CLEANRL_VENV"
      # torch from PyPI is a CUDA build of several GB; a CPU one where the index offers it
      "$CLEANRL_VENV/bin/python" -m pip install --quiet "torch==2.13.0" "jax[cpu]==0.10.2" "flax==0.12.8" \
        "optax==0.2.8" tensorboard "gymnasium[classic-control]==0.29.1" "stable-baselines3==2.3.2"
      "$CLEANRL_VENV/bin/python" -m pip download --quiet --no-deps --only-binary :all: --python-version 3.10 \
        "cleanrl==1.2.0" -d "$CLEANRL_VENV/wheel"
      "$CLEANRL_VENV/bin/python" -c 'import sys, zipfile; open(sys.argv[2], "wb").write(zipfile.ZipFile(sys.argv[1]).read("cleanrl/dqn_jax.py"))' \
        "$CLEANRL_VENV"/wheel/cleanrl-1.2.0-py3-none-any.whl "$CLEANRL_VENV/dqn_jax.py"
    fi
    "$PYTHON" benchmark/speed_vs_peers.py --sbx-python "$SBX_VENV/bin/python" --pairs "${SEEDS:-3}" --seeds 5 \
      --cleanrl-python "$CLEANRL_VENV/bin/python" --cleanrl-dqn "$CLEANRL_VENV/dqn_jax.py" --out "$RUNS/speed"
    mkdir -p "$OUT" && cp "$RUNS"/speed/speed_vs_peers.{md,json} "$OUT/"
    exit 0  # no seed runs to summarise
    ;;
  atari)
    NSEEDS=${SEEDS:-2} JOBS=1  # timings of parallel runs would measure the contention
    memory="$RUNS/atari/replay-memory.jsonl"
    if [ -n "$FORCE" ] || [ ! -s "$memory" ]; then
      mkdir -p "$RUNS/atari" && rm -f "$memory"
      for spec in "compressed 1000000" "compressed 100000" "naive 100000"; do
        echo "memory $spec"
        "$PYTHON" tests/replay_memory.py --layout "${spec% *}" --capacity "${spec#* }" >> "$memory"
      done
    fi
    seeds atari dqn-preset Pong-v5 $DQN --env-id ALE/Pong-v5 --preset atari --total-timesteps 30000 \
      --learning-starts 10000 --eval-every 30000 --eval-episodes 1 --checkpoint-every 0 --log-every 1000
    ;;
  atari10m)
    NSEEDS=${SEEDS:-1} JOBS=1  # an accelerator takes one process
    for game in Pong Breakout; do  # a run stopped by SIGTERM checkpoints, and resumes when the mode runs again
      seeds atari10m preset "$game-v5" $DQN --env-id "ALE/$game-v5" --preset atari --num-envs 32 \
        --total-timesteps 2500000 --eval-every 2500000 --checkpoint-every 0
    done
    ;;
  apex)
    NSEEDS=${SEEDS:-3} JOBS=1  # timings: one process tree at a time
    for actors in 1 2 4; do
      seeds apex "actors$actors-free" CartPole-v1 $APEX --num-actors "$actors" --train-frequency 0
    done
    seeds apex actors2-default CartPole-v1 $APEX --num-actors 2
    seeds apex dqn-prioritized CartPole-v1 $DQN
    ;;
  minatar)
    NSEEDS=${SEEDS:-2} JOBS=1  # an accelerator takes one process
    MINATAR=(--preset minatar --total-timesteps 1000000)
    for game in Breakout Asterix Freeway Seaquest SpaceInvaders; do  # Breakout first: 16 envs against 1
      seeds minatar preset "$game-v0" $DQN --env-id "MinAtar/$game-v0" "${MINATAR[@]}"
    done
    for game in Asterix Breakout; do
      seeds minatar paper "$game-v0" $DQN --env-id "MinAtar/$game-v0" "${MINATAR[@]}" --no-prioritized --n-step 1
    done
    NSEEDS=1 seeds minatar preset-5m Asterix-v0 $DQN --env-id MinAtar/Asterix-v0 "${MINATAR[@]}" \
      --total-timesteps 5000000
    ;;
esac
wait
"$PYTHON" benchmark/benchmark_summary.py --runs "$RUNS" --out "$OUT"
