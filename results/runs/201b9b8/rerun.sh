# README rows re-run on 201b9b8 (this 2-core VM), two runs at a time (SAC, BC), Ape-X one at a time
cd /work/wt-rr || exit 1
PY=/work/main/.venv/bin/python; OUT=/tmp/rr; mkdir -p $OUT
run() { name=$1; shift; d=$OUT/$name; rm -rf $d; s=$(date +%s); $PY "$@" --run-dir $d > $d.log 2>&1; echo "$name exit $? $(( $(date +%s) - s )) s" >> $OUT/walls.txt; }
for s in 1 2 3 4 5; do
  run sac-pendulum-seed$s algos/sac.py --seed $s &
  run bc-pendulum-sac-expert-seed$s algos/bc_offline.py --dataset data/pendulum-sac-expert.hdf5 --seed $s
  run bc-cartpole-dqn-expert-seed$s algos/bc_offline.py --dataset data/cartpole-dqn-expert.hdf5 --seed $s
  run bc-halfcheetah-sac-medium-seed$s algos/bc_offline.py --dataset data/halfcheetah-sac-medium.hdf5 --seed $s
  wait
done
for s in 1 2 3 4 5; do run apex-cartpole-seed$s algos/apex_dqn.py --num-actors 2 --seed $s; done
echo done >> $OUT/walls.txt
