"""The package's imports flow one way: no module imports one that imports it back."""

import ast
import os
import subprocess
import sys

PACKAGE = "ds2_jax"
ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), PACKAGE)


def module_imports() -> dict[str, set[str]]:
    """ds2_jax module -> the ds2_jax modules it imports anywhere (top level or inside functions)."""
    modules = {}
    for folder, _, files in os.walk(ROOT):
        for name in files:
            if name.endswith(".py"):
                rel = os.path.relpath(os.path.join(folder, name), os.path.dirname(ROOT))
                modules[rel[:-3].replace(os.sep, ".").removesuffix(".__init__")] = os.path.join(folder, name)
    graph = {}
    for mod, path in modules.items():
        with open(path) as f:
            tree = ast.parse(f.read())
        graph[mod] = {d for d in imported_names(tree) if d in modules and d != mod}
    return graph


def imported_names(tree: ast.Module) -> set[str]:
    """Every absolute module name a tree imports, and module.name for each `from module import name`."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
    return names


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as [a, b, ..., a], or None."""
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done
    path: list[str] = []

    def visit(node):
        state[node] = 1
        path.append(node)
        for dep in sorted(graph[node]):
            if state.get(dep) == 1:
                return path[path.index(dep) :] + [dep]
            if dep not in state and (cycle := visit(dep)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_cycle_finder_finds_a_planted_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_the_package_has_no_import_cycle():
    graph = module_imports()
    assert "ds2_jax.train" in graph and "ds2_jax.model" in graph["ds2_jax.train"]  # the walk sees imports
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph))


def test_library_never_imports_benchmarks_torch_or_tensorflow():
    for path in (os.path.join(d, f) for d, _, fs in os.walk(ROOT) for f in fs if f.endswith(".py")):
        with open(path) as f:
            tree = ast.parse(f.read())
        names = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        names |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        assert not names & {"benchmarks", "torch", "tensorflow"}, (path, names & {"benchmarks", "torch", "tensorflow"})


def test_the_kernels_live_in_one_package_and_the_reference_imports_none():
    """ds2_jax.kernels holds every Pallas kernel; rnn.reference ('scan', 'scan_vjp') stands alone
    (the gate math aside); only the layer entry point, the CTC entry point and the dispatch see them."""
    graph = module_imports()
    assert "ds2_jax.kernels.dispatch" in graph["ds2_jax.rnn.recurrence"]  # the walk sees the subpackage
    package = ROOT
    pallas = {
        os.path.relpath(os.path.join(d, f), package)
        for d, _, fs in os.walk(package)
        for f in fs
        if f.endswith(".py") and "jax.experimental.pallas" in open(os.path.join(d, f)).read()
    }
    assert pallas and all(p.startswith("kernels" + os.sep) for p in pallas), pallas
    kernels = {
        "ds2_jax.kernels.triton_rnn",
        "ds2_jax.kernels.mosaic_rnn",
        "ds2_jax.kernels.common",
        "ds2_jax.kernels.ctc",
    }
    assert not graph["ds2_jax.rnn.reference"] & kernels, graph["ds2_jax.rnn.reference"]
    assert not graph["ds2_jax.kernels.gates"] & kernels, graph["ds2_jax.kernels.gates"]
    seeing = {m for m, imports in graph.items() if imports & kernels and not m.startswith("ds2_jax.kernels.")}
    assert seeing <= {"ds2_jax.rnn.recurrence", "ds2_jax.ctc"}, seeing


def test_settings_imports_no_jax_and_names_what_the_code_implements():
    """Grain workers unpickle Settings: building them must not import jax. The names of the
    implementations live in settings, and each registry implements exactly those."""
    code = (
        "import sys; from ds2_jax import settings; s = settings.from_config_dict(settings.to_config_dict()); "
        "print(sorted(m for m in sys.modules if m == 'jax' or m.startswith('jax.')))"
    )
    repo = os.path.dirname(ROOT)
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=repo,
        capture_output=True,
        text=True,
        check=True,
        env=dict(os.environ, PYTHONPATH=repo),
    ).stdout.strip()
    assert out == "[]", out
    from ds2_jax import ctc, settings
    from ds2_jax.rnn import recurrence, reference

    assert set(reference.CELLS) == set(settings.RNN_CELLS)
    assert set(recurrence.IMPLS) | {"auto"} == set(settings.RNN_IMPLS)
    assert set(ctc._IMPLS) | {"auto"} == set(settings.CTC_IMPLS)
    assert set(settings.KERNEL_CELLS) <= set(settings.RNN_CELLS)


def _defines_flags_at_import(tree: ast.Module) -> bool:
    """A top-level statement calls flags.DEFINE_*, config_flags.DEFINE_* (absl) or cli.define_config_file."""
    for node in tree.body:
        for call in (n for n in ast.walk(node) if isinstance(n, ast.Call)):
            if isinstance(call.func, ast.Attribute) and (
                call.func.attr.startswith("DEFINE") or call.func.attr == "define_config_file"
            ):
                if not isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                    return True
    return False


def test_no_test_imports_a_module_that_defines_flags():
    """absl flags are global: two imported modules defining --out fail the whole pytest run
    (DuplicateFlagError at collection). Commands that tests import define theirs in
    define_flags(), called only when run; the rest are run as subprocesses."""
    repo = os.path.dirname(ROOT)
    with_flags = set()
    for top in (PACKAGE, "benchmarks"):
        for folder, _, files in os.walk(os.path.join(repo, top)):
            for name in (f for f in files if f.endswith(".py")):
                path = os.path.join(folder, name)
                with open(path) as f:
                    if _defines_flags_at_import(ast.parse(f.read())):
                        with_flags.add(os.path.relpath(path, repo)[:-3].replace(os.sep, "."))
    assert "ds2_jax.demo" in with_flags and "benchmarks.scaling" in with_flags  # the scan sees flags
    assert not _defines_flags_at_import(ast.parse("def define_flags():\n    flags.DEFINE_string('out', None, '')\n"))
    tests = os.path.join(repo, "tests")
    for name in sorted(f for f in os.listdir(tests) if f.endswith(".py")):
        with open(os.path.join(tests, name)) as f:
            clash = imported_names(ast.parse(f.read())) & with_flags
        assert not clash, f"tests/{name} imports {sorted(clash)}, which define absl flags at import"


# The modules the data side may import: host code that imports no jax (ds2_jax.datasets is
# the tfds builder, imported by pipeline.tfds_source only when it builds or checks a dataset;
# "ds2_jax" is the package itself, whose __init__ is empty).
DATA_MAY_IMPORT = {
    "ds2_jax",
    "ds2_jax.settings",
    "ds2_jax.geometry",
    "ds2_jax.text",
    "ds2_jax.errors",
    "ds2_jax.faults",
    "ds2_jax.files",
    "ds2_jax.workers",
}  # files: the atomic writes of the index and statistics caches (no jax); workers: they end with their parent


def reached(graph: dict[str, set[str]], start: str) -> set[str]:
    """Every module `start` imports, directly or through the modules it imports."""
    seen: set[str] = set()
    todo = [start]
    while todo:
        for dep in graph[todo.pop()] - seen:
            seen.add(dep)
            todo.append(dep)
    return seen


def reached_outside(graph: dict[str, set[str]], package: str, allowed: set[str]) -> dict[str, set[str]]:
    """module of `package` -> the modules outside `package` and `allowed` it reaches (none: {})."""
    out = {}
    for mod in (m for m in graph if m == package or m.startswith(package + ".")):
        far = {d for d in reached(graph, mod) if not d.startswith(package + ".") and d != package} - allowed
        if far:
            out[mod] = far
    return out


# What the dataset builders (ds2_jax.datasets: tfds builders and the ds2-build command) may reach:
# the host modules the data side shares, the workdir layout, the one audio loader (ds2_jax.audio), and the
# command line's shared handling (cli, and the resilience it reports through). Never the input
# pipeline, the model or training, which build on them.
DATASETS_MAY_REACH = DATA_MAY_IMPORT | {"ds2_jax.cli", "ds2_jax.resilience", "ds2_jax.layout", "ds2_jax.audio"}


def test_the_import_direction_finder_finds_a_planted_upward_import():
    graph = {"p.a": {"p.b"}, "p.b": {"q"}, "q": {"r"}, "r": set(), "ok": set()}
    assert reached_outside(graph, "p", {"ok"}) == {"p.a": {"q", "r"}, "p.b": {"q", "r"}}
    assert reached_outside(graph, "p", {"q", "r"}) == {}


def test_the_dataset_builders_never_reach_up_into_pipeline_model_or_training():
    """datasets -> (settings, text, files, ...) only: the pipeline opens datasets, never the reverse,
    so the builders and ds2-build import none of pipeline, train, model, state, ... even indirectly."""
    graph = module_imports()
    assert "ds2_jax.datasets.manifest" in graph["ds2_jax.datasets.build"]  # the walk sees the package
    assert reached_outside(graph, "ds2_jax.datasets", DATASETS_MAY_REACH) == {}


def test_the_data_package_imports_no_jax_and_leans_on_host_modules_only():
    """ds2_jax.pipeline (sources, split index, filters, plan, batch format, loader) is host code:
    no module of it imports jax, flax or optax, or a ds2_jax module outside data, datasets and
    DATA_MAY_IMPORT; the one jax computation a source needs (the spectrogram statistics) is
    handed in by its caller (features.spectrogram_stats). Nothing in data imports the modules
    that consume batches (train, evaluation, parallel, state)."""
    graph = module_imports()
    data = {m for m in graph if m.startswith("ds2_jax.pipeline.") or m == "ds2_jax.pipeline"}
    assert {
        "ds2_jax.pipeline.source",
        "ds2_jax.pipeline.plan",
        "ds2_jax.pipeline.loader",
    } <= data  # the walk sees the package
    for mod in sorted(data):
        outside = {d for d in graph[mod] if not d.startswith(("ds2_jax.pipeline", "ds2_jax.datasets"))}
        assert outside <= DATA_MAY_IMPORT, (mod, outside - DATA_MAY_IMPORT)
        path = os.path.join(os.path.dirname(ROOT), *mod.split(".")) + ".py"
        if not os.path.exists(path):
            path = os.path.join(os.path.dirname(ROOT), *mod.split("."), "__init__.py")
        with open(path) as f:
            tops = {name.split(".")[0] for name in imported_names(ast.parse(f.read()))}
        assert not tops & {"jax", "flax", "optax"}, (mod, tops & {"jax", "flax", "optax"})
    code = (
        "import sys; from ds2_jax.pipeline import batch, filters, loader, plan, source, split_index, synthetic; "
        "from ds2_jax import settings; from ds2_jax.pipeline.batch import Sharding; from configs import smoke; "
        "s = source.make_source(settings.from_config_dict(smoke.get_config()), Sharding(4)); s.train_batch(0); "
        "list(s.eval_batches('', 4)); "
        "print(sorted(m for m in sys.modules if m == 'jax' or m.startswith('jax.')))"
    )
    repo = os.path.dirname(ROOT)
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=repo,
        capture_output=True,
        text=True,
        check=True,
        env=dict(os.environ, PYTHONPATH=repo),
    ).stdout.strip()
    assert out == "[]", out


def test_every_dataset_name_has_a_source():
    from ds2_jax import settings
    from ds2_jax.pipeline import source

    assert set(source.SOURCES) == set(settings.DATASETS)


# Modules no test file imports or runs: each is tested through the module that uses it, in
# the test file named (docs/develop.md, Tests: tests are grouped by behaviour, not one per module).
REACHED_THROUGH = {
    "ds2_jax.faults": "test_faults.py",  # every fault point: the kill, hang and dead-worker drills
    "ds2_jax.kernels.ctc": "test_ctc.py",  # ctc.ctc_loss with impl 'pallas' against optax and PyTorch
    "ds2_jax.kernels.gates": "test_recurrence.py",  # every kernel and cell against the 'scan' reference
    "ds2_jax.launcher": "test_launch.py",  # launch.py is its one line; the drills run it end to end
    "ds2_jax.serve.__main__": "test_serve.py",  # python -m ds2_jax.serve --helpfull
    "ds2_jax.workers": "test_manifest.py",  # kill -9 of a build (and test_loader.py: of a trainer) with workers
}


def _tested_modules() -> dict[str, set[str]]:
    """ds2_jax module -> the test files that import it or run it (`python -m ds2_jax.X`)."""
    repo = os.path.dirname(ROOT)
    modules = set(module_imports())
    found: dict[str, set[str]] = {m: set() for m in modules}
    tests = os.path.join(repo, "tests")
    for name in sorted(f for f in os.listdir(tests) if f.startswith("test_") and f.endswith(".py")):
        if name == os.path.basename(__file__):  # this file reads the modules' source, it tests none
            continue
        with open(os.path.join(tests, name)) as f:
            tree = ast.parse(f.read())
        named = imported_names(tree) | {
            n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
        }
        for m in modules & named:
            found[m].add(name)
    return found


def test_every_module_is_imported_or_run_by_a_test_file_or_named_with_the_one_that_reaches_it():
    found = _tested_modules()
    assert "test_train.py" in found["ds2_jax.train"] and "test_cli.py" in found["ds2_jax.demo"]  # imports, -m runs
    untested = sorted(
        m
        for m, files in found.items()
        if not files and m not in REACHED_THROUGH and not m.endswith("__init__") and m != PACKAGE
    )
    assert not untested, f"no test file imports or runs {untested}: test them, or name the file in REACHED_THROUGH"
    stale = sorted(m for m in REACHED_THROUGH if m not in found or found[m])
    assert not stale, f"REACHED_THROUGH lists modules that are gone or tested directly: {stale}"
    tests = os.path.join(os.path.dirname(ROOT), "tests")
    assert all(os.path.isfile(os.path.join(tests, f)) for f in REACHED_THROUGH.values())


def _unused_package_imports(tree: ast.Module) -> list[str]:
    """Names bound by `from ds2_jax... import name` that the module never reads: re-exports."""
    bound = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == PACKAGE:
            for a in node.names:
                bound[a.asname or a.name] = node.module
    read = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    return sorted(f"{module}.{name}" for name, module in bound.items() if name not in read)


def test_the_package_re_exports_nothing_and_edits_no_sys_path():
    """A name is imported from the module that owns it: no module imports one only to hand it on
    (tests and benchmarks included), and configs/ loads without sys.path edits."""
    assert _unused_package_imports(ast.parse("from ds2_jax.state import a, b\nb()")) == ["ds2_jax.state.a"]
    found = {}
    for folder, _, files in os.walk(ROOT):
        for name in (f for f in files if f.endswith(".py")):
            with open(os.path.join(folder, name)) as f:
                source = f.read()
            rel = os.path.relpath(os.path.join(folder, name), os.path.dirname(ROOT))
            assert "sys.path" not in source, f"{rel} edits sys.path"
            if unused := _unused_package_imports(ast.parse(source)):
                found[rel] = unused
    assert not found, f"re-exported (imported, never used): {found}"


def test_config_files_load_from_any_folder_with_only_ds2_jax_importable(tmp_path):
    """configs/*.py import only the installed package (as `pip install .` leaves it): ml_collections
    loads them by path, from any working directory, and the demo needs no sys.path entry."""
    repo = os.path.dirname(ROOT)
    site = tmp_path / "site"  # stands in for site-packages: ds2_jax, no configs package
    site.mkdir()
    os.symlink(ROOT, site / PACKAGE)
    configs = sorted(f for f in os.listdir(os.path.join(repo, "configs")) if f.endswith(".py") and f != "__init__.py")
    code = (
        "import importlib.util, sys\n"
        "for path in sys.argv[1:]:\n"
        "    spec = importlib.util.spec_from_file_location('config_file', path)\n"
        "    module = importlib.util.module_from_spec(spec)\n"
        "    spec.loader.exec_module(module)\n"
        "    print(module.get_config().num_train_steps)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"PYTHONPATH": str(site)}
    proc = subprocess.run(
        [sys.executable, "-c", code, *(os.path.join(repo, "configs", c) for c in configs)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0 and len(proc.stdout.split()) == len(configs) >= 4, proc.stderr
    # The demo's config flag loads its file by path (as launch.py's): a bad override is the only error.
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "ds2_jax.demo",
            f"--config={os.path.join(repo, 'configs', 'demo.py')}",
            "--config.num_train_steps=many",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and proc.stderr.strip().splitlines()[-1].endswith("expected an integer"), proc.stderr


def settings_rebuilt_below_the_entry_points(source: str) -> list[str]:
    """What in a module's source turns a config into settings again, or takes either: a call of
    settings.build, an isinstance test against a settings class, a `from_config` constructor."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            f = node.func
            if (
                isinstance(f, ast.Attribute)
                and f.attr == "build"
                and isinstance(f.value, ast.Name)
                and f.value.id == "settings"
            ):
                found.append(f"line {node.lineno}: settings.build")
            if (
                isinstance(f, ast.Name)
                and f.id == "isinstance"
                and len(node.args) == 2
                and any(
                    isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "settings"
                    for n in ast.walk(node.args[1])
                )
            ):
                found.append(f"line {node.lineno}: isinstance(..., {ast.unparse(node.args[1])})")
        if isinstance(node, ast.FunctionDef) and node.name == "from_config":
            found.append(f"line {node.lineno}: def from_config")
    return found


def test_settings_are_built_once_at_the_entry_points_and_passed_down_typed():
    """Only settings.py builds Settings (settings.from_config_dict, called by the entry points);
    below them every function takes the Settings or a section, never "a ConfigDict or a Settings"."""
    planted = (
        "section = model if isinstance(model, settings.Model) else settings.build(settings.Model, model)\n"
        "class C:\n    def from_config(cls, c):\n        pass\n"
    )
    assert len(settings_rebuilt_below_the_entry_points(planted)) == 3
    offenders = {}
    for folder, _, files in os.walk(ROOT):
        for name in files:
            path = os.path.join(folder, name)
            if name.endswith(".py") and path != os.path.join(ROOT, "settings.py"):
                with open(path) as f:
                    if found := settings_rebuilt_below_the_entry_points(f.read()):
                        offenders[os.path.relpath(path, os.path.dirname(ROOT))] = found
    assert offenders == {}, offenders


# Writes that neither replace a file atomically (files.replacing / files.write_text) nor append, and why.
DIRECT_WRITES = {
    "ds2_jax/resilience.py": "the lock is created with O_EXCL (never rewritten) and the write probe is removed at once",
    "ds2_jax/tools/make_corpus.py": "creates a new corpus tree (nothing there to keep whole)",
    "ds2_jax/tools/make_own_corpus.py": "creates a new corpus tree (nothing there to keep whole)",
    "ds2_jax/datasets/manifest.py": "the alphabet and build reports go into tfds's temporary build folder, "
    "renamed whole at the end",
    "ds2_jax/transcribe.py": "os.devnull over a closed stdout",
}
WRITE_CALLS = ("savez", "savez_compressed", "save", "savefig", "write_bytes", "write_text", "tofile")


def _writes_outside_replacing(tree: ast.Module) -> list[int]:
    """Lines of writes not inside a `with files.replacing(...)` block: open()/os.open() for writing
    (a mode with w, x or +; appends are fine) and the array/figure/JSON writers given a path."""
    found = []

    def replacing(node) -> bool:
        return any(
            isinstance(item.context_expr, ast.Call)
            and isinstance(item.context_expr.func, ast.Attribute)
            and item.context_expr.func.attr == "replacing"
            for item in node.items
        )

    def visit(node, inside: bool) -> None:
        if isinstance(node, ast.With) and replacing(node):
            inside = True
        if isinstance(node, ast.Call) and not inside:
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name == "open" and not (isinstance(func, ast.Attribute) and getattr(func.value, "id", "") == "os"):
                mode = (
                    node.args[1]
                    if len(node.args) > 1
                    else next((k.value for k in node.keywords if k.arg == "mode"), None)
                )
                if isinstance(mode, ast.Constant) and any(c in mode.value for c in "wx+"):
                    found.append(node.lineno)
            elif name == "open":  # os.open: flags naming a write
                if any(
                    isinstance(n, ast.Attribute) and n.attr in ("O_WRONLY", "O_RDWR", "O_CREAT") for n in ast.walk(node)
                ):
                    found.append(node.lineno)
            elif isinstance(func, ast.Attribute) and name in WRITE_CALLS:
                owner = getattr(func.value, "id", "")
                if name in ("write_text", "write_bytes") and owner != "files":  # pathlib's: in place
                    found.append(node.lineno)
                elif name in ("savez", "savez_compressed", "save") and owner in ("np", "numpy"):
                    found.append(node.lineno)
                elif name in ("savefig", "tofile"):
                    found.append(node.lineno)
        for child in ast.iter_child_nodes(node):
            visit(child, inside)

    visit(tree, False)
    return found


def test_every_write_in_the_package_replaces_atomically_or_appends():
    """issue 40: a file rewritten in place is torn by a kill (a shared data record, a plot, an ARPA
    file half written), and one made by mkstemp ignores the umask. Every write goes through
    files.replacing / files.write_text or appends; DIRECT_WRITES names the exceptions and why."""
    offenders = {}
    for folder, _, names in os.walk(ROOT):
        for name in names:
            if name.endswith(".py") and name != "files.py":
                path = os.path.join(folder, name)
                rel = os.path.relpath(path, os.path.dirname(ROOT))
                lines = _writes_outside_replacing(ast.parse(open(path).read()))
                if lines and rel not in DIRECT_WRITES:
                    offenders[rel] = lines
    assert not offenders, f"writes outside files.replacing (file: lines): {offenders}"
    planted = ast.parse(
        "import numpy as np\nwith open(p, 'w') as f:\n    pass\nnp.savez(p, a=1)\n"
        "with files.replacing(p, 'wb') as f:\n    np.savez(f, a=1)\nopen(p, 'a')\n"
    )
    assert _writes_outside_replacing(planted) == [2, 4]  # the check can fail


def _docstrings(tree: ast.Module) -> set[int]:
    """ids of the docstring nodes of a module and its classes and functions."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
    return out


def layout_spellings(source: str, names: set[str], prefixes: tuple[str, ...]) -> list[str]:
    """The string literals of `source` (docstrings aside) that spell a workdir file name: one of
    `names` (alone or as a path's last part), or an f-string or literal that starts with one of
    `prefixes` (the patterned names: eval-<split>-...)."""
    tree = ast.parse(source)
    skip = _docstrings(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            if node.value in names or node.value.rsplit("/", 1)[-1] in names or node.value.startswith(prefixes):
                found.append(node.value)
    return found


def test_the_layout_finder_sees_each_way_of_spelling_a_name():
    names, prefixes = {"config.json", "checkpoints"}, ("eval-",)
    planted = (
        '"""Writes config.json."""\n'
        'a = os.path.join(w, "config.json")\n'
        "b = f\"{os.path.join(w, 'checkpoints')}\"\n"
        'c = f"eval-{split}.json"\n'
        'd = "W/config.json"\n'
        'e = "the workdir\'s config.json holds them"\n'
    )
    found = sorted(layout_spellings(planted, names, prefixes))
    assert found == ["W/config.json", "checkpoints", "config.json", "eval-"]


def test_the_workdir_layout_is_spelled_in_one_module():
    """ds2_jax.layout names every file of a workdir; the modules that write or read them import
    the names, so the layout changes in one place (prose in docstrings and messages aside)."""
    from ds2_jax import layout

    names = {v for k, v in vars(layout).items() if k.isupper() and isinstance(v, str)}
    assert {"config.json", "metrics.jsonl", "timing.json", "checkpoints", "run.lock"} <= names
    prefixes = ("log-process", "eval-", "tune_lm-")  # layout's patterned names
    spelled = {}
    for folder, _, files in os.walk(ROOT):
        for name in (f for f in files if f.endswith(".py")):
            path = os.path.join(folder, name)
            if path == layout.__file__:
                continue
            with open(path) as f:
                if found := layout_spellings(f.read(), names, prefixes):
                    spelled[os.path.relpath(path, ROOT)] = found
    assert spelled == {}, f"workdir file names spelled outside ds2_jax/layout.py: {spelled}"


def test_the_training_loop_reads_in_one_screen():
    """train._train, the loop itself, stays under 60 lines: what it calls are named pieces
    (_compiled_steps, _evaluate_in_training, _checkpoint_due, _save_last, ...)."""
    with open(os.path.join(ROOT, "train.py")) as f:
        (loop,) = [n for n in ast.parse(f.read()).body if isinstance(n, ast.FunctionDef) and n.name == "_train"]
    assert loop.end_lineno - loop.lineno + 1 < 60, loop.end_lineno - loop.lineno + 1
