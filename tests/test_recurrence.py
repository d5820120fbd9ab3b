"""Fast recurrence implementations against the lax.scan reference: outputs and gradients."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ds2_jax.kernels import common, mosaic_rnn, triton_rnn
from ds2_jax.rnn import recurrence, reference

pytestmark = pytest.mark.gpu  # kernel numerics: make test-gpu runs them on a GPU


def problem(dtype, t=23, d=2, b=3, h=16, seed=0, shared=False):
    """Projections [B, T, 1 if shared else D, H], recurrent [D, H, H], cotangents [B, T, D, H].

    Drawn by numpy: jax.random compiles its sampler anew for every shape (~1 CPU-s each)."""
    rng = np.random.default_rng(seed)
    xs = rng.standard_normal((b, t, 1 if shared else d, h)) * 2.0
    w = rng.standard_normal((d, h, h)) / np.sqrt(h)
    dys = rng.standard_normal((b, t, d, h))
    return tuple(jnp.asarray(a.astype(np.float32), dtype) for a in (xs, w, dys))


def outputs_and_grads(impl, xs, w, dys, **kwargs):
    """ys and (dL/dxs, dL/dW) of L = sum(ys * dys) for one implementation (a recurrence.IMPLS
    name or a function of (xs, w, cell)), as float32 numpy."""
    fn = recurrence.IMPLS[impl] if isinstance(impl, str) else impl

    def loss(xs, w):
        ys = fn(xs, w, "simple", **kwargs)
        return jnp.sum(ys.astype(jnp.float32) * dys.astype(jnp.float32)), ys

    (_, ys), grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1), has_aux=True))(xs, w)  # one compile
    return [np.asarray(a, np.float32) for a in (ys, *grads)]


def assert_matches_scan(impl, dtype, rtol, xs, w, dys, **kwargs):
    """Outputs and gradients of `impl` against the lax.scan reference."""
    y_ref, *g_ref = outputs_and_grads("scan", xs, w, dys, **kwargs)
    y_new, *g_new = outputs_and_grads(impl, xs, w, dys, **kwargs)
    np.testing.assert_allclose(y_new, y_ref, rtol=rtol, atol=rtol)
    for a, b in zip(g_new, g_ref):
        # relative to the gradient's scale: bf16 rounding differs between the two orders
        np.testing.assert_allclose(a, b, rtol=rtol, atol=rtol * np.abs(b).max())


DTYPES = [(jnp.float32, 1e-5), (jnp.bfloat16, 2e-2)]


@pytest.mark.parametrize("dtype, rtol", DTYPES)
@pytest.mark.parametrize("unroll, shared", [(1, False), (4, True)])
def test_scan_vjp_matches_scan(dtype, rtol, unroll, shared):
    assert_matches_scan("scan_vjp", dtype, rtol, *problem(dtype, shared=shared), unroll=unroll)


# On a GPU the kernel runs with several programs per direction (cols 16 of 64), so the
# grid-wide barrier between time steps is exercised; elsewhere it runs in interpret mode.
@pytest.mark.parametrize("dtype, rtol", DTYPES)
@pytest.mark.parametrize("cols, shared", [(16, True), (64, False)])
def test_pallas_kernel_matches_scan(dtype, rtol, cols, shared, monkeypatch):
    monkeypatch.setattr(triton_rnn, "column_block", lambda *_: cols)
    assert_matches_scan("pallas", dtype, rtol, *problem(dtype, t=19, b=16, h=64, shared=shared))


@pytest.mark.parametrize("b, h, d", [(3, 16, 2), (5, 40, 1), (33, 16, 2)])  # 33 -> 64 rows: 4 row chunks
def test_pallas_kernel_pads_odd_batch_and_width(b, h, d):
    assert_matches_scan("pallas", jnp.float32, 1e-5, *problem(jnp.float32, t=11, b=b, h=h, d=d))


def assert_as_close_to_float32_as_scan_vjp(impl, xs, w, dys):
    """bfloat16 outputs and gradients of `impl` no further from float32 than scan_vjp's."""
    with jax.default_matmul_precision("highest"):
        truth = outputs_and_grads("scan_vjp", xs.astype(jnp.float32), w.astype(jnp.float32), dys)

    def errors(impl):
        return [np.linalg.norm(a - b) / np.linalg.norm(b) for a, b in zip(outputs_and_grads(impl, xs, w, dys), truth)]

    kernel, scan = errors(impl), errors("scan_vjp")
    assert kernel[0] < 2e-2, kernel
    for k, s in zip(kernel, scan):
        assert k <= 1.25 * s + 1e-3, (kernel, scan)


def test_pallas_kernel_at_seed_width():
    """One seed layer (2 directions x 2048 units, batch 16, 267 frames) in bfloat16.

    Over 267 steps bfloat16 rounding grows (either implementation is ~5% off float32 in
    the gradients), so both are measured against float32 and the kernel may not be worse.
    """
    if jax.default_backend() != "gpu":
        pytest.skip("seed-width kernel check runs on the GPU (interpret mode would take minutes)")
    xs, w, dys = problem(jnp.bfloat16, t=267, b=16, h=2048, shared=True)
    assert_as_close_to_float32_as_scan_vjp(lambda xs, w, cell: triton_rnn.persistent_simple_rnn(xs, w), xs, w, dys)


def test_fast_impls_refuse_gated_cells():
    for impl in ("scan_vjp", "pallas", "mosaic"):
        with pytest.raises(ValueError, match="simple"):
            recurrence.IMPLS[impl](jnp.zeros((1, 2, 1, 6)), jnp.zeros((1, 2, 6)), "gru")


def valid_prefix_reference(x, w, n, cell):
    """One sequence's first n frames alone: forward in time, and backward from frame n - 1."""
    fwd = reference.scan_recurrence_time_major(x[:n, None, None], w[:1], cell)[:, 0, 0]
    bwd = reference.scan_recurrence_time_major(x[:n][::-1, None, None], w[1:], cell)[::-1, 0, 0]
    return np.concatenate([fwd, bwd], axis=-1)


@pytest.mark.parametrize(
    "cell, impl", [("simple", "scan"), ("simple", "scan_vjp"), ("simple", "pallas"), ("gru", "scan"), ("lstm", "scan")]
)
def test_backward_direction_starts_at_each_sequence_end(cell, impl):
    """bidirectional over a padded batch = each sequence's valid frames run alone.

    The padded frames hold large garbage projections: they must not reach any valid output.
    """
    gates, h, t = {"simple": 1, "gru": 3, "lstm": 4}[cell], 16, 13
    rng = np.random.default_rng(1)
    x = jnp.asarray(rng.standard_normal((3, t, gates * h)) * 2.0, jnp.float32)
    w = jnp.asarray(rng.standard_normal((2, h, gates * h)) / np.sqrt(h), jnp.float32)
    lengths = jnp.array([13, 7, 1])
    garbage = jnp.where(jnp.arange(t)[None, :, None] < lengths[:, None, None], x, 50.0)
    ys = np.asarray(recurrence.bidirectional([garbage], w, lengths, cell=cell, impl=impl))
    for b, n in enumerate(lengths.tolist()):
        np.testing.assert_allclose(ys[b, :n], valid_prefix_reference(x[b], w, n, cell), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("rows, pieces", [(16, 1), (32, 2)])
def test_mosaic_kernels_lower_for_cuda(rows, pieces):
    """The Mosaic GPU kernels (forward and backward; the state whole or in pieces) lower for
    CUDA without a GPU."""
    xs = jax.ShapeDtypeStruct((rows, 5, 1, 256), jnp.bfloat16)
    w = jax.ShapeDtypeStruct((2, 256, 256), jnp.float32)

    def loss(xs, w):
        return jnp.sum(mosaic_rnn.mosaic_simple_rnn(xs, w, pieces).astype(jnp.float32))

    text = jax.jit(jax.grad(loss, argnums=(0, 1))).trace(xs, w).lower(lowering_platforms=("cuda",)).as_text()
    assert text.count("mosaic_gpu") >= 2  # one custom call per kernel
    # Rank 1's partial reaches rank 0 by st.async, its bytes completing on rank 0's mbarrier (plain
    # DSMEM stores and a CTA-scope cluster-barrier arrive raced above 16 rows): in both kernels.
    assert text.count("complete_tx") >= 2


def test_mosaic_rejects_what_it_cannot_run():
    with pytest.raises(ValueError, match="multiple of 16.*got batch 8"):
        mosaic_rnn.check_shapes(jnp.zeros((8, 3, 1, 128), jnp.bfloat16), jnp.zeros((2, 128, 128)))
    with pytest.raises(ValueError, match="at most 64 at hidden 2048.*got batch 80"):
        mosaic_rnn.check_shapes(jnp.zeros((80, 3, 1, 2048), jnp.bfloat16), jnp.zeros((2, 2048, 2048)))
    with pytest.raises(ValueError, match="bfloat16"):
        mosaic_rnn.check_shapes(jnp.zeros((16, 3, 1, 128), jnp.float32), jnp.zeros((2, 128, 128)))
    with pytest.raises(ValueError, match="64 rows at hidden 2048 do not fit shared memory in 1 state pieces"):
        mosaic_rnn.mosaic_simple_rnn(jnp.zeros((64, 3, 1, 2048), jnp.bfloat16), jnp.zeros((2, 2048, 2048)), 1)


@pytest.mark.parametrize("hidden", [128, 1024, 2048, 4096])
def test_mosaic_rows_are_what_shared_memory_holds(hidden):
    """One call takes the largest multiple of 16 rows (up to MAX_ROWS) whose state fits the
    H100/H200's 227 KB beside the weights, whole or in the fewest pieces through two buffers;
    a batch is split into the fewest such calls, evenly."""
    limit = common.SHARED_MEMORY_BYTES[common.HOPPER]
    rows = mosaic_rnn.max_rows(hidden)
    assert rows % mosaic_rnn.ROW_MULTIPLE == 0 and rows <= mosaic_rnn.MAX_ROWS
    for batch in range(16, rows + 1, 16):
        pieces = mosaic_rnn.pieces_for(batch, hidden)
        assert mosaic_rnn.shared_memory_bytes(batch, hidden, pieces) <= limit
        assert pieces == 1 or mosaic_rnn.shared_memory_bytes(batch, hidden, pieces // 2) > limit  # the fewest
        assert (hidden // 2 // pieces) % mosaic_rnn.COLS == 0  # whole swizzle tiles
    if rows < mosaic_rnn.MAX_ROWS:
        assert mosaic_rnn.pieces_for(rows + 16, hidden) == 0
    for batch in [1, 16, 17, 33, 64, 100, 600]:
        chunks, each = mosaic_rnn.row_chunks(batch, hidden)
        assert chunks * each >= batch and (chunks - 1) * each < batch  # covers the batch, no empty chunk
        assert each % 16 == 0 and (each <= rows or rows == 0)
        most = mosaic_rnn.PREFERRED_ROWS_PER_CALL or rows
        assert chunks == -(-batch // max(min(most, rows), 16))  # the fewest calls
    assert mosaic_rnn.max_rows(2048, pieces=1) == 32 and mosaic_rnn.max_rows(2048) == 64
    assert mosaic_rnn.pieces_for(64, 2048) == 4 and mosaic_rnn.pieces_for(32, 2048) == 1
    assert mosaic_rnn.row_chunks(40, 2048, rows_per_call=32) == (2, 32)  # 20 rows each, padded to 32
    assert mosaic_rnn.max_rows(4096) == 0  # half of W alone fills shared memory


# Every call width the dispatch takes (16-64 rows, the state whole or in pieces): calls of 32-64
# rows once raced (rank 1's partial reached rank 0 unordered) and disagreed call to call.
@pytest.mark.parametrize(
    "t, h, b, pieces",
    [
        (7, 256, 16, 1),
        (267, 2048, 16, 1),
        (7, 256, 32, 1),
        (7, 256, 48, 1),
        (7, 256, 64, 1),
        (267, 2048, 32, 1),
        (267, 2048, 48, 4),
        (267, 2048, 64, 4),
        (267, 2048, 64, 8),
        (9, 512, 32, 4),
    ],
)
def test_mosaic_kernel_matches_float32(t, h, b, pieces):
    """Outputs and gradients of the Mosaic GPU kernels at least as close to float32 as scan_vjp
    in bfloat16, the state whole (1 piece) or in pieces through two buffers."""
    if not mosaic_rnn.supported():
        pytest.skip("the Mosaic GPU kernels run on Hopper GPUs")
    xs, w, dys = problem(jnp.bfloat16, t=t, b=b, h=h, shared=True)
    kernel = functools.partial(mosaic_rnn.mosaic_simple_rnn, pieces=pieces)
    assert_as_close_to_float32_as_scan_vjp(lambda xs, w, cell: kernel(xs, w), xs, w, dys)
    # A race in its grid barrier would show as calls that disagree: later calls must agree bit for bit.
    first, *again = [np.asarray(kernel(xs, w), np.float32) for _ in range(3)]
    for ys in again:
        np.testing.assert_array_equal(ys, first)


@pytest.mark.parametrize("b, h", [(5, 128), (20, 128), (40, 2048), (64, 2048), (100, 2048)])
def test_mosaic_impl_pads_and_chunks_the_batch(b, h):
    """rnn_impl='mosaic' runs any batch (padded to multiples of 16, in chunks that fit shared
    memory: 100 rows at hidden 2048 in 2 x 64, each in state pieces): no further from float32 than
    scan_vjp in bfloat16, and at hidden 128 element by element as the bfloat16 scan.

    Element by element holds only where bfloat16 rounds alike: at hidden 2048 the two summation
    orders move a few pre-activations across the ReLU's zero (0.05% of the gradient's elements,
    H100, 2026-12-06), so there both are measured against float32, as at the seed width."""
    if not mosaic_rnn.supported():
        pytest.skip("the Mosaic GPU kernels run on Hopper GPUs")
    xs, w, dys = problem(jnp.bfloat16, t=11, b=b, h=h, shared=True)
    assert_as_close_to_float32_as_scan_vjp("mosaic", xs, w, dys)
    if h <= 128:
        assert_matches_scan("mosaic", jnp.bfloat16, 2e-2, xs, w, dys)


def test_mosaic_impl_refuses_other_gpus():
    if mosaic_rnn.supported():
        pytest.skip("this GPU runs the Mosaic kernels")
    with pytest.raises(ValueError, match="Hopper"):
        recurrence.IMPLS["mosaic"](jnp.zeros((16, 3, 1, 128), jnp.bfloat16), jnp.zeros((2, 128, 128)), "simple")


def numpy_simple_rnn(xs, w):
    """float64 reference: h_t = min(max(x_t + h_{t-1} W_d, 0), 20); direction 1 in reverse time.

    xs [B, T, D, H], w [D, H, H] -> [B, T, D, H].
    """
    xs, w = np.asarray(xs, np.float64), np.asarray(w, np.float64)
    b, t, d, h = xs.shape
    ys = np.zeros_like(xs)
    for k in range(d):
        state = np.zeros((b, h))
        for step in range(t):
            i = step if k == 0 else t - 1 - step
            state = np.clip(xs[:, i, k] + state @ w[k], 0.0, 20.0)
            ys[:, i, k] = state
    return ys


def saturating_problem(t=9, b=16, h=16, d=2):
    """Projections large enough that about a third of the states sit at the clip (20)."""
    xs, w, dys = problem(jnp.float32, t=t, b=b, h=h, d=d, seed=2)  # 27% of the states at the clip
    return xs * 6.0 + 6.0, w, dys


@pytest.mark.parametrize("impl", ["scan", "scan_vjp", "pallas"])
def test_saturated_recurrence_matches_numpy_and_its_gradient_stops_at_the_clip(impl):
    xs, w, dys = saturating_problem()
    ys, dxs, dw = outputs_and_grads(impl, xs, w, dys)
    want = numpy_simple_rnn(xs, w)
    at_clip, inside = np.mean(want == 20.0), np.mean((want > 0) & (want < 20.0))
    assert at_clip > 0.2 and inside > 0.2 and np.mean(want == 0) > 0.05, (at_clip, inside)
    np.testing.assert_allclose(ys, want, rtol=1e-5, atol=1e-4)
    _, dxs_ref, dw_ref = outputs_and_grads("scan", xs, w, dys)
    assert np.all(dxs_ref[want == 20.0] == 0)  # lax.scan's autodiff of jnp.clip stops at 0 and 20
    np.testing.assert_allclose(dxs, dxs_ref, rtol=1e-5, atol=1e-5 * np.abs(dxs_ref).max())
    np.testing.assert_allclose(dw, dw_ref, rtol=1e-5, atol=1e-5 * np.abs(dw_ref).max())


@pytest.mark.parametrize("capability, fits_bf16_2048", [("9.0", True), ("8.0", False), ("8.6", False), ("7.5", False)])
def test_triton_kernel_fits_by_the_gpus_shared_memory(monkeypatch, capability, fits_bf16_2048):
    """The shared-memory limit is the GPU's own (A100 163 KB, consumer Ampere 99 KB), not the H200's."""
    expected = common.SHARED_MEMORY_BYTES.get(capability, common.SMALLEST_SHARED_MEMORY)
    assert common.shared_memory_bytes(capability) == expected
    # 2 directions, bfloat16, 132 SMs (32 columns per program): (32 + 16) x 2048 x 2 B
    assert triton_rnn.fits(2048, 2, 2, 132, expected) == fits_bf16_2048
    monkeypatch.setattr(common, "compute_capability", lambda: capability)
    assert mosaic_rnn.supported() == (capability == common.HOPPER)  # the Mosaic kernels: Hopper only
