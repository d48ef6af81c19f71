"""Where each thread of a run spends its wall time, for the docs' "what binds" rows (py-spy cannot attach on
the lent TPU machine, so this samples from inside the process).

    python tools/thread_profile.py run STACKS algos/dqn_prioritized.py --env-id ALE/Pong-v5 --preset atari ...
    python tools/thread_profile.py summary STACKS [SCRIPT_NAME]

`run` executes the script as __main__ while a daemon thread records every other thread's stack each 5 ms;
at exit the folded stacks ("thread NAME;frame;...;frame COUNT") go to STACKS. `summary` drops the start
(any sample in imports, compiles or the TPU client; a run's random-action warm-up stays in) and tqdm's
monitor thread (STACKS may be gzipped), then prints for each
thread the share of its samples at each (deepest frame in SCRIPT_NAME -> leaf frame), most first.
"""

import atexit
import collections
import gzip
import os
import runpy
import sys
import threading
import time

START = ("importlib", "backend_compile", "make_tpu_client")  # a run's start, not its loop


def folded(frame) -> str:
    names = []
    while frame is not None:
        names.append(f"{frame.f_code.co_name} ({os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno})")
        frame = frame.f_back
    return ";".join(reversed(names))


def run(stacks: str, argv: list) -> None:
    counts = collections.Counter()

    def sample():
        me = threading.get_ident()
        while True:
            time.sleep(0.005)
            names = {t.ident: t.name for t in threading.enumerate()}
            for ident, frame in sys._current_frames().items():
                if ident != me:
                    counts[f"thread {names.get(ident, ident)};{folded(frame)}"] += 1

    def dump():
        with open(stacks, "w") as f:
            f.writelines(f"{stack} {n}\n" for stack, n in list(counts.items()))

    atexit.register(dump)
    threading.Thread(target=sample, daemon=True, name="sampler").start()
    sys.argv = argv
    runpy.run_path(argv[0], run_name="__main__")


def summary(stacks: str, script: str = "dqn_prioritized.py", top: int = 8) -> str:
    by_thread = collections.defaultdict(collections.Counter)
    for line in (gzip.open if stacks.endswith(".gz") else open)(stacks, "rt"):
        stack, _, n = line.rstrip().rpartition(" ")
        frames = stack.split(";")
        if any(s in stack for s in START) or "tqdm" in frames[0]:
            continue
        ours = [f for f in frames[1:] if f"({script}:" in f]
        by_thread[frames[0]][f"{ours[-1] if ours else '-'} -> {frames[-1]}"] += int(n)
    lines = []
    for thread, where in sorted(by_thread.items(), key=lambda kv: -sum(kv[1].values())):
        total = sum(where.values())
        lines.append(f"{thread}: {total} samples")
        lines += [f"  {n / total:6.1%}  {place}" for place, n in where.most_common(top)]
    return "\n".join(lines)


if __name__ == "__main__":
    if len(sys.argv) >= 4 and sys.argv[1] == "run":
        run(sys.argv[2], sys.argv[3:])
    elif len(sys.argv) in (3, 4) and sys.argv[1] == "summary":
        print(summary(*sys.argv[2:]))
    else:
        sys.exit(__doc__)
