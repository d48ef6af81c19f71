"""Where two scripts do the same job, they hold the same text (issue 58): each region between
`# >>> shared: NAME` and `# <<< shared: NAME` is compared, line for line, across algos/."""

import difflib
import os
import re

from helpers import ROOT

SCRIPTS = ("dqn_prioritized", "sac", "bc_offline", "apex_dqn")
HOLDERS = {
    "files": set(SCRIPTS),
    "tracking": set(SCRIPTS),
    "harness": {"dqn_prioritized", "sac", "apex_dqn"},
    "acting": set(SCRIPTS),
    "signals": set(SCRIPTS),
}  # which scripts hold each region
MARKER = re.compile(r"^# (>>>|<<<) shared: (\w+)")


def regions(name: str) -> dict:
    """{region: its lines} of algos/<name>.py; a marker out of place fails the test that reads it."""
    with open(os.path.join(ROOT, "algos", f"{name}.py")) as f:
        lines = f.read().splitlines()
    found, open_at = {}, None
    for number, line in enumerate(lines):
        match = MARKER.match(line)
        if not match:
            continue
        arrow, region = match.groups()
        if arrow == ">>>":
            assert open_at is None and region not in found, f"{name}.py:{number + 1}: region {region} opened twice"
            open_at = (region, number)
        else:
            assert open_at and open_at[0] == region, f"{name}.py:{number + 1}: region {region} closed, not open"
            found[region], open_at = lines[open_at[1] + 1 : number], None
    assert open_at is None, f"{name}.py: region {open_at[0]} never closed"
    return found


def test_each_shared_region_is_held_by_the_scripts_that_do_its_job():
    held = {}
    for script in SCRIPTS:
        for region in regions(script):
            held.setdefault(region, set()).add(script)
    assert held == HOLDERS


def test_each_shared_region_has_the_same_text_in_every_script_that_holds_it():
    for region, holders in HOLDERS.items():
        first, *others = sorted(holders)
        for other in others:
            a, b = regions(first)[region], regions(other)[region]
            diff = "\n".join(difflib.unified_diff(a, b, f"{first}.py", f"{other}.py", lineterm="", n=1))
            assert a == b, f"region {region} differs:\n{diff}"
