"""Where the Mosaic kernels' 32-64-row calls go wrong: forward states against a float64 numpy
recurrence, the largest error by block of 16 rows and by time step, and call-to-call agreement.

    python benchmarks/results/2026-12-05-gpu-batch-kernels/diagnose.py
"""

import jax
import jax.numpy as jnp
import numpy as np

from ds2_jax.kernels import mosaic_rnn


def reference(xs, w):  # xs [B, T, 1, H] shared input, w [D, H, H] -> [B, T, D, H]
    xs, w = np.asarray(xs, np.float64), np.asarray(w, np.float64)
    b, t, _, h = xs.shape
    ys = np.zeros((b, t, w.shape[0], h))
    for d in range(w.shape[0]):
        state = np.zeros((b, h))
        for s in range(t):
            i = s if d == 0 else t - 1 - s
            state = np.clip(xs[:, i, 0] + state @ w[d], 0.0, 20.0)
            ys[:, i, d] = state
    return ys


for h, t, b, pieces in [
    (256, 6, 16, 1),
    (256, 6, 32, 1),
    (256, 6, 48, 1),
    (256, 6, 64, 1),
    (256, 6, 64, 2),
    (2048, 6, 32, 1),
    (2048, 6, 64, 4),
    (2048, 6, 64, 8),
    (2048, 6, 16, 2),
]:
    k1, k2 = jax.random.split(jax.random.PRNGKey(0))
    xs = (jax.random.normal(k1, (b, t, 1, h)) * 2.0).astype(jnp.bfloat16)
    w = (jax.random.normal(k2, (2, h, h)) / np.sqrt(h)).astype(jnp.bfloat16)
    try:
        ys = np.asarray(mosaic_rnn.mosaic_simple_rnn(xs, w, pieces), np.float64)
        again = np.asarray(mosaic_rnn.mosaic_simple_rnn(xs, w, pieces), np.float64)
    except Exception as e:
        print(f"h={h} b={b} pieces={pieces}: {type(e).__name__}: {str(e)[:200]}", flush=True)
        continue
    err = np.abs(ys - reference(xs.astype(jnp.float32), w.astype(jnp.float32)))
    by_rows = [f"{err[r : r + 16].max():.2g}" for r in range(0, b, 16)]
    by_time = [f"{err[:, s].max():.2g}" for s in range(t)]
    by_dir = [f"{err[:, :, d].max():.2g}" for d in range(2)]
    print(
        f"h={h} b={b} pieces={pieces}: max err by 16 rows {by_rows}, by time {by_time}, by direction {by_dir}, "
        f"calls agree: {np.array_equal(ys, again)}",
        flush=True,
    )
