cd /work/main
for s in 1 2 3 4 5; do for v in old new; do
  d=/tmp/cp/$v-$s; rm -rf $d
  /usr/bin/time -f "wall %e" taskset -c 0 .venv/bin/python /tmp/${v}_dqn.py --seed $s --run-dir $d > $d.log 2>&1
  echo "$v $s $(grep -h 'final\|^wall' $d.log | tr '\n' ' ')"
done; done
