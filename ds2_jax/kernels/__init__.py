"""The fast kernels (Pallas), what they share, and the one place that picks among them.

  dispatch      'auto' -> an implementation, for the recurrence and for the CTC loss; logged once
  mosaic_rnn    model.rnn_impl='mosaic': the recurrence as Mosaic GPU kernels (Hopper, bfloat16)
  triton_rnn    model.rnn_impl='pallas': the persistent Triton recurrence (any NVIDIA GPU)
  ctc           loss.ctc_impl='pallas': CTC forward-backward, one program per utterance
  gates         the clipped ReLU's gradient gate and state shifts every hand-written backward shares
  common        where the kernels run (interpret mode off the GPU), block sizes, thread barrier

Each is tested against the reference it replaces (ds2_jax.rnn.reference, optax.ctc_loss).
"""
