"""Shared test helpers: load an algos/ script as a module without running it."""

import importlib.util
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_script(name: str):
    """Import algos/<name>.py under the module name `name` (registered, as dataclasses need)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "algos", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def load_tool(name: str):
    """Import tools/<name>.py (the script it imports is the one load_script registered)."""
    if os.path.join(ROOT, "tools") not in sys.path:  # the tools import each other
        sys.path.insert(0, os.path.join(ROOT, "tools"))
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "tools", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def import_in_fresh_process(name: str):
    """Import algos/<name>.py in a new interpreter and report whether that had side effects:
    files created in the working folder, a jax backend initialised, jax config changed."""
    import subprocess

    code = (
        "import sys, os; sys.path.insert(0, %r); from helpers import load_script; "
        "before = set(os.listdir('.')); load_script(%r); "
        "import jax; from jax._src import xla_bridge; assert not xla_bridge._backends, 'jax initialised'; "
        "assert jax.config.read('jax_cpu_enable_async_dispatch'), 'jax config changed'; "
        "assert set(os.listdir('.')) == before, 'files created'; print('clean')"
    ) % (os.path.join(ROOT, "tests"), name)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
