"""Every module or attribute the prose names exists: docstrings, comments, the docs and setup.py.

Modules get renamed and moved (the persistent recurrence moved from the rnn package to kernels); the
text around them kept the old names, and nothing failed. This test reads the prose (docstrings and comments of every
.py file, the Markdown docs, setup.py's comments, the Makefile) and resolves:
  - `ds2_jax.<module>.<attribute>`: the longest importable module prefix, then attributes;
  - `<subpackage>.<module>` for rnn, kernels, data, datasets and tools (named without `ds2_jax.`);
  - `<name>.py` and `<folder>/<name>.py`: a file of that name in the repository (paths into other
    packages, whose first folder is not one of the repository's, are left alone).
"""

import ast
import functools
import importlib
import importlib.util
import io
import os
import pathlib
import re
import tokenize

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
FULL_NAME = re.compile(r"\bds2_jax(?:\.[A-Za-z_]\w*)+")
SUBPACKAGES = ("rnn", "kernels", "pipeline", "datasets", "tools")
SHORT_NAME = re.compile(rf"(?<![\w./-])(?:{'|'.join(SUBPACKAGES)})(?:\.[A-Za-z_]\w*)+")
FILE_NAME = re.compile(r"(?<![\w.-])([\w/]*\w)\.py\b")
# Prose that reads like a module path but is not one: `data` is the DataSettings argument there.
NOT_MODULES = {"data.dataset.name"}
NOT_FILES = {
    "file.py",  # the `file.py:N]` of a log line's format (test_progress)
    "configs/smok.py",  # the typo in an example of cli's did-you-mean message
}
PLACEHOLDER = re.compile(r"^[A-Z]$")  # `python -m ds2_jax.X`


def prose_files() -> list[pathlib.Path]:
    """The files whose text names modules: code (its prose only), docs, setup.py, the Makefile."""
    code = [
        p
        for pattern in ("ds2_jax/**/*.py", "tests/*.py", "benchmarks/*.py", "configs/*.py", "*.py")
        for p in ROOT.glob(pattern)
    ]
    docs = [ROOT / name for name in ("README.md", "BUILD_NOTES.md", "benchmarks/README.md", "Makefile")]
    return sorted(code) + [p for p in docs if p.exists()] + sorted(ROOT.glob("*.md")) + sorted(ROOT.glob("docs/*.md"))


def prose(path: pathlib.Path) -> str:
    """A .py file's comments and docstrings; any other file's whole text."""
    text = path.read_text()
    if path.suffix != ".py":
        return text
    parts = [t.string for t in tokenize.generate_tokens(io.StringIO(text).readline) if t.type == tokenize.COMMENT]
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            parts.append(ast.get_docstring(node) or "")
    return "\n".join(parts)


def resolves(dotted: str) -> bool:
    """Whether a dotted ds2_jax name is a module, or attributes of its longest module prefix."""
    parts = dotted.split(".")
    if PLACEHOLDER.match(parts[-1]):
        parts = parts[:-1]
    for cut in range(len(parts), 0, -1):
        try:
            if importlib.util.find_spec(".".join(parts[:cut])) is None:
                continue
        except ModuleNotFoundError:
            continue
        if cut == len(parts):
            return True  # a module: found without importing it (some define absl flags at import)
        obj = importlib.import_module(".".join(parts[:cut]))
        for attr in parts[cut:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


@functools.cache
def repository_files() -> frozenset[str]:
    """Every .py file's name and its path from the root, outside hidden folders (.venv) and results."""
    names = set()
    for folder, subfolders, files in os.walk(ROOT):
        subfolders[:] = [d for d in subfolders if not d.startswith(".") and d != "results"]
        for name in files:
            if name.endswith(".py"):
                names |= {name, os.path.relpath(os.path.join(folder, name), ROOT)}
    return frozenset(names)


def is_checked_file(name: str) -> bool:
    """A bare name, or a path whose first folder is one of the repository's own."""
    first, slash, _ = name.partition("/")
    return name not in NOT_FILES and (not slash or (ROOT / first).is_dir())


def unresolved_names(path: pathlib.Path, files: frozenset[str]) -> list[str]:
    """The names in one file's prose that resolve to nothing."""
    text = prose(path)
    dotted = set(FULL_NAME.findall(text)) | {f"ds2_jax.{m}" for m in SHORT_NAME.findall(text) if m not in NOT_MODULES}
    bad = sorted(name for name in dotted if not resolves(name))
    named_files = {f"{m}.py" for m in FILE_NAME.findall(text) if is_checked_file(f"{m}.py")}
    return bad + sorted(f for f in named_files if f not in files and f.split("/")[-1] not in files)


@pytest.mark.parametrize("path", prose_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_module_the_prose_names_exists(path):
    assert unresolved_names(path, repository_files()) == []


def test_a_stale_name_is_caught(tmp_path):
    stale = tmp_path / "stale.py"
    stale.write_text(
        '"""Shares code with rnn.persistent and ds2_jax.ctc_kernel; see ctc_kernel.py."""\n'
        "# ds2_jax.settings.no_such_field, kernels.mosaic_rnn is fine\n"
    )
    assert unresolved_names(stale, repository_files()) == [
        "ds2_jax.ctc_kernel",
        "ds2_jax.rnn.persistent",
        "ds2_jax.settings.no_such_field",
        "ctc_kernel.py",
    ]
