source .whl-tpu/setup.sh || exit 1
git log --oneline -1 2>/dev/null; md5sum algos/dqn_prioritized.py
for part in atari minatar; do
  timeout 280 ./benchmark.sh accelerator $part --runs /tmp/bench --out /tmp/benchout > /tmp/bench-$part.log 2>&1; echo "$part rc $?"; tail -3 /tmp/bench-$part.log
done
cp /tmp/bench/accelerator.jsonl /tmp/benchout/accelerator.md /tmp/bench-*.log $OUT/ 2>/dev/null
cd /tmp/bench && tar czf $OUT/bench.tgz --exclude='checkpoint*' --exclude='model.npz' . ; ls $OUT
