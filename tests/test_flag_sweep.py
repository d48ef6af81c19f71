"""Every flag value its type accepts starts a run or is refused in one line: each flag of the four
scripts at its extremes (its bounds and one past them, 0, 1, -1, the type's largest, inf and nan,
sizes no memory holds, paths that are files or cannot be written), one flag at a time on the
defaults, through the script's own cli() in this process. "Starts" is the first env step (DQN,
SAC), the first draw of a batch (BC) or the creation of the Ray actors (Ape-X, with Ray
itself not started): the sweep stops the run there. A refusal is exit 2 with one line and no run folder."""

import dataclasses
import signal
import typing

import annotated_types
import gymnasium as gym
import jax
import pytest
from helpers import load_script

BIG = str(2**63 - 1)


class Started(Exception):
    """Raised where a run would take its first step."""


class Hang(BaseException):
    """Raised by the alarm: a BaseException, which no handler of the scripts catches."""


def bounds(meta, integer: bool) -> typing.Tuple[float, float]:
    """The lowest and highest values the field's constraints let through (for floats, > and < bounds
    themselves, which the sweep expects refused)."""
    low, high, step = -float("inf"), float("inf"), 1 if integer else 0
    for m in meta:
        if isinstance(m, annotated_types.Ge):
            low = m.ge
        elif isinstance(m, annotated_types.Gt):
            low = m.gt + step
        elif isinstance(m, annotated_types.Le):
            high = m.le
        elif isinstance(m, annotated_types.Lt):
            high = m.lt - step
    return low, high


def values(name: str, hint, tmp) -> typing.List[typing.List[str]]:
    """The argument lists to try for one field, from its declared type."""
    flag = "--" + name.replace("_", "-")
    if typing.get_origin(hint) is typing.Union:  # Optional[X]
        hint = next(a for a in typing.get_args(hint) if a is not type(None))
    meta = []
    if typing.get_origin(hint) is typing.Annotated:
        hint, *extra = typing.get_args(hint)
        meta = [m for e in extra for m in getattr(e, "metadata", [e])]
    if hint is bool:
        return [[flag], ["--no-" + flag[2:]]]
    if typing.get_origin(hint) is typing.Literal:
        return [[flag, str(v)] for v in typing.get_args(hint)]
    if hint is int:
        low, high = bounds(meta, integer=True)
        ends = [v for v in (low, low - 1, high, high + 1) if abs(v) < float("inf")]
        return [[flag, str(int(v))] for v in sorted({0, 1, -1, *ends})] + [[flag, BIG]]
    if hint is float:
        low, high = bounds(meta, integer=False)
        ends = [v for v in (low, high) if abs(v) < float("inf")]
        return [[flag, str(v)] for v in sorted({0.0, -1.0, 5e-324, 1e308, *ends})] + [[flag, "inf"], [flag, "nan"]]
    if typing.get_origin(hint) in (tuple, typing.Tuple):  # hidden sizes
        return [[flag, "1"], [flag, "65536", "65536"], [flag, *["1"] * 16], [flag, *["1"] * 17]]
    a_file = str(tmp / "a_file")
    paths = [[flag, a_file], [flag, "/proc/no/such/place"], [flag, ""]]
    if name == "env_id":
        return [[flag, "NoSuchEnv-v0"], [flag, ""], [flag, "Pendulum-v1"], [flag, "CartPole-v1"]]
    if name == "ray_address":
        return [[flag, ""]]
    return paths  # run_dir, resume, dataset


SCRIPTS = {
    "dqn_prioritized": "gym",
    "sac": "gym",
    "bc_offline": "sample",
    "apex_dqn": "ray",
}


def cases(name, half, tmp):
    mod = load_script(name)
    hints = typing.get_type_hints(mod.Args, include_extras=True)
    for i, field in enumerate(dataclasses.fields(mod.Args)):
        # Optional packages (--track would also reach W&B where someone is logged in): their own tests.
        if field.name in ("capture_video", "track") or i % 2 != half:
            continue
        yield from ((field.name, argv) for argv in values(field.name, hints[field.name], tmp))


@pytest.mark.parametrize("half", [0, 1], ids=["even-fields", "odd-fields"])  # two workers share the cases
@pytest.mark.parametrize("name", list(SCRIPTS))
def test_every_flag_at_its_extremes_starts_or_is_refused_in_one_line(name, half, tmp_path, capsys, monkeypatch):
    mod = load_script(name)
    (tmp_path / "a_file").write_text("not a run folder")

    def started(*args, **kwargs):
        raise Started

    where = SCRIPTS[name]
    if where == "gym":
        monkeypatch.setattr(gym.vector.SyncVectorEnv, "step", started)
    elif where == "sample":
        monkeypatch.setattr(mod.PrioritizedDataset, "sample", started)
    else:
        monkeypatch.setattr(mod, "start_ray", lambda args: False)
        monkeypatch.setattr(mod, "remote_actor_class", started)
    monkeypatch.chdir(tmp_path)  # a run folder a case makes by default lands here, not in the repository

    def alarm(*_):
        raise Hang

    previous = signal.signal(signal.SIGALRM, alarm)
    # The set-up compiles the same small programs case after case: XLA's disk cache keeps them.
    jax.config.update("jax_compilation_cache_dir", str(tmp_path / "xla"))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    bad, count = [], 0
    try:
        for i, (field, argv) in enumerate(cases(name, half, tmp_path)):
            count += 1
            run_dir = tmp_path / f"run{i}"
            extra = [] if field in ("run_dir", "resume") else ["--run-dir", str(run_dir)]
            signal.alarm(60)
            try:
                rc = mod.cli(argv + extra)
                outcome = f"exit {rc}"
            except Started:
                outcome = "started"
            except Hang:
                outcome = "hang"
            except SystemExit as e:  # tyro's own refusal of a value its parser cannot read
                outcome = f"tyro exit {e.code}"
            except BaseException as e:  # a traceback: what the sweep looks for
                outcome = f"traceback {type(e).__name__}: {str(e)[:200]}"
            finally:
                signal.alarm(0)
            err = capsys.readouterr().err
            lines = [line for line in err.splitlines() if line.strip() and "warn" not in line.lower()]
            if outcome == "started":
                continue
            one_line = outcome in ("exit 2", "tyro exit 2") and "Traceback" not in err
            one_line = one_line and (outcome == "tyro exit 2" or len(lines) == 1)
            if not one_line or (outcome == "exit 2" and run_dir.exists()):
                bad.append(f"{' '.join(argv)}: {outcome}; {' | '.join(lines[-3:])[:300]}")
    finally:
        signal.signal(signal.SIGALRM, previous)
        jax.config.update("jax_compilation_cache_dir", None)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)
    print(f"{name}: {count} cases")
    assert not bad, f"{len(bad)} of {count} cases:\n" + "\n".join(bad)


@pytest.mark.parametrize("name", ["dqn_prioritized", "apex_dqn"])
def test_preset_as_the_last_word_is_refused_by_the_parser(name):
    """--preset with no value after it: tyro's refusal (exit 2), not an IndexError from the preset look-ahead."""
    with pytest.raises(SystemExit) as e:
        load_script(name).parse_args(["--preset"])
    assert e.value.code == 2
