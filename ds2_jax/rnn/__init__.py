"""The recurrence of the RNN layers: one entry point, its reference, its fast kernels and the
one place that picks among them.

  recurrence     bidirectional(): the layers' entry point; IMPLS, name -> implementation
  dispatch       'auto' -> an implementation, for the recurrence and for the CTC loss; logged once
  reference      'scan' (lax.scan, the reference) and 'scan_vjp' (a hand-written backward pass)
  gates          the clipped ReLU's gradient gate and state shifts the backward passes share
  persistent     'pallas': the persistent Triton kernel (any NVIDIA GPU; interpret mode elsewhere)
  mosaic         'mosaic': the Mosaic GPU kernels (Hopper, bfloat16)
  pallas_common  what the Pallas kernels (these and ds2_jax.ctc_kernel) share
"""
