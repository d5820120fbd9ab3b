"""Every ds2_jax setting, with its default. Other configs import and override this.

    python launch.py --config=configs/default.py --workdir=/tmp/ds2 [--config.key=value ...]
"""

import ml_collections


def get_config() -> ml_collections.ConfigDict:
    config = ml_collections.ConfigDict()

    # --- Run -------------------------------------------------------------------
    config.seed = 0  # Seeds parameters, data order and dropout-free rng streams.
    config.num_train_steps = 100_000  # Total optimizer steps (resume continues to this).
    config.per_device_batch_size = 16  # Utterances per device; global = this x devices.
    config.num_devices = 0  # Local devices to use; 0 = all local devices.
    config.compile = True  # False runs the same step op by op on one device (eager).
    config.parallelism = "pmap"  # 'pmap' or 'jit' (jit + NamedSharding over a device mesh).
    config.log_every_steps = 50  # stdout / metrics.jsonl / TensorBoard cadence.
    config.eval_every_steps = 2_000  # Greedy WER/CER on dataset.eval_split; 0 = never.
    config.checkpoint_every_steps = 1_000  # Orbax checkpoint cadence (and one at the end).
    config.keep_checkpoints = 3  # Checkpoints kept on disk.
    config.prefetch_batches = 2  # Batches staged on the devices ahead of the step.
    # Warn once when the devices sit idle waiting for input more than this fraction of
    # two log intervals in a row (metrics: input_wait_s).
    config.input_wait_warn_fraction = 0.05
    config.step_timeout_s = 1800.0  # Watchdog: exit (code 3) if no step finishes for this long; 0 = off.
    # JAX's persistent compilation cache: a restart with the same shapes loads its
    # compiled steps instead of compiling them again. '' = off; JAX_COMPILATION_CACHE_DIR wins.
    config.compilation_cache_dir = "~/.cache/ds2_jax/xla"
    config.deterministic = False  # GPU: --xla_gpu_deterministic_ops (slower, bitwise repeatable).

    # --- Fault injection (tests and drills; all off by default) -----------------
    config.faults = ml_collections.ConfigDict()
    config.faults.nan_at_steps = ""  # e.g. "5,7-9": these steps get a NaN loss and gradient.
    config.faults.kill_at = ""  # "step:N", "checkpoint:N" or "eval:N": SIGKILL there.
    config.faults.hang_at_step = -1  # Block forever before this step (watchdog drill).
    config.faults.kill_input_worker_at_step = -1  # The input worker making this step's batch dies.

    # --- Data ------------------------------------------------------------------
    config.dataset = ml_collections.ConfigDict()
    # 'synthetic' (random audio and text, compute only), 'librispeech_local' (the
    # project's tfds builder over a LibriSpeech-layout manual_dir) or 'librispeech'
    # (tfds's official, already prepared build).
    config.dataset.name = "synthetic"
    config.dataset.manual_dir = ""  # LibriSpeech tree or *.tar.gz archives (librispeech_local).
    config.dataset.data_dir = ""  # tfds data_dir; '' = tfds default (~/tensorflow_datasets).
    config.dataset.train_splits = "train-clean-100+train-clean-360+train-other-500"
    config.dataset.eval_split = "dev-clean"  # Split evaluated during training.
    config.dataset.min_duration_s = 0.0  # Utterances shorter than this are skipped.
    config.dataset.max_duration_s = 27.0  # Utterances longer than this are skipped.
    config.dataset.num_buckets = 4  # Duration buckets = compiled shapes (<= 8).
    config.dataset.sortagrad = True  # First epoch in ascending duration (DS2 SortaGrad).
    config.dataset.feature_stats_utterances = 2000  # Sample size for per-bin mean/std.
    # Worker processes (grain) that read, decode and pad training batches off the step's
    # critical path; 0 = inline in the training process; -1 = from the cores present
    # (ds2_jax.loader.resolve_num_workers: cores - 2, at most 16; 0 for synthetic data).
    config.dataset.num_workers = -1
    config.dataset.worker_buffer_size = 2  # Batches each worker keeps ready.
    # Synthetic source: utterances uniform in [min_duration_s, max_duration_s] of the
    # synthetic_* bounds, random int16 noise, random transcripts of chars_per_second.
    config.dataset.synthetic_min_duration_s = 6.0
    config.dataset.synthetic_max_duration_s = 8.0
    config.dataset.synthetic_chars_per_second = 14.0
    config.dataset.synthetic_num_utterances = 15_552  # One "epoch" (the seed's 972 x 16).
    config.dataset.synthetic_pool_size = 512  # Distinct utterances; index i repeats i % this.

    # --- Features (computed on device inside the step) ---------------------------
    config.features = ml_collections.ConfigDict()
    config.features.sample_rate = 16_000
    config.features.window_ms = 20.0  # Hann window -> 161 linear bins at 16 kHz.
    config.features.hop_ms = 10.0
    config.features.eps = 1e-14  # log(power + eps).
    # SpecAugment masks, applied to training batches only (0 masks = off, as in the seed).
    config.features.freq_masks = 0
    config.features.freq_mask_width = 27
    config.features.time_masks = 0
    config.features.time_mask_max_fraction = 0.05

    # --- Model -----------------------------------------------------------------
    config.model = ml_collections.ConfigDict()
    config.model.num_conv_layers = 2  # 1..3 (the seed: 2).
    config.model.conv_channels = 32
    config.model.num_rnn_layers = 3
    config.model.rnn_size = 2048
    config.model.rnn_cell = "simple"  # 'simple' (clipped ReLU), 'gru' or 'lstm'.
    config.model.share_rnn_weights = True  # One input projection + BN for both directions.
    config.model.bidirectional = True  # False: forward RNN + lookahead row convolution.
    config.model.row_conv_context = 20  # Future frames seen by the row convolution.
    config.model.dtype = "float32"  # Compute dtype: 'float32' or 'bfloat16' (params stay f32).
    config.model.sync_batch_norm = True  # Batch-norm statistics over all devices.
    config.model.batch_norm_momentum = 0.99
    config.model.batch_norm_epsilon = 1e-5
    # Strided convs: 'direct' (lax.conv_general_dilated with strides, the reference) or
    # 'space_to_depth' (each stride patch folded into channels, then a stride-1 conv: the
    # same sums, and tensor-core kernels for conv 1's single input channel; figures in
    # BUILD_NOTES.md).
    config.model.conv_impl = "space_to_depth"
    # Recurrence: 'scan' (lax.scan + autodiff, the reference), 'scan_vjp' (simple cell:
    # hand-written backward, weight gradient as one GEMM), 'pallas' (simple cell: one
    # persistent Pallas kernel per layer and direction pair, GPU; interpreted elsewhere),
    # 'mosaic' (simple cell, bfloat16, Hopper GPUs: Mosaic GPU kernels on cluster pairs,
    # batch run in chunks of 16) or 'auto' (per-device batch <= 16 on GPUs: mosaic where
    # it runs, else pallas when it fits shared memory; otherwise scan_vjp; scan for
    # GRU/LSTM).
    config.model.rnn_impl = "auto"
    config.model.scan_unroll = 1  # lax.scan unroll factor.

    # --- Loss ------------------------------------------------------------------
    config.loss = ml_collections.ConfigDict()
    config.loss.norm_by_times = False  # Divide each utterance's CTC loss by its frames.
    # CTC: 'optax' (lax.scan), 'pallas' (forward-backward kernels, GPU; interpreted
    # elsewhere) or 'auto' (pallas on GPUs, optax elsewhere; with either parallelism).
    config.loss.ctc_impl = "auto"

    # --- Optimizer -------------------------------------------------------------
    config.optimizer = ml_collections.ConfigDict()
    config.optimizer.learning_rate = 5e-4  # Paddle DS2's default Adam rate.
    config.optimizer.b1 = 0.9
    config.optimizer.b2 = 0.999
    config.optimizer.eps = 1e-8
    config.optimizer.clip_global_norm = 400.0  # Paddle's gradient_clipping_threshold.
    config.optimizer.warmup_steps = 0  # Linear warm-up from 0.
    config.optimizer.schedule = "constant"  # After warm-up: 'constant', 'cosine' or 'exponential'.
    config.optimizer.decay_rate = 0.83  # 'exponential': factor per decay_steps.
    config.optimizer.decay_steps = 10_000
    config.optimizer.max_consecutive_skips = 20  # Non-finite steps in a row before stopping.

    # --- Evaluation ------------------------------------------------------------
    config.eval = ml_collections.ConfigDict()
    config.eval.split = ""  # --mode=eval split; '' = dataset.eval_split.
    config.eval.max_utterances = 0  # 0 = the whole split.
    config.eval.num_examples_to_print = 3  # Reference/hypothesis pairs logged.

    # --- Decoding (--mode=eval, tools.tune_lm; ds2_jax.decoding) -----------------
    config.decoding = ml_collections.ConfigDict()
    config.decoding.beam_width = 0  # > 0: also beam search (flashlight-text); 0 = greedy only.
    config.decoding.lm_path = ""  # KenLM ARPA/binary word LM (tools.build_lm); '' = no LM.
    config.decoding.lexicon_path = ""  # Words the LM search may output, one a line; '' = the ARPA's unigrams.
    config.decoding.alpha = 0.5  # LM weight (on the natural-log LM score).
    config.decoding.beta = 1.0  # Bonus per decoded word (offsets the LM's short-output bias).
    config.decoding.beam_prune_logp = -10.0  # Drop beams this far below the best (log).
    config.decoding.token_min_logp = -5.0  # Skip tokens below this log-prob (unless a frame's argmax).
    config.decoding.unk_score_offset = float("-inf")  # Score of an out-of-lexicon word (output as <unk>); -inf = none.
    return config
