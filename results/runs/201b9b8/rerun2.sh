# BC cartpole and halfcheetah with seeds 1-5 (the first script's run() overwrote the loop's $s)
cd /work/wt-rr || exit 1
PY=/work/main/.venv/bin/python; OUT=/tmp/rr
run() { local name=$1 t0; shift; local d=$OUT/$name; rm -rf $d; t0=$(date +%s); $PY "$@" --run-dir $d > $d.log 2>&1; echo "$name exit $? $(( $(date +%s) - t0 )) s" >> $OUT/walls2.txt; }
for seed in 1 2 3 4 5; do
  run bc-cartpole-dqn-expert-seed$seed algos/bc_offline.py --dataset data/cartpole-dqn-expert.hdf5 --seed $seed
  run bc-halfcheetah-sac-medium-seed$seed algos/bc_offline.py --dataset data/halfcheetah-sac-medium.hdf5 --seed $seed
done
echo done >> $OUT/walls2.txt
