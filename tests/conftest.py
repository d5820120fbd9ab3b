"""Eight fake CPU devices for every test, one persistent XLA compilation cache for the
session (subprocesses inherit it; set before jax is imported), and the shared trained
demo model.

The tests build the same train and eval steps many times (every train_and_evaluate call
and every launch.py subprocess compiles them afresh); from the cache each is a load
instead of a compile. JAX_COMPILATION_CACHE_DIR set by the caller wins (and is kept).
"""

import atexit
import dataclasses
import os
import shutil
import signal
import sys
import tempfile

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# glibc reads it when a process starts: the xdist workers and the subprocesses get their large XLA:CPU
# buffers in transparent huge pages, as `make demo` does (the Makefile's HUGE_PAGES says why).
if "glibc.malloc.hugetlb" not in os.environ.get("GLIBC_TUNABLES", ""):
    os.environ["GLIBC_TUNABLES"] = ":".join(filter(None, [os.environ.get("GLIBC_TUNABLES"), "glibc.malloc.hugetlb=1"]))
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="ds2_jax_xla_cache_")
    # removed when the process that made it ends (under xdist the controller, after its workers)
    atexit.register(shutil.rmtree, os.environ["JAX_COMPILATION_CACHE_DIR"], ignore_errors=True)
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")

# A suite started in the background of a non-interactive shell inherits SIGINT ignored, and so would
# every process it starts: the tests of Ctrl-C (code 130, the first-compile stop) need Python's handler.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import pytest  # noqa: E402


@dataclasses.dataclass
class Trained:
    config: object  # the demo run's settings.Settings
    workdir: str
    lm: str  # a trigram LM of the training transcripts (ARPA)


_UNGROUPED: list[str] = []  # why the tests of `trained` could not be given one worker


def _train_demo(root, data_dir) -> Trained:
    """The demo model trained TRAIN_STEPS steps on the bundled corpus in `root` (the corpus built into
    `data_dir`, tfds), and a trigram LM of its training transcripts."""
    from configs import demo  # imported here: the GPU numerics run without ml_collections
    from ds2_jax import settings, train
    from ds2_jax.tools import build_lm
    from tests.helpers import CORPUS, TRAIN_STEPS

    config = demo.get_config()
    config.dataset.manual_dir = CORPUS
    config.dataset.data_dir = str(data_dir)
    config.num_devices = 1  # the demo's run on one CPU device: 8 fake devices only add overhead
    config.num_train_steps = TRAIN_STEPS
    config.optimizer.decay_steps = TRAIN_STEPS
    config.eval_every_steps = 0
    config.checkpoint_every_steps = TRAIN_STEPS
    workdir = str(root / "w")
    train.train_and_evaluate(config, workdir)
    lm = str(root / "lm.arpa")
    assert build_lm.main(["--manual_dir", CORPUS, "--splits", "train-clean-100", "--order", "3", "--out", lm]) == 0
    return Trained(settings.from_config_dict(config), workdir, lm)


@pytest.fixture(scope="session")
def trained(tmp_path_factory) -> Trained:
    """The demo model trained briefly on the bundled corpus, once per session."""
    if _UNGROUPED:
        pytest.fail(_UNGROUPED[0], pytrace=False)
    return _train_demo(tmp_path_factory.mktemp("demo"), tmp_path_factory.getbasetemp() / "demo_tfds")


@pytest.hookimpl(trylast=True)  # after pytest-xdist's own hook, which adds the group to each node id
def pytest_collection_modifyitems(config, items):
    """The files of slow tests run first. Under pytest-xdist (make test: -n 2 --dist loadgroup)
    the tests of the `trained` model share one worker, so it is trained once per session: each carries
    @pytest.mark.xdist_group("trained"), written on the test (a mark added here is not seen by
    xdist). xdist groups by a node-id suffix ('...@trained'): where it cannot add one (pytest
    9.2 with pytest-xdist 3.8), every worker would train the model, so that is an error too."""
    # The files holding slow tests first: under xdist each worker then starts a long test while the
    # other has work left, instead of one long test starting last while the other worker idles. Whole
    # files, in their order, so that a module-scoped fixture is built once, not once for the slow tests
    # and again for the rest. xdist hands out the `trained` group first anyway (its largest scope).
    slow_files = {item.nodeid.split("::")[0] for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.nodeid.split("::")[0] not in slow_files)
    uses = [item for item in items if "trained" in getattr(item, "fixturenames", ())]
    ungrouped = [
        item.nodeid for item in uses if "trained" not in [m.args[0] for m in item.iter_markers("xdist_group") if m.args]
    ]
    unmarked = [item.nodeid for item in uses if not item.get_closest_marker("slow")]
    if unmarked:  # make test-fast would train the demo model for them (minutes, on one worker)
        raise pytest.UsageError(f"tests using the `trained` fixtures are slow: mark them @pytest.mark.slow: {unmarked}")
    if ungrouped:
        raise pytest.UsageError(
            f'tests using the `trained` fixture need @pytest.mark.xdist_group("trained"): {ungrouped}'
        )
    if config.getoption("loadgroup", False) and not all(item.nodeid.endswith("@trained") for item in uses):
        _UNGROUPED.append(  # read by the `trained` fixture: a worker cannot stop the run cleanly here
            f"pytest-xdist's --dist loadgroup does not group tests under pytest {pytest.__version__} (no '@trained' "
            "in the node ids): every worker would train the demo model. Install the pytest pinned in setup.py"
        )
