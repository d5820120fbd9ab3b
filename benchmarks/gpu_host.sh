# Sourced from the repository root by the run scripts of benchmarks/results/ on a GPU host whose
# python3 has jax with CUDA (and torch) but not the rest of ds2_jax's requirements, and no network:
#
#     . benchmarks/gpu_host.sh || exit 1
#
# WHEELS: a folder of the missing packages' wheels (default .whl; fetch them where pip reaches a
# registry), installed into SITE (default /tmp/site); SITE and the repository go on PYTHONPATH;
# JAX's compilation cache is on; the GPUs are written to $OUT/gpu.txt (OUT default: .).
WHEELS=${WHEELS:-.whl}
SITE=${SITE:-/tmp/site}
if ls "$WHEELS"/*.whl > /dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
        "$WHEELS"/*.whl || return 1
fi
export PYTHONPATH=$SITE:$PWD:${PYTHONPATH:-} JAX_COMPILATION_CACHE_DIR=${JAX_COMPILATION_CACHE_DIR:-/tmp/xla_cache}
nvidia-smi -L | tee "${OUT:-.}/gpu.txt"
