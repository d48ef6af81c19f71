source .whl-tpu/setup.sh || exit 1
cd /tmp/ab && tar czf $OUT/ab-events.tgz $(find . -maxdepth 2 -type f \( -name 'events*' -o -name '*.csv' -o -name '*.json' \) -size -20M) && cd - >/dev/null
python3 - <<'PY'
import glob, statistics
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
for d in sorted(glob.glob("/tmp/ab/*")):
    ea = EventAccumulator(d, size_guidance={"scalars": 0}); ea.Reload()
    sps = [e.value for e in ea.Scalars("charts/SPS") if 100_000 < e.step <= 200_000]
    ups = [e.value for e in ea.Scalars("perf/updates_per_second") if 100_000 < e.step <= 200_000]
    wf = [e.value for e in ea.Scalars("perf/learner_wait_fraction") if 100_000 < e.step <= 200_000]
    print(d, "median SPS %.0f (n=%d) updates/s %.0f wait %.2f" % (statistics.median(sps), len(sps), statistics.median(ups), statistics.median(wf)))
PY
mkdir -p /tmp/ck; timeout 420 python3 .whl-tpu/ckpt_time.py 1000000 /dev/shm /tmp/ck 2>&1 | tail -5; free -g | head -2; df -h /tmp /dev/shm | tail -2
