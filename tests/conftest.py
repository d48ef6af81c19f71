import contextlib
import fcntl
import os
import sys
import tempfile

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# The tests read videos back with imageio, whose ffmpeg reader would start ffmpeg with a preexec_fn: a
# fork that runs Python in the child, in a process where JAX's threads run. imageio-ffmpeg's own switch
# (its issue 58) starts it without one, so the fork is followed by the exec at once.
os.environ.setdefault("IMAGEIO_FFMPEG_NO_PREVENT_SIGINT", "1")


@pytest.fixture(autouse=True)
def ray_tests_run_alone(request):
    """Under pytest-xdist's two workers (pytest.ini) a test marked ray (it starts a local Ray) runs with
    no other test beside it: a local Ray node must register within 30 s (ray/_private/node.py), which
    a 2-core machine busy with another test's jax run missed. The Ray test holds a turnstile while
    it waits for the others' shared lock, so that the other worker cannot keep it out."""
    worker = getattr(request.config, "workerinput", None)
    if worker is None:  # one process: nothing runs beside a test
        yield
        return
    base = os.path.join(tempfile.gettempdir(), f"pytest-ray-alone-{worker['testrunuid']}")
    alone = request.node.get_closest_marker("ray") is not None
    with open(base + ".turn", "a") as turn, open(base + ".lock", "a") as lock:
        fcntl.flock(turn, fcntl.LOCK_EX)
        fcntl.flock(lock, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        if not alone:
            fcntl.flock(turn, fcntl.LOCK_UN)
        try:
            yield
        finally:
            with contextlib.suppress(OSError):
                fcntl.flock(lock, fcntl.LOCK_UN)
