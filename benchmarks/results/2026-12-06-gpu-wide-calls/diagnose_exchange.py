"""Which path corrupts the 32-64-row Mosaic calls: the partner's partial (DSMEM hand-off) or the
state (GMEM publish -> TMA)? Runs the forward kernel once per case and checks every step against
a float64 step computed from the kernel's OWN previous states (teacher forcing), so an error is
seen at the step where it enters, not where it has spread to. At the first bad step of each
direction it prints:

  rows / 16-col bands / 64-col blocks that are wrong, and how much of each wrong row is wrong;
  stale%: the share of wrong entries that equal a step computed with the partner's partial of the
          PREVIOUS step (rank 1 holds K rows H/2..H; its fp32 partial lands late -> rank 0 reads
          last step's). ~100% here = the DSMEM hand-off race; whole rows wrong = the state path.

    PYTHONPATH=. python3 benchmarks/results/2026-12-06-gpu-wide-calls/diagnose_exchange.py  # Hopper GPU
    python3 diagnose_exchange.py --fake   # CPU self-test on injected faults
"""

import sys

import numpy as np

CASES = (
    [(256, 6, 16, 1), (256, 6, 32, 1), (256, 6, 48, 1)]
    + [(256, 6, 64, 1)] * 5
    + [(2048, 6, 32, 1), (2048, 6, 48, 4), (2048, 6, 64, 4), (2048, 6, 64, 8), (2048, 40, 64, 4)]
)


def bf16(x):
    import ml_dtypes

    return np.asarray(x, np.float32).astype(ml_dtypes.bfloat16).astype(np.float64)


def order(t, d):
    return list(range(t)) if d == 0 else list(range(t - 1, -1, -1))


def fake_kernel(xs, w, inject):  # numpy recurrence that reads a stale partial where `inject` says
    b, t, _, h = xs.shape
    ys = np.zeros((b, t, w.shape[0], h))
    for d in range(w.shape[0]):
        prev = np.zeros((b, h))
        part_prev = np.zeros((b, h))
        for s, i in enumerate(order(t, d)):
            own = prev[:, : h // 2] @ w[d, : h // 2]
            part = prev[:, h // 2 :] @ w[d, h // 2 :]
            used = np.where(inject(d, s, b, h), part_prev, part) if s >= 2 else part
            prev = bf16(np.clip(xs[:, i, 0] + own + used, 0.0, 20.0))
            ys[:, i, d] = prev
            part_prev = part
    return ys


def analyse(name, xs, w, ys):
    b, t, _, h = xs.shape
    x = xs[:, :, 0]
    line = [name]
    for d in range(w.shape[0]):
        ts = order(t, d)
        for s in range(1, t):
            y, yp = ys[:, ts[s], d], ys[:, ts[s - 1], d]
            pred = np.clip(x[:, ts[s]] + yp @ w[d], 0.0, 20.0)
            bad = ~(np.abs(y - pred) <= 0.02 + np.abs(pred) * 2.0**-7)  # NaN counts as bad
            if not bad.any():
                continue
            rows = np.flatnonzero(bad.any(1))
            cols = np.flatnonzero(bad.any(0))
            bands = sorted(set((cols % 64 // 16).tolist()))
            blocks = len(set((cols // 64).tolist()))
            row_share = bad[rows].mean(1)
            msg = (
                f"dir {d}: first bad step {s} (t={ts[s]}): {bad.sum()} entries, nan {np.isnan(y).sum()}, "
                f"rows {rows.min()}-{rows.max()} ({len(rows)}), 16-col bands {bands}, "
                f"64-col blocks {blocks}/{h // 64}, "
                f"wrong share of a wrong row: median {np.median(row_share):.2f}"
            )
            if s >= 2:
                ypp = ys[:, ts[s - 2], d]
                stale = np.clip(
                    x[:, ts[s]] + yp[:, : h // 2] @ w[d, : h // 2] + ypp[:, h // 2 :] @ w[d, h // 2 :], 0, 20
                )
                ok = np.abs(y - stale) <= 0.02 + np.abs(stale) * 2.0**-7
                msg += f", stale% {100.0 * ok[bad].mean():.0f}"
            else:
                msg += ", step 1: partner partial uninitialized if late (stale% n/a)"
            line.append("  " + msg)
            break
        else:
            line.append(f"  dir {d}: every step matches its teacher-forced float64 step")
    print("\n".join(line), flush=True)


def main():
    rng = np.random.default_rng(0)
    for h, t, b, pieces in CASES:
        xs = bf16(rng.normal(size=(b, t, 1, h)) * 2.0)
        w = bf16(rng.normal(size=(2, h, h)) / np.sqrt(h))
        name = f"h={h} b={b} pieces={pieces}"
        if "--fake" in sys.argv:  # late partial in rows >= 32 (16-col band 3) at steps >= 3 of direction 1

            def inject(d, s, b, h):
                m = np.zeros((b, h), bool)
                if d == 1 and s >= 3:
                    m[32:, (np.arange(h) % 64) // 16 == 3] = True
                return m

            ys = fake_kernel(xs, w, inject)
        else:
            import jax.numpy as jnp

            from ds2_jax.kernels import mosaic_rnn

            ys = np.asarray(
                mosaic_rnn.mosaic_simple_rnn(jnp.asarray(xs, jnp.bfloat16), jnp.asarray(w, jnp.bfloat16), pieces),
                np.float64,
            )
        analyse(name, xs, w, ys)


if __name__ == "__main__":
    main()
