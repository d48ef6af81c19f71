source .whl-tpu/setup.sh || exit 1
rm -rf /tmp/ab; mkdir -p /tmp/ab
P="--env-id ALE/Pong-v5 --preset atari --total-timesteps 200000 --learning-starts 50000 --checkpoint-every 0 --seed 1"
for spec in main:16:algos/dqn_prioritized.py ahead:16:.whl-tpu/cand/dqn_act_ahead.py main:32:algos/dqn_prioritized.py ahead:32:.whl-tpu/cand/dqn_act_ahead.py; do
  IFS=: read -r name n file <<< "$spec"
  t0=$(date +%s.%N)
  timeout 150 python3 $file $P --num-envs $n --run-dir /tmp/ab/$name-$n > $OUT/$name-$n.log 2>&1
  echo "$name-$n rc=$? wall=$(echo "$(date +%s.%N) - $t0" | bc)" | tee -a $OUT/summary.txt
  mkdir -p $OUT/$name-$n; find /tmp/ab/$name-$n -maxdepth 1 -type f -size -20M \( -name 'events*' -o -name '*.csv' -o -name '*.json' \) -exec cp {} $OUT/$name-$n/ \;
done
grep -h "step" $OUT/*.log | tail -n 30
