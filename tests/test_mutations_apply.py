"""tests/mutate.py's list stays runnable: every mutation still applies to the code it names, and
every test it names exists.

Code moves under a mutation's exact string (two mutations no longer applied, so `make mutate` reported
them and nothing else did), and tests get renamed or merged: pytest given a node id that names no
test exits non-zero, which mutate.py would count as a kill.
"""

import ast
import pathlib
import re

import pytest

from tests import mutate

ROOT = pathlib.Path(mutate.ROOT)


def _functions(path: pathlib.Path) -> set[str]:
    return {node.name for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.FunctionDef)}


def test_every_mutation_has_its_own_name_and_applies_exactly_once():
    names = [m.name for m in mutate.MUTATIONS]
    assert len(names) == len(set(names)), sorted({n for n in names if names.count(n) > 1})
    stale = [m.name for m in mutate.MUTATIONS if (ROOT / m.path).read_text().count(m.old) != 1]
    assert not stale, f"no longer apply (the code moved under their exact string): {stale}"
    assert all(m.old != m.new for m in mutate.MUTATIONS)


@pytest.mark.parametrize("target", sorted({t for m in mutate.MUTATIONS for t in m.tests}))
def test_every_test_a_mutation_names_exists(target):
    file, _, node = target.partition("::")
    path = ROOT / file
    assert path.is_file(), target
    if node:
        function = re.sub(r"\[.*\]$", "", node.split("::")[-1])
        assert function in _functions(path), f"{target}: no such test (renamed or merged?)"
