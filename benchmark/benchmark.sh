#!/usr/bin/env bash
# Reproducible benchmarks: multi-seed runs, then results/summary.md and results/*.png.
#
#   ./benchmark/benchmark.sh [-j N] [--seeds N] [--force] [--runs DIR] [--out DIR] MODE
#
#   quick     minutes on a CPU: default flags of each script on its default task
#             (DQN CartPole-v1, SAC Pendulum-v1, BC on the Pendulum and CartPole datasets); 3 seeds
#   full      docs/benchmarks.md's table: DQN CartPole-v1, Acrobot-v1, MountainCar-v0, LunarLander-v3; SAC
#             Pendulum-v1 and HalfCheetah/Hopper/Walker2d/Ant-v5 (100k steps, only --env-id set); BC on the three shipped datasets
#             (expert Pendulum and CartPole, medium HalfCheetah); 5 seeds
#   ablation  same seeds: DQN CartPole-v1 PER on/off and 5-step vs 1-step; SAC Pendulum-v1 and
#             HalfCheetah-v5 PER off/on (and on HalfCheetah PER with cpprb's whole-buffer IS-weight
#             normalisation); BC on the three shipped datasets PER off/on; 5 seeds
#   speed     throughput at CleanRL's settings (DQN dqn_jax.py CartPole with 1 and 8 envs,
#             SAC sac_continuous_action.py Pendulum), SAC on HalfCheetah-v5 and Hopper-v5, and
#             BC's pipeline efficiency; runs one at a time whatever -j says; 3 repeats; where
#             DQN's time per env step goes and SAC's update against the CPU's matmul ceiling
#             (results/dqn_step_costs.json, results/sac_flops.json); then sbx and CleanRL's
#             dqn_jax.py side by side (own venvs, .venv-sbx and .venv-cleanrl, built once): same
#             settings as ratios with each side's last returns, and time to solve against sbx at
#             each one's best (results/speed_vs_peers.md)
#   atari     DQN on pixels: replay memory per transition (compressed at 1M and 100k, naive at
#             100k: 1M naive would need 56 GB), throughput of --preset atari on ALE/Pong-v5
#             (30k steps, 20k of them learning) and updates/s with the prefetch thread on vs
#             off (also on a GPU machine); one at a time; 2 repeats
#   minatar   DQN-PER (3-step) with --preset minatar (the MinAtar paper's DQN) on MinAtar
#             Breakout, SpaceInvaders and Freeway, 5M steps, and plain uniform 1-step DQN on
#             Breakout as the control; replay memory per transition for MinAtar's planes;
#             3 seeds. Hours per run on a CPU: an interrupted run resumes from its checkpoint
#   apex      Ape-X (algos/apex_dqn.py) on CartPole-v1 on a local Ray: env steps/s, learner
#             updates/s, the learner's wait fraction and the final eval with 1, 2 and 4 actors
#             (4 oversubscribes 2 cores) and the learner running free (the paper), the default
#             run (2 actors, replay ratio capped as dqn_prioritized.py's) beside
#             dqn_prioritized.py's default run; where the replay should live (in the learner or
#             a Ray actor) and what one actor and one update cost (benchmark/apex_*.py); one at a
#             time; 3 seeds
#   accelerator PART   on a machine with a GPU or TPU: each workload there and on its host CPU
#             (JAX_PLATFORMS=cpu), one run at a time, into results/accelerator.md; PART (each under
#             9 minutes) is one of dqn, minatar, sac, bc, cleanrl, sbx, atari, learning
#             (benchmark/accelerator.py says what each runs); on a CPU-only machine it says so
#   summary   only rebuild the summary from the runs already there
#
#   -j N       runs in parallel (default: the number of cores)
#   --seeds N  seeds 1..N instead of the mode's default
#   --force    rerun runs that already finished (by default a run with exit status 0 is kept,
#              so an interrupted `full` continues where it stopped, and a run stopped with a
#              checkpoint resumes from it)
#   --runs DIR where runs go (default runs/bench): DIR/<suite>/<config>/<task>/seed<N>{,.log,.exit}
#   --out DIR  where summary.md and the plots go (default results)
#
# PYTHON chooses the interpreter (default: .venv/bin/python if present, else python3).
set -euo pipefail
cd "$(dirname "$0")/.."  # the repository root: the paths below start there
PYTHON=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}

die() { echo "benchmark.sh: error: $*" >&2; exit 2; }
usage() { sed -n '2,/^# PYTHON/p' benchmark/benchmark.sh | sed 's/^# \{0,1\}//'; }  # after the cd
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
    -*) die "unknown option '$1' (see ./benchmark/benchmark.sh --help)" ;;
    *) if [ -z "$MODE" ]; then MODE=$1; elif [ "$MODE" = accelerator ] && [ -z "$PART" ]; then PART=$1
       else die "one mode at a time, got '$MODE' and '$1'"; fi; shift ;;
  esac
done
case "$MODE" in
  quick|full|ablation|speed|atari|minatar|apex|summary) ;;
  accelerator)
    PARTS="dqn minatar sac bc cleanrl sbx atari learning"
    [[ " $PARTS " == *" $PART "* ]] || die "accelerator needs one part of: $PARTS"
    if [ "$("$PYTHON" -c 'import jax; print(jax.default_backend())')" = cpu ]; then
      echo "benchmark.sh accelerator: JAX sees no accelerator here (only the CPU): nothing to measure"; exit 0
    fi
    exec "$PYTHON" benchmark/accelerator.py "$PART" "$RUNS" "$OUT" ;;
  "") usage >&2; die "no mode given: quick, full, ablation, speed, atari, minatar, apex, accelerator or summary" ;;
  *) die "unknown mode '$MODE': quick, full, ablation, speed, atari, minatar, apex, accelerator or summary" ;;
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
    # Stopped by a signal or killed (no exit status) after a checkpoint: continue it, with its
    # own flags (args.json), instead of starting again.
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
# seeds SUITE CONFIG TASK SCRIPT FLAGS...: one run per seed.
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
    seeds full sac HalfCheetah-v5 $SAC --env-id HalfCheetah-v5 "${MUJOCO[@]}"
    seeds full sac Hopper-v5 $SAC --env-id Hopper-v5 "${MUJOCO[@]}"
    seeds full sac Walker2d-v5 $SAC --env-id Walker2d-v5 "${MUJOCO[@]}"
    seeds full sac Ant-v5 $SAC --env-id Ant-v5 "${MUJOCO[@]}"
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
    seeds ablation sac-per-buffer HalfCheetah-v5 $SAC --env-id HalfCheetah-v5 "${MUJOCO[@]}" --prioritized \
      --per-weight-norm buffer
    for d in pendulum-sac-expert cartpole-dqn-expert halfcheetah-sac-medium; do
      seeds ablation bc $d $BC --dataset data/$d.hdf5
      seeds ablation bc-per $d $BC --dataset data/$d.hdf5 --prioritized
    done
    ;;
  speed)
    NSEEDS=${SEEDS:-3} JOBS=1  # timings of parallel runs would measure the contention
    # CleanRL counts its target period (500) in env steps; ours counts SGD steps: 500 / 10 = 50.
    cleanrl_dqn=(--total-timesteps 500000 --train-frequency 10 --batch-size 128 --buffer-size 10000
                 --learning-rate 2.5e-4 --target-network-frequency 50 --learning-starts 10000
                 --exploration-fraction 0.5 --end-e 0.05 --hidden-sizes 120 84 --no-anneal-lr
                 --eval-every 500000 --checkpoint-every 0)
    cleanrl_sac=(--total-timesteps 15000 --learning-starts 5000 --batch-size 256 --policy-frequency 2
                 --target-network-frequency 1 --tau 0.005 --policy-lr 3e-4 --q-lr 1e-3
                 --target-entropy-scale 1 --hidden-sizes 256 256 --eval-every 15000 --checkpoint-every 0)
    seeds speed dqn-cleanrl-envs1 CartPole-v1 $DQN "${cleanrl_dqn[@]}" --num-envs 1
    seeds speed dqn-cleanrl-envs8 CartPole-v1 $DQN "${cleanrl_dqn[@]}" --num-envs 8
    seeds speed sac-cleanrl Pendulum-v1 $SAC "${cleanrl_sac[@]}"
    # MuJoCo: the SAC defaults for 10k learning steps, long enough for the learning-phase rate.
    mujoco_speed=(--total-timesteps 15000 --learning-starts 5000 --eval-every 15000 --checkpoint-every 0)
    seeds speed sac HalfCheetah-v5 $SAC --env-id HalfCheetah-v5 "${mujoco_speed[@]}"
    seeds speed sac Hopper-v5 $SAC --env-id Hopper-v5 "${mujoco_speed[@]}"
    wait
    mkdir -p "$RUNS/speed"
    "$PYTHON" - "$RUNS/speed/bc-pipeline.json" "$NSEEDS" <<'PY'
# BC pipeline efficiency: SGD updates/s through the whole input path (cpprb sample, prefetch
# thread, device_put) over updates/s of the same jitted update on batches already on the device.
import collections, concurrent.futures, importlib.util, json, os, statistics, sys, time
import jax
spec = importlib.util.spec_from_file_location("bc_offline", "algos/bc_offline.py")
bc = importlib.util.module_from_spec(spec); sys.modules["bc_offline"] = bc; spec.loader.exec_module(bc)
jax.config.update("jax_cpu_enable_async_dispatch", False)
args = bc.Args(dataset=[bc.DEFAULT_DATASET])
ds, env_id, mode, out_dim, *_ = bc.load_training_data(args)
stats = bc.obs_stats(ds.observations, args.normalize_obs)
policy, optimizer = bc.Policy(out_dim, args.hidden_sizes, mode == "nll"), bc.make_optimizer(args)
params = policy.init(jax.random.PRNGKey(0), jax.numpy.zeros((1, ds.observations.shape[1])))
state = bc.TrainState(params, optimizer.init(params), jax.numpy.zeros((), jax.numpy.int32))
update = bc.make_update(policy, mode, optimizer, stats, bc.learner_shardings(args))
replay = bc.PrioritizedDataset(ds.observations, ds.actions, 0.0, args.per_eps)
K, B, CALLS = args.updates_per_call, args.batch_size, 100
def sample():
    return bc.sample_batches(replay, args, None)
def timed(get):
    global state
    start = time.perf_counter()
    for i in range(CALLS):
        state, metrics, losses = update(state, get(i)[0])
    jax.block_until_ready(losses)
    return CALLS * K / (time.perf_counter() - start)
resident = [sample() for _ in range(CALLS)]
timed(lambda i: resident[i])  # compile
ratios, ups_resident, ups_pipeline = [], [], []
for _ in range(int(sys.argv[2])):
    a = timed(lambda i: resident[i])
    with concurrent.futures.ThreadPoolExecutor(1) as sampler:  # as train() prefetches
        ahead = collections.deque(sampler.submit(sample) for _ in range(args.prefetch_size))
        def prefetched(i):
            ahead.append(sampler.submit(sample))
            return ahead.popleft().result()
        b = timed(prefetched)
    ups_resident.append(a); ups_pipeline.append(b); ratios.append(b / a)
result = {"dataset": os.path.relpath(bc.DEFAULT_DATASET), "updates_per_call": K, "batch_size": B,
          "updates_per_second_resident": statistics.median(ups_resident),
          "updates_per_second_pipeline": statistics.median(ups_pipeline),
          "efficiency": statistics.median(ratios), "ratios": ratios}
json.dump(result, open(sys.argv[1], "w"), indent=2)
print("BC pipeline efficiency %.3f (median of %s), updates/s %.0f through cpprb + prefetch vs %.0f device-resident"
      % (result["efficiency"], ", ".join("%.3f" % r for r in ratios), result["updates_per_second_pipeline"],
         result["updates_per_second_resident"]))
PY
    # Side by side with sbx and with CleanRL's dqn_jax.py, each in its own virtual environment (sbx
    # pins its own jax; dqn_jax.py needs the gymnasium 0.29, stable-baselines3 and torch it was written
    # for), one process at a time, alternating (benchmark/speed_vs_peers.py).
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
    "$PYTHON" benchmark/dqn_step_costs.py --out "$RUNS/speed/dqn-step-costs.json"
    "$PYTHON" benchmark/sac_flops.py --out "$RUNS/speed/sac-flops.json"
    "$PYTHON" benchmark/speed_vs_peers.py --sbx-python "$SBX_VENV/bin/python" --pairs "$NSEEDS" --seeds 5 \
      --cleanrl-python "$CLEANRL_VENV/bin/python" --cleanrl-dqn "$CLEANRL_VENV/dqn_jax.py" --out "$RUNS/speed/vs-peers"
    mkdir -p "$OUT" && cp "$RUNS"/speed/vs-peers/speed_vs_peers.{md,json} "$OUT/"
    cp "$RUNS/speed/dqn-step-costs.json" "$OUT/dqn_step_costs.json"
    cp "$RUNS/speed/sac-flops.json" "$OUT/sac_flops.json"
    cp "$RUNS/speed/bc-pipeline.json" "$OUT/bc_pipeline.json"
    ;;
  atari)
    NSEEDS=${SEEDS:-2} JOBS=1
    mkdir -p "$RUNS/atari"
    memory="$RUNS/atari/replay-memory.jsonl"
    if [ -n "$FORCE" ] || [ ! -s "$memory" ]; then
      rm -f "$memory"
      for spec in "compressed 1000000" "compressed 100000" "naive 100000"; do
        read -r layout capacity <<< "$spec"
        echo "memory $layout $capacity"
        "$PYTHON" tests/replay_memory.py --layout "$layout" --capacity "$capacity" >> "$memory"
      done
    fi
    seeds atari dqn-preset Pong-v5 $DQN --env-id ALE/Pong-v5 --preset atari --total-timesteps 30000 \
      --learning-starts 10000 --eval-every 30000 --eval-episodes 1 --checkpoint-every 0 --log-every 1000
    wait
    "$PYTHON" - "$RUNS/atari/prefetch.json" "$NSEEDS" <<'PY'
# Prefetch on vs off for DQN on pixels: SGD updates/s of --preset atari's jitted update (K x 32 per
# call) on a 50k-transition frame-store replay, batches from sample_batches on a prefetch thread
# kept --prefetch-size calls ahead (train()'s), or sampled and put on the device in the learner's
# own loop, side by side in one process; priorities written back by write_priorities on a writer
# thread in both, as train() does. Works unchanged on a GPU machine.
import collections, concurrent.futures, json, os, statistics, sys, time
sys.path.insert(0, "tests")
from replay_memory import filled_replay, load_script
dqn = load_script("dqn_prioritized")
import jax
jax.config.update("jax_cpu_enable_async_dispatch", False)  # as dqn_prioritized.train does
args = dqn.Args(**dqn.ATARI_PRESET)
K, B, CALLS = args.updates_per_call, args.batch_size, 10
replay = filled_replay("compressed", 50_000, 1000)
replay.beta = 0.4
shardings = dqn.learner_shardings(args)
network = dqn.QNetwork(6, args.hidden_sizes)
optimizer = dqn.make_optimizer(args, 10_000)
state = dqn.init_train_state(network, optimizer, (4, 84, 84), jax.random.PRNGKey(0))
state = jax.device_put(state, shardings.replicated)  # placed as train() places it
update = dqn.make_update(network.apply, optimizer, args, unroll=jax.default_backend() == "cpu")
sampler = concurrent.futures.ThreadPoolExecutor(1, "prefetch")
writer = concurrent.futures.ThreadPoolExecutor(1, "priority-writer")
def sample():
    return dqn.sample_batches(replay, args, shardings.batch)
def prefetched():
    """train()'s prefetch: top up to --prefetch-size calls in flight, take the oldest."""
    ahead = collections.deque()
    def get():
        while len(ahead) < args.prefetch_size:
            ahead.append(sampler.submit(sample))
        return ahead.popleft().result()
    return get, ahead
sgd_steps = 0
def timed(get, calls):
    global state, sgd_steps
    writes = []
    start = time.perf_counter()
    for _ in range(calls):
        batches, indexes, stamps = get()
        state, metrics, priorities = update(state, batches)
        writes.append(writer.submit(dqn.write_priorities, replay, args.prioritized, indexes, stamps, priorities, sgd_steps))
        sgd_steps += K
    for w in writes:
        w.result()  # all written back (and a divergence raised) before the clock stops
    return calls * K / (time.perf_counter() - start)
timed(sample, 1)  # compile
start = time.perf_counter()
for _ in range(CALLS):
    jax.block_until_ready(sample()[0])
sample_ms = (time.perf_counter() - start) / CALLS * 1000
off, on = [], []
for _ in range(int(sys.argv[2])):
    off.append(timed(sample, CALLS))
    get, ahead = prefetched()
    on.append(timed(get, CALLS))
    for left in ahead:
        left.result()  # the draws still in flight finish before the next timing
sampler.shutdown()
writer.shutdown()
result = {"backend": jax.default_backend(), "device": str(jax.devices()[0]), "updates_per_call": K,
          "batch_size": B, "sample_and_put_ms_per_call": sample_ms,
          "updates_per_second_prefetch_on": statistics.median(on),
          "updates_per_second_prefetch_off": statistics.median(off),
          "ratio_on_over_off": statistics.median(a / b for a, b in zip(on, off)), "on": on, "off": off}
json.dump(result, open(sys.argv[1], "w"), indent=2)
print("DQN pixels on %s: %.1f updates/s with prefetch, %.1f without (median ratio %.2f); sampling + device_put %.0f ms per %d x %d"
      % (result["device"], result["updates_per_second_prefetch_on"], result["updates_per_second_prefetch_off"],
         result["ratio_on_over_off"], sample_ms, K, B))
PY
    ;;
  minatar)
    NSEEDS=${SEEDS:-3}
    mkdir -p "$RUNS/minatar"
    memory="$RUNS/minatar/replay-memory.jsonl"
    if [ -n "$FORCE" ] || [ ! -s "$memory" ]; then
      rm -f "$memory"
      for channels in 4 10; do  # the fewest and the most of the five games (Breakout, Seaquest)
        "$PYTHON" tests/replay_memory.py --layout planes --channels "$channels" --capacity 100000 >> "$memory"
      done
    fi
    for game in Breakout SpaceInvaders Freeway; do
      seeds minatar dqn-per-3step "$game" $DQN --env-id "MinAtar/$game-v1" --preset minatar
    done
    seeds minatar dqn-uniform-1step Breakout $DQN --env-id MinAtar/Breakout-v1 --preset minatar \
      --no-prioritized --n-step 1
    ;;
  apex)
    NSEEDS=${SEEDS:-3} JOBS=1  # timings: one process tree at a time
    mkdir -p "$RUNS/apex"
    for tool in replay_placement costs; do
      side="$RUNS/apex/${tool//_/-}.json"
      if [ -n "$FORCE" ] || [ ! -s "$side" ]; then
        echo "measure $tool"
        "$PYTHON" "benchmark/apex_$tool.py" --out "$side"
      fi
    done
    for actors in 1 2 4; do
      seeds apex "actors$actors-free" CartPole-v1 $APEX --num-actors "$actors" --train-frequency 0
    done
    seeds apex actors2-default CartPole-v1 $APEX --num-actors 2
    seeds apex dqn-prioritized CartPole-v1 $DQN
    ;;
esac
wait
"$PYTHON" benchmark/benchmark_summary.py --runs "$RUNS" --out "$OUT"
