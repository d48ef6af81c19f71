# $1 = flush interval; kills a --track run 20 s in; prints TB's and W&B's last charts/SPS step
D=/tmp/kab-$1-$2; rm -rf $D; mkdir -p $D; cd $D
sed "s/x_transaction_log_flush_interval=0.25)/x_transaction_log_flush_interval=$1)/" /work/main/algos/dqn_prioritized.py > dqn.py
export WANDB_MODE=offline WANDB_SILENT=true WANDB_DIR=$D/w WANDB_CONFIG_DIR=$D/wc WANDB_CACHE_DIR=$D/wca WANDB_DATA_DIR=$D/wd
/work/main/.venv/bin/python dqn.py --total-timesteps 1000000 --log-every 500 --checkpoint-every 0 --eval-every 1000000 --run-dir $D/run --track > out.txt 2>&1 &
P=$!; sleep 20; kill -9 $P; sleep 3
/work/main/.venv/bin/python - <<'PY'
exec(open('/tmp/wreader.py').read().split("import glob, sys")[0])
import glob, sys
rows = wandb_history(glob.glob('w/wandb/offline-run-*/run-run.wandb')[0])
sps=[r['global_step'] for r in rows if 'charts/SPS' in r]
from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
ev=[(e.step, e.wall_time) for p in glob.glob('run/events*') for e in EventFileLoader(p).Load() if any(v.tag=='charts/SPS' for v in e.summary.value)]
print("wandb last", sps[-1], "tb last", ev[-1][0], "missing ticks", len(ev)-len(sps), "rows", len(rows))
PY
