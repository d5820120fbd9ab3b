"""Eight fake CPU devices for every test, and one persistent XLA compilation cache for
the session (subprocesses inherit it); set before jax is imported.

The tests build the same train and eval steps many times (every train_and_evaluate call
and every launch.py subprocess compiles them afresh); from the cache each is a load
instead of a compile. JAX_COMPILATION_CACHE_DIR set by the caller wins.
"""

import os
import sys
import tempfile

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="ds2_jax_xla_cache_")
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
