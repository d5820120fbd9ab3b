"""The recurrence of the RNN layers: the entry point and the reference recurrences (the fast
kernels and the 'auto' choice live in ds2_jax.kernels).

  recurrence     bidirectional(): the layers' entry point; IMPLS, name -> implementation
  reference      'scan' (lax.scan, the reference) and 'scan_vjp' (a hand-written backward pass)
"""
