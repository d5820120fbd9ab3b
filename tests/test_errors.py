"""ds2_jax.errors: the one-line message is the last thing on stderr; which errors are a full disk;
every project error class lives in errors.py, and no other module classifies errors."""

import ast
import errno
import os
import subprocess
import sys

import pytest

from ds2_jax import errors
from tests import helpers

LATE_WRITER = """
import os, sys, threading
from ds2_jax import errors

started, noisy = threading.Event(), threading.Event()

def wind_down():  # like orbax's threads: they print while the main thread reports the error
    started.set()
    noisy.wait()
    while True:
        print("Traceback: Event loop is closed", file=sys.stderr, flush=True)
        os.write(2, b"C++ noise\\n")

def fail():
    threading.Thread(target=wind_down, daemon=True).start()
    started.wait()
    noisy.set()
    raise errors.Ds2Error("the message")

errors.run_explained(fail, sys.argv[1])
"""


def test_other_threads_output_after_an_error_goes_to_the_log(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-c", LATE_WRITER, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=helpers.ROOT,
    )
    assert proc.returncode == 1
    # (a line the thread had half written when stderr moved may end in front of the message)
    assert "error: the message [traceback:" in proc.stderr.splitlines()[-1], proc.stderr[-2000:]
    assert proc.stderr.split("error: the message")[-1].count("\n") == 1, proc.stderr[-2000:]  # nothing after it
    assert "Ds2Error" in (tmp_path / "error.log").read_text()


# ----------------------------------------------------------------------------- classification
# (Rules of ds2_jax.errors.is_disk_full; the errno cases carry a neutral message so that each
# rule is tested on its own, not through the text of the other.)


@pytest.mark.parametrize(
    "err,disk_full",
    [
        (OSError(errno.ENOSPC, "write failed"), True),
        (OSError(errno.EDQUOT, "write failed"), True),  # a quota is a full disk to the user
        (PermissionError(errno.EACCES, "write failed"), False),
        (OSError(errno.EROFS, "write failed"), False),
        (FileNotFoundError(errno.ENOENT, "write failed"), False),
        (OSError(errno.EIO, "write failed"), False),
        (OSError("write failed"), False),  # no errno
        (RuntimeError("tensorstore: Error writing 'x': No space left on device"), True),  # wrapped, as text only
        (RuntimeError("tensorstore: Error writing 'x': Disk quota exceeded"), True),
        (ValueError("model.rnn_size=0: must be >= 1"), False),
    ],
    ids=["ENOSPC", "EDQUOT", "EACCES", "EROFS", "ENOENT", "EIO", "no-errno", "text-ENOSPC", "text-EDQUOT", "other"],
)
def test_disk_full_is_recognized_by_errno_and_by_wrapped_text(err, disk_full):
    assert errors.is_disk_full(err) is disk_full


@pytest.mark.parametrize(
    "text,lost",
    [
        (
            "UNKNOWN: Gloo all-reduce failed: [gloo/transport/tcp/pair.cc:538] Read error [127.0.0.1]:19883: "
            "Connection "
            "reset by peer",
            True,
        ),  # what a killed peer gave the CPU survivor (issue 40)
        ("NCCL error: unhandled system error, remote process exited or there was a network error", True),
        ("UNAVAILABLE: Task 1 heartbeat timeout. This indicates that the remote task has failed", True),
        ("RESOURCE_EXHAUSTED: Out of memory while trying to allocate 1.2GiB", False),
        ("tensorstore: Error writing 'x': No space left on device", False),
        ("INTERNAL: Gloo all-reduce failed: mismatched shapes", False),  # gloo, but no peer gone
    ],
    ids=["gloo-reset", "nccl-exited", "heartbeat", "oom", "disk-full", "gloo-other"],
)
def test_a_lost_peer_is_recognized_by_the_collectives_words_only(text, lost):
    assert errors.is_peer_lost(RuntimeError(text)) is lost


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT])
def test_a_full_disk_or_quota_is_explained_as_disk_full_by_checkpoint_and_metrics_writes(tmp_path, monkeypatch, code):
    from types import SimpleNamespace

    from ds2_jax import checkpoint, metrics

    mgr = SimpleNamespace(directory=str(tmp_path))
    err = checkpoint.explain_save_error(mgr, 7, OSError(code, "write failed"))
    assert isinstance(err, errors.DiskFull) and "disk full" in str(err)
    other = checkpoint.explain_save_error(mgr, 7, OSError(errno.EACCES, "write failed"))
    assert type(other) is errors.CheckpointError
    writer = metrics.MetricWriter(str(tmp_path), enabled=True)
    try:
        writer.write(1, {"loss": 1.0})

        def failing_dumps(*args, **kwargs):
            raise OSError(code, "write failed")

        monkeypatch.setattr(metrics.json, "dumps", failing_dumps)
        with pytest.raises(errors.DiskFull, match="writing metrics to .* failed \\(disk full"):
            writer.write(2, {"loss": 1.0})
    finally:
        monkeypatch.undo()
        writer.close()


PACKAGE = os.path.join(helpers.ROOT, "ds2_jax")
# The words that decide disk full or out of memory (errors.DISK_FULL_TEXT, errors.is_out_of_memory).
CLASSIFYING_WORDS = (
    "RESOURCE_EXHAUSTED",
    "ENOSPC",
    "EDQUOT",
    "No space left",
    "Disk quota",
    "os_error_code",
    "out of memory",
)
RULES = ("is_out_of_memory", "is_disk_full")


def _package_sources():
    for folder, _, files in os.walk(PACKAGE):
        for name in sorted(f for f in files if f.endswith(".py")):
            path = os.path.join(folder, name)
            with open(path) as f:
                yield os.path.relpath(path, helpers.ROOT), f.read()


def _error_classes(source: str) -> list[str]:
    """Classes deriving from an exception type (a base whose name ends in Error or Exception)."""
    names = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef):
            bases = [b.attr if isinstance(b, ast.Attribute) else getattr(b, "id", "") for b in node.bases]
            if any(b.endswith(("Error", "Exception")) for b in bases):
                names.append(node.name)
    return names


def test_every_error_class_of_the_package_is_in_errors_py_with_its_rule():
    assert _error_classes("class A(errors.Ds2Error, RuntimeError): pass\nclass B(dict): pass") == ["A"]  # the scan sees
    elsewhere = {
        path: names
        for path, src in _package_sources()
        if path != os.path.join("ds2_jax", "errors.py") and (names := _error_classes(src))
    }
    assert not elsewhere, f"error classes outside ds2_jax/errors.py: {elsewhere}"
    with open(os.path.join(PACKAGE, "errors.py")) as f:
        names = _error_classes(f.read())
    assert len(names) >= 8
    for name in names:
        assert issubclass(getattr(errors, name), errors.Ds2Error), name
        if name != "Ds2Error":  # each has its row (when it is raised, by whom) in the module's table
            assert f"| `{name}` |" in errors.__doc__, name


def _code_strings(tree: ast.Module) -> list[str]:
    """The string literals of a module, its docstrings left out (comments are not in the tree)."""
    docs = {
        id(n.body[0].value)
        for n in ast.walk(tree)
        if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and n.body
        and isinstance(n.body[0], ast.Expr)
        and isinstance(n.body[0].value, ast.Constant)
    }
    return [
        n.value
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs
    ]


def test_no_module_but_errors_py_classifies_errors_by_their_text():
    """resilience keeps the lock, the watchdog and preemption; out of memory and disk full are
    decided by errors.is_out_of_memory / errors.is_disk_full only (no copies, no aliases)."""
    for path, src in _package_sources():
        if path == os.path.join("ds2_jax", "errors.py"):
            continue
        tree = ast.parse(src)
        strings = " ".join(_code_strings(tree))
        words = [w for w in CLASSIFYING_WORDS if w in strings]
        assert not words, f"{path} looks for {words}: classify in ds2_jax/errors.py"
        rules = [n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name in RULES]
        rules += [
            ast.unparse(n)
            for n in ast.walk(tree)
            if isinstance(n, ast.Assign)  # an alias of a rule
            and isinstance(n.value, (ast.Name, ast.Attribute))
            and ast.unparse(n.value).split(".")[-1] in RULES
        ]
        assert not rules, f"{path} defines {rules}: the rules live in ds2_jax/errors.py"


CLI_LINE = """
import sys, types
from ds2_jax import errors

config = types.SimpleNamespace(per_device_batch_size=4, dataset=types.SimpleNamespace(max_duration_s=27.0),
                               model=types.SimpleNamespace(rnn_size=64, dtype="float32"))
made = {"OutOfMemory": lambda: errors.out_of_memory(RuntimeError("RESOURCE_EXHAUSTED: x"), {"audio": (1, 2)}, config)}

def fail():
    name = sys.argv[2]
    raise made[name]() if name in made else getattr(errors, name)(f"the {name} message")

errors.run_explained(fail, sys.argv[1])
"""


def test_each_project_error_ends_a_command_with_one_error_line(tmp_path):
    with open(os.path.join(PACKAGE, "errors.py")) as f:
        names = [n for n in _error_classes(f.read()) if n != "Ds2Error"]
    for name in names:
        proc = subprocess.run(
            [sys.executable, "-c", CLI_LINE, str(tmp_path), name],
            capture_output=True,
            text=True,
            env=dict(os.environ, PYTHONPATH=helpers.ROOT),
            timeout=120,
        )
        lines = proc.stderr.strip().splitlines()
        code = 3 if name == "PeerLost" else 1  # 3: the watchdog's, documented for a dead peer
        assert proc.returncode == code and len(lines) == 1 and lines[0].startswith("error: "), (name, proc.stderr)
        assert "Traceback" not in proc.stderr and "disk full" not in lines[0], (name, lines[0])


KEEPS_EVERY_ERROR = """
import logging, os, sys
from ds2_jax import errors
w = sys.argv[1]
absl = logging.getLogger("absl")
background = compile("log.error('background save failed', exc_info=RuntimeError('tensorstore: first'))",
                     os.path.join("site", "orbax", "x.py"), "exec")

def run():
    with errors.background_errors_to_log(w, "orbax", "Event loop is closed"):
        exec(background, {"log": absl})
        raise ValueError("the error that ends the run")

sys.exit(errors.run_explained(run, w))
"""


def test_error_log_keeps_every_error_an_earlier_run_a_background_thread_and_the_last(tmp_path):
    """issue 40: the final write to error.log must append, never truncate what orbax's background
    threads (or an earlier run) wrote there."""
    import subprocess
    import sys

    from tests import helpers

    (tmp_path / "error.log").write_text("--- an earlier run's error\n")
    proc = subprocess.run(
        [sys.executable, "-c", KEEPS_EVERY_ERROR, str(tmp_path)],
        cwd=helpers.ROOT,
        env=helpers.repo_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1] == (
        f"error: the error that ends the run [traceback: {tmp_path / 'error.log'}]"
    )
    text = (tmp_path / "error.log").read_text()
    earlier, background, last = (
        text.index("an earlier run's error"),
        text.index("tensorstore: first"),
        text.index("ValueError: the error that ends the run"),
    )
    assert earlier < background < last


# ----------------------------------------------------------------------------- every shape, every classifier

# Real error texts, in their real capitalisation: (classifier, text, expected).
REAL_TEXTS = [
    (errors.is_out_of_memory, "RESOURCE_EXHAUSTED: Out of memory while trying to allocate 4294967296 bytes.", True),
    (
        errors.is_out_of_memory,
        "RESOURCE_EXHAUSTED: Failed to allocate request for 2.00GiB (2147483648B) on device ordinal 0",
        True,
    ),
    (errors.is_out_of_memory, "Allocator (GPU_0_bfc) ran out of memory trying to allocate 2.00GiB", True),
    (errors.is_out_of_memory, "INTERNAL: Failed to launch CUDA kernel: CUDA_ERROR_OUT_OF_MEMORY: out of memory", True),
    (errors.is_out_of_memory, "CUDA error: out of memory (cudaErrorMemoryAllocation)", True),
    (errors.is_out_of_memory, "RESOURCE_EXHAUSTED: tensorstore: No space left on device", False),
    (errors.is_out_of_memory, "INTERNAL: cuDNN error: CUDNN_STATUS_EXECUTION_FAILED", False),
    (errors.is_out_of_memory, "INVALID_ARGUMENT: Shapes must be equal rank, but are 2 and 3", False),
    (errors.is_disk_full, "OSError: [Errno 28] No space left on device: '/w/checkpoints/5'", True),
    (errors.is_disk_full, "[Errno 122] Disk quota exceeded", True),
    (errors.is_disk_full, "RESOURCE_EXHAUSTED: Error writing local file \"/w/x\" [os_error_code='28']", True),
    (errors.is_disk_full, "RESOURCE_EXHAUSTED: Out of memory while trying to allocate 1024 bytes.", False),
    (errors.is_disk_full, "PERMISSION_DENIED: Error opening \"/w/x\" [os_error_code='13'] Permission denied", False),
    (errors.is_peer_lost, "UNAVAILABLE: Gloo all-reduce failed: Connection reset by peer", True),
    (
        errors.is_peer_lost,
        "UNAVAILABLE: The following tasks are unhealthy (stopped sending heartbeats): /job:jax_worker/task:1",
        True,
    ),
    (errors.is_peer_lost, "INTERNAL: Gloo all-reduce failed: mismatched shapes", False),
]


def _shapes(err: BaseException) -> dict[str, BaseException]:
    """`err` as raised, and as the code around it sees it: a cause (raise X from err), a context
    (raised while handling err), a wrapper of a wrapper, and an exception group holding it."""

    def raised(make):
        try:
            make()
        except BaseException as e:  # noqa: BLE001
            return e

    def cause():
        raise RuntimeError("checkpoint 5 could not be written") from err

    def context():
        try:
            raise err
        except BaseException:
            raise RuntimeError("while saving, another error")  # noqa: B904 (the implicit context)

    def nested():
        try:
            cause()
        except RuntimeError as e:
            raise ValueError("the step failed") from e

    return {
        "as raised": err,
        "cause": raised(cause),
        "context": raised(context),
        "nested": raised(nested),
        "group": ExceptionGroup("a worker failed", [ValueError("unrelated"), err]),
    }


@pytest.mark.parametrize(
    "classifier, text, expected", REAL_TEXTS, ids=[f"{c.__name__}:{t[:40]}" for c, t, _ in REAL_TEXTS]
)
def test_every_classifier_reads_real_error_texts_in_every_shape_of_chain(classifier, text, expected):
    """Each of errors.py's classifiers answers alike for a real XLA/CUDA/allocator/OS text whether
    the error is raised as it is, is the cause or the context of another, is two wrappers down, or
    is one error of a group; an unrelated wrapper around a non-matching error stays non-matching."""
    for shape, err in _shapes(RuntimeError(text)).items():
        assert classifier(err) is expected, shape


@pytest.mark.parametrize(
    "err, classifier",
    [
        (OSError(errno.ENOSPC, "write failed"), errors.is_disk_full),
        (OSError(errno.EDQUOT, "write failed"), errors.is_disk_full),
        (
            MemoryError("Unable to allocate 8.00 GiB for an array with shape (1073741824,) and data type float64"),
            errors.is_out_of_memory,
        ),
    ],
    ids=["ENOSPC", "EDQUOT", "numpy-MemoryError"],
)
def test_errors_known_by_their_type_are_classified_in_every_shape(err, classifier):
    for shape, wrapped in _shapes(err).items():
        assert classifier(wrapped), shape
