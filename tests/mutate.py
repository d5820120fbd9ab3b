"""Mutation testing: does a small wrong change to the code make its tests fail?

Each mutation replaces one exact string in one source file of a temporary copy of the
working tree (never the checkout itself), runs the tests named for it, and counts as
killed when they fail. A survivor is wrong code the suite accepts: a test to write.

    python tests/mutate.py                # every mutation (make mutate)
    python tests/mutate.py -k bn_ -k skip # those whose names contain bn_ or skip
    python tests/mutate.py --list         # and whether each still applies

The unmutated copy runs every named test first (a baseline that must pass). Exit status 1
when a mutation survives or no longer applies. pytest does not collect this file (its
name does not start with test_).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

STEP = "tests/test_train_step.py"
SGD = f"{STEP}::test_sgd_step_applies_the_global_mean_gradient_on_one_and_eight_devices"
ADAM = f"{STEP}::test_adam_step_on_eight_devices_is_the_optimizer_applied_to_the_global_gradient"
PADDING = f"{STEP}::test_padding_length_changes_nothing_in_train_mode"
NAN_LOSS = f"{STEP}::test_step_with_nan_loss_keeps_params_optimizer_and_batch_stats"
NAN_GRAD = f"{STEP}::test_step_with_finite_loss_but_nan_gradient_keeps_everything"
BN = (
    "tests/test_model.py::test_batch_norm_normalizes_with_masked_moments_and_updates_running_stats_by_momentum",
    "tests/test_model.py::test_synchronized_batch_norm_over_devices_equals_one_device",
    "tests/test_model.py::test_batch_norm_ignores_padding_statistics",
)
SATURATED = "tests/test_recurrence.py::test_saturated_recurrence_matches_numpy_and_its_gradient_stops_at_the_clip"
BACKWARD = "tests/test_recurrence.py::test_backward_direction_starts_at_each_sequence_end"
CTC = "tests/test_ctc.py::"
BOUNDARY = "tests/test_settings.py::test_every_check_holds_at_its_boundary"
SRC = "tests/test_tfds_source.py::"
DURATION_LIMITS = SRC + "test_duration_filter_keeps_utterances_exactly_at_each_limit"
CTC_LIMIT = SRC + "test_ctc_filter_keeps_an_utterance_whose_frames_equal_what_its_labels_need"
RESTORE = "restored.replace(apply_fn=state.apply_fn, tx=state.tx)"  # train.py's resume
RESUME = "tests/test_train.py::test_killed_and_resumed_run_matches_uninterrupted_in_every_field_and_counter"
DEC = "tests/test_decoding.py::"
NEW_WEIGHTS = DEC + "test_new_alpha_and_beta_change_what_the_decoder_outputs"
GRID = DEC + "test_tune_lm_grid_scores_each_setting_with_its_own_weights"
PRUNING = (
    DEC + "test_token_pruning_keeps_each_frames_argmax_and_every_token_at_the_threshold",
    DEC + "test_beam_search_keeps_each_frames_best_token_however_unsure",
)
LOOKAHEAD = (
    "tests/test_model.py::test_row_convolution_output_at_t_sees_frames_t_to_t_plus_context",
    "tests/test_model.py::test_unidirectional_model_looks_ahead_by_exactly_the_row_convolution_context",
)
ERR = "tests/test_errors.py::"
DISK_FULL = (
    ERR + "test_disk_full_is_recognized_by_errno_and_by_wrapped_text",
    ERR + "test_a_full_disk_or_quota_is_explained_as_disk_full_by_checkpoint_and_metrics_writes",
)
SPLITS = "tests/test_evaluation.py::test_several_splits_are_each_scored_on_their_own_and_written_to_their_own_file"
DRAWS = STEP + "::test_spec_augment_draws_differ_by_step_and_by_device_and_repeat_for_the_same_step"
FEATURE_STATS = "tests/test_features.py::test_feature_statistics_count_each_utterances_valid_frames_only"
FT = "tests/test_finetune.py::"
AUG_SHARES = "tests/test_augment.py::test_process_shares_and_input_workers_give_the_one_process_batches"
LIVE = "tests/test_faults.py::test_a_checkpoint_a_live_run_is_writing_is_waited_for_then_named_never_called_damaged"
AUDIO = "tests/test_audio.py::"
ACC = "tests/test_accumulate.py::"
EMA = "tests/test_ema.py::"
AVG = "tests/test_average.py::"
EVAL_LIMIT = SRC + "test_eval_keeps_utterances_longer_than_the_largest_bucket_each_in_the_smallest_shape"
EPOCH_ORDER = SRC + "test_each_epoch_covers_every_utterance_once_in_a_new_order_a_function_of_seed_and_epoch"
FIELD_BY_FIELD = (
    "tests/test_manifest.py::test_each_recorded_build_option_changed_alone_is_refused_naming_it_and_no_other",
    "tests/test_manifest.py::test_each_part_of_the_data_fingerprint_changed_alone_is_noticed",
    "tests/test_settings.py::test_a_resume_that_changes_one_setting_alone_refuses_it_by_name_or_records_it_as_its_role_says",
)
TIES = (
    "tests/test_best_checkpoint.py::test_ties_and_orders_of_eval_results_pick_the_best_by_wer_then_cer_then_the_newest"
)
SHAPES = (
    ERR + "test_every_classifier_reads_real_error_texts_in_every_shape_of_chain",
    ERR + "test_errors_known_by_their_type_are_classified_in_every_shape",
)
NON_FINITE_PARTS = "tests/test_faults.py::test_a_non_finite_value_in_any_part_of_the_state_is_refused_at_save_naming_it"
CV_RELEASE = (
    "tests/test_manifest.py::test_a_common_voice_release_folder_builds_exactly_train_dev_and_test",
    "tests/test_manifest.py::test_a_common_voice_release_builds_validated_alone_when_asked",
)
AWKWARD = "tests/test_manifest.py::test_awkward_transcripts_and_paths_come_through_every_manifest_layout_as_written"
AUG_SIGNAL = (
    "tests/test_augment.py::test_a_noise_recording_at_another_rate_keeps_its_pitch_and_duration",
    "tests/test_augment.py::test_every_noise_and_impulse_response_recording_is_drawn",
    "tests/test_augment.py::test_the_speed_and_gain_draws_cover_their_settings_range_and_no_more",
)
OWN_SPLIT = "tests/test_evaluation.py::test_one_run_scores_two_splits_of_other_contents_each_over_its_own_utterances"
WORD_TIMES = "tests/test_word_timings.py::"
DELAY_AT_EVAL = WORD_TIMES + "test_training_records_the_delay_at_its_last_eval_and_export_carries_it_without_the_data"
EXPORT_RTF = "tests/test_export.py::test_export_rtf_times_the_four_paths_as_transcribe_runs_them"


@dataclasses.dataclass(frozen=True)
class Mutation:
    name: str
    path: str  # relative to the repository root
    old: str  # must occur exactly once in the file
    new: str
    tests: tuple[str, ...]  # pytest arguments: files or node ids
    why: str  # the wrong version, in words


MUTATIONS = [
    # ---- issue 23's list
    Mutation(
        "grad_pmean",
        "ds2_jax/train.py",
        "grads = psum(grads, axis_name)",
        "grads = grads if axis_name is None else jax.lax.pmean(grads, axis_name)",
        (SGD, ADAM),
        "gradients averaged (pmean) instead of summed over devices",
    ),
    Mutation(
        "local_feasible_count",
        "ds2_jax/train.py",
        "count = psum(jnp.sum(used), axis_name)",
        "count = jnp.sum(used)",
        (SGD, ADAM),
        "loss divided by the device's own feasible count",
    ),
    Mutation(
        "infeasible_used",
        "ds2_jax/train.py",
        "used = ok.astype(jnp.float32) * weights",
        "used = weights",
        (SGD,),
        "infeasible utterances counted in the loss's denominator",
    ),
    Mutation(
        "bn_var_over_padding",
        "ds2_jax/model.py",
        "sq = jnp.sum(jnp.square(xf - mean) * m, axis=reduce_axes)",
        "sq = jnp.sum(jnp.square(xf - mean), axis=reduce_axes)",
        (*BN, PADDING),
        "batch-norm variance sums padded frames too",
    ),
    Mutation(
        "bn_running_var_frozen",
        "ds2_jax/model.py",
        "ra_var.value = self.momentum * ra_var.value + (1 - self.momentum) * var",
        "ra_var.value = ra_var.value",
        BN,
        "running variance never updated",
    ),
    Mutation(
        "skip_keeps_no_batch_stats",
        "ds2_jax/train.py",
        "batch_stats=keep(updated.batch_stats, state.batch_stats)",
        "batch_stats=updated.batch_stats",
        (NAN_LOSS, NAN_GRAD),
        "a skipped step keeps params and optimizer state but not batch-norm statistics",
    ),
    Mutation(
        "finite_loss_only",
        "ds2_jax/train.py",
        # Both checks of the gradient's effect go: a NaN gradient makes the update non-finite, so
        # dropping the norm's check alone changes nothing the step does (it survived so).
        "finite = jnp.isfinite(loss_sum) & jnp.isfinite(grad_norm)\n\n"
        "    updated = state.apply_gradients(grads=grads, batch_stats=new_stats)\n"
        "    finite = finite & all_finite((updated.params, updated.opt_state))",
        "finite = jnp.isfinite(loss_sum)\n\n    updated = state.apply_gradients(grads=grads, batch_stats=new_stats)",
        (NAN_LOSS, NAN_GRAD),
        "finiteness checked on the loss only",
    ),
    Mutation(
        "rnn_grad_ignores_upper_clip",
        "ds2_jax/kernels/gates.py",
        "return (y > 0) & (y < CLIP)",
        "return y > 0",
        (SATURATED,),
        "clipped-ReLU gradient (scan_vjp and the Pallas kernel) passes at the clip of 20",
    ),
    Mutation(
        "wer_as_cer",
        "ds2_jax/metrics.py",
        '"wer": float(jiwer.wer(refs, hypotheses))',
        '"wer": float(jiwer.cer(refs, hypotheses))',
        ("tests/test_metrics.py",),
        "WER computed as CER",
    ),
    Mutation(
        "time_mask_past_valid",
        "ds2_jax/features.py",
        "* jnp.maximum(lengths[:, None] - width, 1)).astype(jnp.int32)",
        "* jnp.maximum(t - width, 1)).astype(jnp.int32)",
        ("tests/test_features.py",),
        "SpecAugment time masks start anywhere in the padded batch",
    ),
    # ---- further gaps
    Mutation(
        "utterances_local",
        "ds2_jax/train.py",
        "utterances = psum(jnp.sum(weights), axis_name)",
        "utterances = jnp.sum(weights)",
        (SGD,),
        "utterance (and infeasible) counts of one device only",
    ),
    Mutation(
        "skip_counts_loss",
        "ds2_jax/train.py",
        '"loss_count": jnp.where(finite, count, 0.0)',
        '"loss_count": count',
        (NAN_LOSS, NAN_GRAD),
        "a skipped step's utterances count in the mean loss",
    ),
    Mutation(
        "consecutive_skips_never_reset",
        "ds2_jax/train.py",
        "consecutive_skips=jnp.where(finite, 0, state.consecutive_skips + 1)",
        "consecutive_skips=state.consecutive_skips + (~finite).astype(jnp.int32)",
        (NAN_GRAD,),
        "a good step does not reset the consecutive-skip count (runs stop too early)",
    ),
    Mutation(
        "no_gradient_clipping",
        "ds2_jax/state.py",
        "optax.clip_by_global_norm(opt.clip_global_norm),",
        "optax.identity(),",
        (f"{STEP}::test_optimizer_clips_the_global_gradient_norm_before_adam",),
        "optimizer.clip_global_norm ignored",
    ),
    Mutation(
        "warmup_from_full_rate",
        "ds2_jax/state.py",
        "optax.linear_schedule(0.0, opt.learning_rate",
        "optax.linear_schedule(opt.learning_rate, opt.learning_rate",
        (f"{STEP}::test_learning_rate_warms_up_linearly_from_zero_then_decays",),
        "warm-up starts at the full rate",
    ),
    Mutation(
        "bn_count_ignores_frequency",
        "ds2_jax/model.py",
        "count = jnp.sum(m) * per_row",
        "count = jnp.sum(m)",
        BN,
        "conv batch norm divides by frames, not frames x frequency bins",
    ),
    Mutation(
        "sync_bn_local_variance",
        "ds2_jax/model.py",
        "sq = jax.lax.psum(sq, self.axis_name)",
        "sq = sq",
        BN,
        "synchronized batch norm: variance of the device's rows only",
    ),
    Mutation(
        "conv_relu_no_upper_clip",
        "ds2_jax/activation.py",
        "return jnp.clip(x, 0.0, CLIP)",
        "return jnp.maximum(x, 0.0)",
        ("tests/test_model.py::test_clipped_relu_clips_at_0_and_20_and_passes_gradient_only_between",),
        "the shared clipped ReLU (conv blocks, RNN cells) not clipped at 20",
    ),
    Mutation(
        "rnn_cell_no_upper_clip",
        "ds2_jax/rnn/reference.py",
        "h = clipped_relu(proj_t + rec_t)",
        "h = jnp.maximum(proj_t + rec_t, 0.0)",
        (SATURATED,),
        "the reference recurrence not clipped at 20",
    ),
    Mutation(
        "auto_kernel_above_16_rows",
        "ds2_jax/kernels/dispatch.py",
        'if asked == "auto" and rows > triton_rnn.ROWS:',
        "if False:",
        ("tests/test_dispatch.py",),
        "'auto' takes the Triton kernel above 16 rows per device, where scan_vjp is faster",
    ),
    Mutation(
        "auto_mosaic_any_rows",
        "ds2_jax/kernels/dispatch.py",
        "and rows <= MOSAIC_AUTO_ROWS",
        "",
        ("tests/test_dispatch.py",),
        "'auto' takes the Mosaic kernels at row counts never measured",
    ),
    Mutation(
        "mosaic_partial_by_plain_dsmem_stores",
        "ds2_jax/kernels/mosaic_rnn.py",
        'plgpu.async_store_smem(z, part_smem, pair_bar, cluster_idx=0, cluster_dim="c")',
        'plgpu.cluster_ref(part_smem, {"c": 0})[...] = z; plgpu.barrier_arrive(pair_bar)',
        ("tests/test_recurrence.py::test_mosaic_kernels_lower_for_cuda",),
        "rank 1's partial handed over with plain DSMEM stores and an arrive (the 32-64-row race)",
    ),
    Mutation(
        "mosaic_pieces_not_the_fewest",
        "ds2_jax/kernels/mosaic_rnn.py",
        "return next((p for p in piece_options(hidden) if",
        "return next((p for p in piece_options(hidden)[1:] if",
        ("tests/test_recurrence.py::test_mosaic_rows_are_what_shared_memory_holds",),
        "the Mosaic kernels cut the state into pieces even where it fits whole",
    ),
    Mutation(
        "rnn_padding_not_zeroed",
        "ds2_jax/rnn/recurrence.py",
        "xs = jnp.where(valid, jnp.stack(projections, axis=2), jnp.zeros((), projections[0].dtype))",
        "xs = jnp.stack(projections, axis=2)",
        (BACKWARD,),
        "backward direction starts from the padded end, not each sequence's end",
    ),
    Mutation(
        "features_keep_one_padded_frame",
        "ds2_jax/features.py",
        "jax.lax.broadcasted_iota(jnp.int32, feats.shape[:2], 1) < jnp.expand_dims(lengths, 1)",
        "jax.lax.broadcasted_iota(jnp.int32, feats.shape[:2], 1) <= jnp.expand_dims(lengths, 1)",
        ("tests/test_features.py",),
        "the first padded frame keeps its (padding-dependent) features",
    ),
    Mutation(
        "ctc_repeats_need_no_blank",
        "ds2_jax/geometry.py",
        "return label_lengths + repeats.sum(axis=1).astype(label_lengths.dtype)",
        "return label_lengths",
        (CTC + "test_min_frames_counts_repeats",),
        "feasibility ignores the blank a repeated label needs",
    ),
    Mutation(
        "ctc_empty_label_feasible",
        "ds2_jax/ctc.py",
        "return (label_lengths > 0) & (",
        "return (",
        (CTC + "test_infeasible_labels_are_masked_out_of_loss_and_gradient",),
        "empty transcripts trained on",
    ),
    Mutation(
        "greedy_keeps_repeats",
        "ds2_jax/text.py",
        "keep[1:] = path[1:] != path[:-1]",
        "keep[1:] = True",
        ("tests/test_decoding.py::test_greedy_texts_collapse_repeats_and_respect_lengths",),
        "greedy decoding does not merge repeated labels",
    ),
    Mutation(
        "index_repeats_across_rows",
        "ds2_jax/pipeline/split_index.py",
        "    repeat[offsets[:-1][lengths > 0]] = False  # an utterance's first label repeats nothing\n",
        "",
        ("tests/test_tfds_source.py::test_vectorized_min_frames_match_the_per_sequence_rule",),
        "the index's CTC need counts a repeat across two utterances",
    ),
    Mutation(
        "input_wait_while_busy",
        "ds2_jax/reporting.py",
        "idle_since = start if last_metrics is None else None",
        "idle_since = start",
        ("tests/test_loader.py::test_input_wait_counts_only_time_the_devices_sit_idle",),
        "input wait counted while the devices still run the last step",
    ),
    Mutation(
        "synthetic_pool_ignored",
        "ds2_jax/pipeline/synthetic.py",
        "key = (EVAL_INDEX_OFFSET if held_out else 0) + index % self.pool_size",
        "key = index",
        ("tests/test_loader.py::test_synthetic_pool_repeats_after_its_size_and_keeps_eval_apart",),
        "synthetic utterances regenerated per index (the pool never reused)",
    ),
    # ---- issue 24's list
    Mutation(
        "bar_counts_dispatched_steps",
        "ds2_jax/progress.py",
        "while self._pending and _is_ready(self._pending[0]):",
        "while self._pending:",
        ("tests/test_progress.py::test_bar_advances_when_steps_finish_not_when_dispatched",),
        "the progress bar advances when a step is dispatched, not when it finishes",
    ),
    Mutation(
        "logs_write_over_the_bar",
        "ds2_jax/progress.py",
        "            h.handle = self._clearing(h.handle, h.filter)\n",
        "            pass\n",
        ("tests/test_progress.py::test_log_lines_clear_the_bar_and_it_comes_back",),
        "log lines land inside the progress bar",
    ),
    Mutation(
        "bar_rate_since_the_start",
        "ds2_jax/progress.py",
        "        self._times.append((now, self.finished, self._utterances))  # the first: after the compile\n",
        "        self._times.append((now, self.finished, self._utterances))\n"
        "        if len(self._times) == 1:\n            self._times.appendleft((now - 60.0, self.finished - 1, 0.0))\n",
        ("tests/test_progress.py::test_rates_and_eta_leave_out_the_first_step_which_compiles",),
        "the bar's step/s and ETA count the compiling first step",
    ),
    Mutation(
        "bar_into_log_files",
        "ds2_jax/reporting.py",
        "is_chief and progress.on_a_terminal(sys.stderr))",
        "is_chief)",
        (
            "tests/test_progress.py::test_the_training_bar_is_shown_on_a_terminal_only",
            "tests/test_launch.py::test_train_resume_and_eval",
        ),
        "the bar's redraws go into a log file or pipe too",
    ),
    Mutation(
        "eta_off_by_the_step_time",
        "ds2_jax/reporting.py",
        'return f" eta={datetime.timedelta(seconds=round(step_time_s * steps_left))}"',
        'return f" eta={datetime.timedelta(seconds=round(steps_left))}"',
        ("tests/test_progress.py::test_the_log_line_says_the_time_left",),
        "the log line's eta ignores the step time",
    ),
    Mutation(
        "host_check_without_patches",
        "ds2_jax/memory.py",
        "convolution=devices * convolution_scratch_bytes(text))",
        "convolution=0)",
        (
            "tests/test_memory.py::test_on_the_cpu_a_batch_the_shape_estimate_lets_through_is_refused_before_the_first_step",
        ),
        "the CPU host check counts XLA's buffers only, not the convolutions' patches",
    ),
    Mutation(
        "host_check_refuses_all",
        "ds2_jax/memory.py",
        "    if need.total <= available:\n",
        "    if False:\n",
        ("tests/test_memory.py::test_on_the_cpu_a_small_batch_still_trains_with_the_compiled_step_checked",),
        "the CPU host check refuses a batch that fits",
    ),
    Mutation(
        "converge_decay_not_fitted",
        "benchmarks/precision.py",
        "        config.optimizer.decay_steps = 0\n",
        "        pass\n",
        ("tests/test_precision.py::test_the_seed_model_trains_on_the_bundled_corpus",),
        "the convergence check keeps a given decay length (10,000 steps: a near-constant rate over 600)",
    ),
    Mutation(
        "torch_twin_leaves_batch_norm_bias",
        "benchmarks/torch_model.py",
        '        put(dst.bias, src["bias"])\n',
        "        pass\n",
        ("tests/test_benchmarks.py::test_torch_loop_model_computes_what_the_jax_model_computes",),
        "the PyTorch twin keeps its own batch-norm biases (zeros, as the JAX init's): the parity test's parameters "
        "must not be the init's",
    ),
    Mutation(
        "bundled_corpus_drops_dataset_overrides",
        "benchmarks/precision.py",
        'if k.startswith("dataset.")})',
        "if False})",
        ("tests/test_precision.py::test_the_seed_model_trains_on_the_bundled_corpus",),
        "the convergence commands silently drop --config.dataset.* (demo's section replaces them)",
    ),
    Mutation(
        "precision_command_ignores_its_dataset_flags",
        "benchmarks/precision.py",
        "FLAGS.data_dir, command_line_overrides()",
        "FLAGS.data_dir, {}",
        ("tests/test_precision.py::test_precision_command_trains_every_run_and_seed_and_draws_them",),
        "benchmarks.precision passes no --config.dataset.* to the bundled corpus (two batch shapes compiled)",
    ),
    Mutation(
        "cosine_to_the_end_ignored",
        "ds2_jax/state.py",
        "        return dataclasses.replace(opt, decay_steps=max(config.num_train_steps - opt.warmup_steps, 1))\n",
        "        return opt\n",
        ("tests/test_settings.py::test_a_cosine_decay_of_0_steps_ends_at_the_last_step_whatever_num_train_steps_is",),
        "optimizer.decay_steps=0 (ds2_8gpu's) decays over one step instead of to num_train_steps",
    ),
    Mutation(
        "stretched_decay_unrecorded",
        "ds2_jax/workdir_config.py",
        'if key == "num_train_steps" and config.optimizer.schedule == "cosine" and config.optimizer.decay_steps == 0:',
        "if False:",
        ("tests/test_faults.py::test_a_resume_that_stretches_a_cosine_decay_to_the_last_step_records_num_train_steps",),
        "a resume that stretches a decay to the last step is not recorded as a change of what is trained",
    ),
    Mutation(
        "shm_left_to_the_collector",
        "ds2_jax/pipeline/loader.py",
        "        shm.unlink()\n",
        "        return np.asarray(array)\n",
        ("tests/test_loader.py::test_a_process_that_read_with_workers_leaves_no_shared_memory_behind",),
        "batches alive at exit leave their shared-memory segments behind (resource_tracker's leak warning)",
    ),
    Mutation(
        "last_word_never_ends",
        "ds2_jax/decoding.py",
        "            lp = np.concatenate([lp, boundary_frame(lp.shape[1], self.silence)])\n",
        "            pass\n",
        ("tests/test_decoding.py::test_lm_corrects_an_acoustically_ambiguous_word",),
        "the LM search drops an utterance's last word (its spelling never reaches the boundary)",
    ),
    Mutation(
        "lm_weight_on_log10",
        "ds2_jax/decoding.py",
        "lm_weight=self.alpha * math.log(10)",
        "lm_weight=self.alpha",
        ("tests/test_decoding.py::test_alpha_weighs_the_natural_log_lm_score",),
        "alpha weighs KenLM's log10 score, not the natural-log score the config documents",
    ),
    Mutation(
        "plot_rows_unsorted",
        "ds2_jax/plot.py",
        'points = sorted((r["step"], r[key]) for r in rows if r.get(key) is not None)',
        'points = [(r["step"], r[key]) for r in rows if r.get(key) is not None]',
        ("tests/test_plot.py::test_each_panel_draws_its_keys_in_step_order",),
        "curves drawn in file order, so a resumed run's rows zigzag",
    ),
    Mutation(
        "build_announces_a_download",
        "ds2_jax/datasets/librispeech_local.py",
        "        with contextlib.redirect_stdout(io.StringIO()):\n            yield\n",
        "        yield\n",
        ("tests/test_datasets.py::test_a_local_build_says_nothing_of_downloads",),
        "a local build prints tfds's 'Downloading and preparing dataset'",
    ),
    Mutation(
        "cudnn_padded_keeps_padding",
        "benchmarks/torch_model.py",
        "return fn(mask_time(x, lengths), hx,",
        "return fn(x, hx,",
        ("tests/test_benchmarks.py::test_padded_cudnn_layout_trains_like_the_packed_one",),
        "the padded cuDNN layout lets padding frames drive the state, unlike the packed one",
    ),
    Mutation(
        "all_skipped_split_left_to_tfds",
        "ds2_jax/datasets/librispeech_local.py",
        "        if not report.kept:",
        "        if False:",
        ("tests/test_datasets.py::test_a_split_with_every_utterance_skipped_says_why",),
        "a split with nothing kept fails deep in tfds ('No examples were yielded')",
    ),
    Mutation(
        "transcribe_drops_lexicon",
        "ds2_jax/transcribe.py",
        'lexicon_path=args.lexicon or (base.lexicon_path if lm_path == base.lm_path else ""),',
        'lexicon_path=base.lexicon_path if lm_path == base.lm_path else "",',
        ("tests/test_transcribe.py::test_transcribes_wav_flac_8k_44k_stereo_and_reports_a_bad_file",),
        "transcribe --lexicon is accepted but ignored",
    ),
    Mutation(
        "watchdog_outlives_an_error",
        "ds2_jax/reporting.py",
        "        self.watchdog.close()\n",
        "",
        ("tests/test_faults.py::test_non_finite_steps_skipped_counted_and_bounded",),
        "a run that raises leaves its watchdog running, which ends the caller's process later",
    ),
    Mutation(
        "eval_on_a_host_copy",
        "ds2_jax/train.py",
        "result = evaluation.evaluate(\n            p_eval,\n"
        "            with_eval_weights(state, config.eval.ema_weights),\n",
        "result = evaluation.evaluate(\n            p_eval,\n"
        "            with_eval_weights(par.put_replicated(par.get(state)), config.eval.ema_weights),\n",
        ("tests/test_evaluation.py::test_eval_during_training_reads_the_placed_train_state",),
        "each eval during training copies the train state to the host and places it again",
    ),
    Mutation(
        "eval_rows_device_minor",
        "ds2_jax/parallel.py",
        "lambda x: x.reshape((-1,) + x.shape[2:])",
        "lambda x: x.swapaxes(0, 1).reshape((-1,) + x.shape[2:])",
        ("tests/test_evaluation.py::test_pmap_jit_and_eager_evaluate_a_checkpoint_alike_placing_it_once",),
        "pmap eval outputs read back in another row order than the host batch's references",
    ),
    Mutation(
        "eval_rows_blocks_reversed",
        "ds2_jax/parallel.py",
        "for k in sorted(blocks)]",
        "for k in sorted(blocks, reverse=True)]",
        ("tests/test_distributed.py::test_two_processes_match_one_process_and_resume_after_kill_under_jit",),
        "with several processes under jit, a process's eval rows read back out of order",
    ),
    Mutation(
        "jit_restored_state_placed_across_hosts",
        "ds2_jax/parallel.py",
        "tree = jax.tree.map(_host_value, tree)",
        "tree = tree",
        ("tests/test_distributed.py::test_two_processes_match_one_process_and_resume_after_kill_under_jit",),
        "with several processes under jit, a restored (process-local) state is moved to the global mesh as is",
    ),
    # ---- issue 28: bfloat16 trains like float32
    Mutation(
        "bf16_output_layer",
        "ds2_jax/model.py",
        'nn.Dense(cfg.vocab_size, dtype=jnp.float32, param_dtype=jnp.float32, name="output")',
        'nn.Dense(cfg.vocab_size, dtype=cfg.compute_dtype, param_dtype=jnp.float32, name="output")',
        ("tests/test_bf16_step.py",),
        "the output layer (logits, its bias gradient's sum) in bfloat16",
    ),
    Mutation(
        "bf16_batch_norm_affine",
        "ds2_jax/model.py",
        "return batch_norm_affine(xf, scale, bias, mean, var, self.epsilon).astype(self.dtype)",
        "return batch_norm_affine(*(a.astype(self.dtype) for a in (xf, scale, bias, mean, var)), self.epsilon)"
        ".astype(self.dtype)",
        ("tests/test_bf16_step.py",),
        "batch norm's affine (and its gradient sums) in bfloat16",
    ),
    Mutation(
        "deterministic_unchecked",
        "ds2_jax/determinism.py",
        'if config.deterministic and backend == "gpu"',
        'if False and backend == "gpu"',
        ("tests/test_determinism.py",),
        "a deterministic config runs on a GPU without the deterministic flag",
    ),
    # ---- issue 33: classes of wrong result. 1: settings at their boundaries
    Mutation(
        "bound_min_duration_le_max",
        "ds2_jax/settings.py",
        "if not 0 <= self.min_duration_s < self.max_duration_s:",
        "if not 0 <= self.min_duration_s <= self.max_duration_s:",
        (BOUNDARY,),
        "dataset.min_duration_s == max_duration_s accepted (no utterance can pass)",
    ),
    Mutation(
        "bound_min_duration_zero_refused",
        "ds2_jax/settings.py",
        "if not 0 <= self.min_duration_s <",
        "if not 0 < self.min_duration_s <",
        (BOUNDARY,),
        "dataset.min_duration_s=0 (the default) refused",
    ),
    Mutation(
        "bound_zero_rnn_layers",
        "ds2_jax/settings.py",
        '"model.num_rnn_layers": Range(1),',
        '"model.num_rnn_layers": Range(0),',
        (BOUNDARY,),
        "model.num_rnn_layers=0 accepted",
    ),
    Mutation(
        "bound_max_buckets_refused",
        "ds2_jax/settings.py",
        '"dataset.num_buckets": Range(1, MAX_BUCKETS,',
        '"dataset.num_buckets": Range(1, MAX_BUCKETS - 1,',
        (BOUNDARY,),
        "dataset.num_buckets=8 (the maximum) refused",
    ),
    Mutation(
        "bound_at_least_strict",
        "ds2_jax/settings.py",
        "above = self.low < value if self.open_low else self.low <= value",
        "above = self.low < value",
        (BOUNDARY,),
        "every `>= minimum` check refuses the minimum itself",
    ),
    Mutation(
        "bound_time_fraction_one_refused",
        "ds2_jax/settings.py",
        '"features.time_mask_max_fraction": FRACTION,',
        '"features.time_mask_max_fraction": Range(0.0, 1.0, open_high=True),',
        (BOUNDARY,),
        "features.time_mask_max_fraction=1 refused",
    ),
    Mutation(
        "bound_zero_learning_rate",
        "ds2_jax/settings.py",
        '"optimizer.learning_rate": _above(0.0),',
        '"optimizer.learning_rate": Range(0.0),',
        (BOUNDARY,),
        "optimizer.learning_rate=0 accepted (nothing trains)",
    ),
    Mutation(
        "bound_zero_log_prob_threshold",
        "ds2_jax/settings.py",
        '"decoding.beam_prune_logp": Range(high=0.0, open_high=True,',
        '"decoding.beam_prune_logp": Range(high=0.0,',
        (BOUNDARY,),
        "decoding.beam_prune_logp=0 accepted (prunes all but the best)",
    ),
    Mutation(
        "bound_zero_alpha_refused",
        "ds2_jax/settings.py",
        '"decoding.alpha": Range(0.0),',
        '"decoding.alpha": _above(0.0),',
        (BOUNDARY,),
        "decoding.alpha=0 (no LM weight, tune_lm's first grid point) refused",
    ),
    Mutation(
        "bound_three_conv_layers_refused",
        "ds2_jax/geometry.py",
        "if not 1 <= num_conv_layers <= MAX_CONV_LAYERS:",
        "if not 1 <= num_conv_layers < MAX_CONV_LAYERS:",
        (BOUNDARY,),
        "model.num_conv_layers=3 refused",
    ),
    Mutation(
        "bound_auto_workers_refused",
        "ds2_jax/settings.py",
        '"dataset.num_workers": Range(-1,',
        '"dataset.num_workers": Range(0,',
        (BOUNDARY,),
        "dataset.num_workers=-1 (auto, the default) refused",
    ),
    # 2: filters at their limits
    Mutation(
        "filter_ctc_drops_exact_fit",
        "ds2_jax/pipeline/filters.py",
        "& (frames < need)",
        "& (frames <= need)",
        (CTC_LIMIT,),
        "the CTC filter drops an utterance whose frames are exactly what its labels need",
    ),
    Mutation(
        "feasible_needs_a_spare_frame",
        "ds2_jax/ctc.py",
        "<= logit_lengths)",
        "< logit_lengths)",
        (CTC_LIMIT, CTC + "test_frames_exactly_what_the_labels_need_have_one_path_and_its_loss"),
        "the loss masks out an utterance whose frames are exactly what its labels need",
    ),
    Mutation(
        "filter_min_duration_exclusive",
        "ds2_jax/pipeline/filters.py",
        "short = n < self.min_samples",
        "short = n <= self.min_samples",
        (DURATION_LIMITS,),
        "an utterance of exactly min_duration_s dropped",
    ),
    Mutation(
        "filter_max_duration_exclusive",
        "ds2_jax/pipeline/filters.py",
        "long = n > self.max_samples",
        "long = n >= self.max_samples",
        (DURATION_LIMITS,),
        "an utterance of exactly max_duration_s dropped",
    ),
    Mutation(
        "filter_duration_truncated",
        "ds2_jax/pipeline/filters.py",
        "self.max_samples = round(d.max_duration_s * self.sample_rate)",
        "self.max_samples = int(d.max_duration_s * self.sample_rate)",
        (DURATION_LIMITS,),
        "max_duration_s truncated to samples (4.02 s -> 64319): an utterance at the limit dropped",
    ),
    Mutation(
        "eval_extra_shape_if_any_fits",
        "ds2_jax/pipeline/plan.py",
        "not fits(*shapes[-1]).all():",
        "not fits(*shapes[-1]).any():",
        (EVAL_LIMIT,),
        "eval silently drops utterances longer than the largest bucket when some fit",
    ),
    Mutation(
        "eval_bucket_fit_strict",
        "ds2_jax/pipeline/plan.py",
        "fits = lambda s, label_len: (samples <= s) & (label_lens <= label_len)",
        "fits = lambda s, label_len: (samples < s) & (label_lens <= label_len)",
        (EVAL_LIMIT,),
        "an eval utterance exactly a bucket's size goes to a larger shape",
    ),
    Mutation(
        "eval_bucket_ignores_labels",
        "ds2_jax/pipeline/plan.py",
        "fits = lambda s, label_len: (samples <= s) & (label_lens <= label_len)",
        "fits = lambda s, label_len: samples <= s",
        (EVAL_LIMIT,),
        "eval buckets by audio only: a transcript longer than the bucket's labels",
    ),
    Mutation(
        "eval_largest_fitting_bucket",
        "ds2_jax/pipeline/plan.py",
        "for b in reversed(range(len(shapes))):",
        "for b in range(len(shapes)):",
        (EVAL_LIMIT,),
        "eval utterances padded to the largest shape they fit, not the smallest",
    ),
    # 3: state that must survive a resume
    Mutation(
        "resume_resets_skip_counters",
        "ds2_jax/train.py",
        RESTORE,
        RESTORE[:-1] + ", skipped_steps=state.skipped_steps, consecutive_skips=state.consecutive_skips)",
        (RESUME,),
        "a resumed run starts skipped_steps and consecutive_skips from zero",
    ),
    Mutation(
        "resume_resets_consecutive_skips",
        "ds2_jax/train.py",
        RESTORE,
        RESTORE[:-1] + ", consecutive_skips=state.consecutive_skips)",
        (RESUME,),
        "a resumed run forgets the non-finite steps in a row before its checkpoint",
    ),
    Mutation(
        "resume_fresh_optimizer",
        "ds2_jax/train.py",
        RESTORE,
        RESTORE[:-1] + ", opt_state=state.opt_state)",
        (RESUME,),
        "a resumed run restarts Adam's moments",
    ),
    Mutation(
        "resume_fresh_batch_stats",
        "ds2_jax/train.py",
        RESTORE,
        RESTORE[:-1] + ", batch_stats=state.batch_stats)",
        (RESUME,),
        "a resumed run restarts batch norm's running statistics",
    ),
    Mutation(
        "resume_drops_the_checkpoints_record",
        "ds2_jax/metrics.py",
        'if r.get("step", 0) <= step]',
        'if r.get("step", 0) < step]',
        (RESUME,),
        "a resumed run deletes the metrics record of its checkpoint's step",
    ),
    Mutation(
        "resume_keeps_a_stale_record",
        "ds2_jax/metrics.py",
        'if r.get("step", 0) <= step]',
        'if r.get("step", 0) <= step + 1]',
        (RESUME,),
        "a resumed run keeps the killed run's record of the step after the checkpoint (it appears twice)",
    ),
    # 4: decoding that must change when its settings do
    Mutation(
        "set_weights_keeps_the_old_search",
        "ds2_jax/decoding.py",
        "self.alpha, self.beta = alpha, beta\n        self._decoder = self._build()",
        "self.alpha, self.beta = alpha, beta",
        (NEW_WEIGHTS, GRID),
        "set_weights records the new alpha/beta but the search keeps the old ones (tune_lm scores one setting)",
    ),
    Mutation(
        "search_weights_from_config_alpha",
        "ds2_jax/decoding.py",
        "lm_weight=self.alpha * math.log(10)",
        "lm_weight=self.cfg.alpha * math.log(10)",
        (NEW_WEIGHTS,),
        "the search takes alpha from the config it was built with, not set_weights'",
    ),
    Mutation(
        "search_weights_from_config_beta",
        "ds2_jax/decoding.py",
        "word_score=self.beta,",
        "word_score=self.cfg.beta,",
        (NEW_WEIGHTS,),
        "the search takes beta from the config it was built with, not set_weights'",
    ),
    Mutation(
        "workers_decode_with_the_first_weights",
        "ds2_jax/decoding.py",
        "tuned = dataclasses.replace(self.cfg, alpha=self.alpha, beta=self.beta)",
        "tuned = self.cfg",
        (NEW_WEIGHTS,),
        "decode_all's workers search with the constructor's alpha/beta",
    ),
    Mutation(
        "pruning_drops_the_argmax",
        "ds2_jax/decoding.py",
        "keep = (log_probs >= min_logp) | (log_probs == log_probs.max(-1, keepdims=True))",
        "keep = log_probs >= min_logp",
        PRUNING,
        "token pruning drops a frame's best token when it is below token_min_logp",
    ),
    Mutation(
        "pruning_argmax_over_time",
        "ds2_jax/decoding.py",
        "(log_probs == log_probs.max(-1, keepdims=True))",
        "(log_probs == log_probs.max(0, keepdims=True))",
        PRUNING,
        "token pruning keeps each token's best frame, not each frame's best token",
    ),
    Mutation(
        "pruning_threshold_exclusive",
        "ds2_jax/decoding.py",
        "keep = (log_probs >= min_logp) |",
        "keep = (log_probs > min_logp) |",
        PRUNING,
        "a token exactly at token_min_logp pruned",
    ),
    # 7: what only slow tests caught (tune_lm's weights; evaluation over several splits)
    Mutation(
        "grid_ignores_beta",
        "ds2_jax/tools/tune_lm.py",
        "beam.set_weights(alpha, beta)",
        "beam.set_weights(alpha, 0.0)",
        (GRID,),
        "tune_lm's grid scores every beta as 0",
    ),
    Mutation(
        "grid_one_decoding",
        "ds2_jax/tools/tune_lm.py",
        "            hyps = beam.decode_all(outputs.log_probs)\n",
        "            hyps = hyps if rows else beam.decode_all(outputs.log_probs)\n",
        (GRID,),
        "tune_lm's grid decodes once and scores that decoding for every setting",
    ),
    Mutation(
        "eval_first_split_for_each",
        "ds2_jax/evaluation.py",
        "result = evaluate(run.p_eval, run.state, run.source, name,",
        "result = evaluate(run.p_eval, run.state, run.source, split_list(split or config.eval.split or "
        "config.dataset.eval_split)[0],",
        (SPLITS,),
        "--mode=eval scores the first listed split under every name",
    ),
    Mutation(
        "eval_result_file_without_split",
        "ds2_jax/evaluation.py",
        "layout.eval_result(split, step, decoding_tag(beam), max_utterances)",
        'layout.eval_result("", step, decoding_tag(beam), max_utterances)',
        (SPLITS,),
        "each split's eval json overwrites the previous split's",
    ),
    Mutation(
        "eval_split_list_first_only",
        "ds2_jax/evaluation.py",
        'splits = [s.strip() for s in spec.split(",") if s.strip()]',
        'splits = [s.strip() for s in spec.split(",")[:1] if s.strip()]',
        (SPLITS,),
        "eval.split='a, b' evaluates a only",
    ),
    # 5: model semantics (the streaming model's lookahead)
    Mutation(
        "row_conv_looks_back",
        "ds2_jax/model.py",
        "padding=((0, self.context),),",
        "padding=((self.context, 0),),",
        LOOKAHEAD,
        "row convolution sees t - context .. t instead of t .. t + context",
    ),
    Mutation(
        "row_conv_centered",
        "ds2_jax/model.py",
        "padding=((0, self.context),),",
        "padding=((self.context // 2, self.context - self.context // 2),),",
        LOOKAHEAD,
        "row convolution centred on t (half the lookahead, and frames from the past)",
    ),
    Mutation(
        "row_conv_one_frame_short",
        "ds2_jax/model.py",
        "kernel_size=(self.context + 1,),\n            padding=((0, self.context),),",
        "kernel_size=(self.context,),\n            padding=((0, self.context - 1),),",
        LOOKAHEAD,
        "row convolution sees t .. t + context - 1",
    ),
    Mutation(
        "row_conv_context_off_by_one",
        "ds2_jax/model.py",
        "x = RowConv(cfg.row_conv_context, cfg.compute_dtype)(x, lengths)",
        "x = RowConv(cfg.row_conv_context - 1, cfg.compute_dtype)(x, lengths)",
        LOOKAHEAD,
        "the model's row convolution one frame shorter than model.row_conv_context",
    ),
    # 6: error classification (issue 29 may change these rules: keep the tests in step)
    Mutation(
        "disk_full_without_quota",
        "ds2_jax/errors.py",
        "e.errno in (errno.ENOSPC, errno.EDQUOT)",
        "e.errno in (errno.ENOSPC,)",
        DISK_FULL,
        "a quota error (EDQUOT) is not reported as a full disk",
    ),
    Mutation(
        "disk_full_any_os_error",
        "ds2_jax/errors.py",
        "e.errno in (errno.ENOSPC, errno.EDQUOT)",
        "e.errno is not None",
        DISK_FULL,
        "every OSError with an errno (permissions, read-only) is 'disk full'",
    ),
    Mutation(
        "disk_full_by_text_only",
        "ds2_jax/errors.py",
        "(isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT)) or ",
        "",
        DISK_FULL,
        "a full disk recognized by its message only (an OSError with another wording is missed)",
    ),
    Mutation(
        "disk_full_wrapped_quota_missed",
        "ds2_jax/errors.py",
        ' "Disk quota exceeded",',
        "",
        DISK_FULL,
        "a quota error wrapped by tensorstore (text only) is not a full disk",
    ),
    Mutation(
        "metrics_disk_full_enospc_only",
        "ds2_jax/metrics.py",
        "if not errors.is_disk_full(e):",
        "if e.errno != 28:  # ENOSPC",
        DISK_FULL,
        "a metrics write over quota is not explained as a full disk",
    ),
    Mutation(
        "checkpoint_disk_full_enospc_only",
        "ds2_jax/checkpoint.py",
        "full = errors.is_disk_full(err)",
        "full = getattr(err, 'errno', None) == 28  # ENOSPC",
        DISK_FULL,
        "a checkpoint write over quota is a CheckpointError, not DiskFull",
    ),
    # 8: randomness (per step, repeated on resume) and statistics (valid frames only)
    Mutation(
        "augment_same_every_step",
        "ds2_jax/train.py",
        "    rng = jax.random.fold_in(rng, state.step)\n",
        "",
        (DRAWS,),
        "SpecAugment draws the same masks at every step",
    ),
    Mutation(
        "augment_same_on_every_device",
        "ds2_jax/train.py",
        "        rng = jax.random.fold_in(rng, jax.lax.axis_index(axis_name))\n",
        "        pass\n",
        (DRAWS,),
        "under pmap every device draws the same SpecAugment masks for its rows",
    ),
    Mutation(
        "augment_reseeded_on_resume",
        "ds2_jax/train.py",
        "state, step_rng = par.put_replicated(state), par.put_replicated(step_rng)",
        "state, step_rng = par.put_replicated(state), par.put_replicated(jax.random.fold_in(step_rng, state.step))",
        (RESUME,),
        "a resumed run draws other SpecAugment masks for the steps it repeats",
    ),
    Mutation(
        "feature_stats_count_padding",
        "ds2_jax/features.py",
        "spec = np.asarray(spectrogram(padded[None]), np.float64)[0, :frames]",
        "spec = np.asarray(spectrogram(padded[None]), np.float64)[0]",
        (FEATURE_STATS,),
        "feature mean/std include the frames of the padding to pad_to samples",
    ),
    Mutation(
        "rnn_bn_counts_padding",
        "ds2_jax/model.py",
        "        mask = time_mask(lengths, x.shape[1])\n",
        "        mask = jnp.ones(x.shape[:2], bool)\n",
        (PADDING, *BN),
        "the RNN input projection's batch norm counts padded frames",
    ),
    Mutation(
        "conv_bn_counts_padding",
        "ds2_jax/model.py",
        "x = _batch_norm(self.cfg, self.axis_name)(x, time_mask(lengths, x.shape[1]), train)",
        "x = _batch_norm(self.cfg, self.axis_name)(x, jnp.ones(x.shape[:2], bool), train)",
        (PADDING, *BN),
        "the conv blocks' batch norm counts padded frames",
    ),
    # ---- issue 29's list
    Mutation(
        "metrics_rewritten_in_place",
        "ds2_jax/metrics.py",
        "with files.replacing(path) as f:",
        'with open(path, "w") as f:',
        ("tests/test_faults.py::test_rewriting_metrics_on_resume_is_atomic_a_kill_midway_keeps_the_history",),
        "a resume rewrites metrics.jsonl in place: a kill midway leaves it empty",
    ),
    Mutation(
        "unfinished_folder_to_orbax",
        "ds2_jax/checkpoint.py",
        "if (missing := unfinished(mgr, step)) is not None:",
        "if False:",
        ("tests/test_faults.py::test_an_unfinished_step_folder_is_set_aside_and_good_checkpoints_restore",),
        "an empty step folder is handed to orbax, whose failure makes every good checkpoint 'damaged'",
    ),
    Mutation(
        "torn_config_json_unexplained",
        "ds2_jax/workdir_config.py",
        "    except json.JSONDecodeError as e:\n        key",
        "    except KeyError as e:\n        key",
        ("tests/test_faults.py::test_a_torn_or_hand_edited_config_json_names_the_file_and_the_key",),
        "a torn config.json is a bare JSONDecodeError naming neither the file nor the key",
    ),
    Mutation(
        "config_json_written_in_place",
        "ds2_jax/workdir_config.py",
        "files.write_text(os.path.join(workdir, layout.CONFIG), json.dumps(settings.to_dict(config), indent=2))",
        'open(os.path.join(workdir, layout.CONFIG), "w").write(json.dumps(settings.to_dict(config), indent=2))',
        ("tests/test_faults.py::test_config_json_is_written_atomically",),
        "config.json rewritten in place: a kill mid-write leaves it torn",
    ),
    Mutation(
        "resume_shape_change_unchecked",
        "ds2_jax/train.py",
        "        workdir_config.refuse_fixed_changes(config, workdir)\n",
        "        pass\n",
        ("tests/test_faults.py::test_a_resume_refuses_another_model_shape_naming_the_keys_and_moves_nothing",),
        "a resume with another model shape calls every checkpoint damaged (and moves them aside)",
    ),
    Mutation(
        "resume_changes_forgotten",
        "ds2_jax/workdir_config.py",
        '        current.update({k: after for k, (_, after) in r["changes"].items()})',
        "        pass",
        ("tests/test_faults.py::test_a_resume_with_changed_settings_logs_and_records_them_keeping_config_json",),
        "a resume compares with the first config.json only: a change is recorded again on every resume",
    ),
    Mutation(
        "save_error_names_the_next_step",
        "ds2_jax/checkpoint.py",
        "    step = failed_step(directory, err) or step\n",
        "",
        ("tests/test_faults.py::test_the_failing_step_is_read_off_the_error",),
        "disk full during an asynchronous save names the next checkpoint, not the one that failed",
    ),
    Mutation(
        "orbax_tracebacks_on_the_terminal",
        "ds2_jax/errors.py",
        "    logger.addFilter(keep)\n",
        "",
        ("tests/test_faults.py::test_orbax_background_errors_go_to_error_log_not_the_terminal",),
        "orbax's background threads print hundreds of tracebacks before the one-line error",
    ),
    Mutation(
        "disk_full_on_resource_exhausted",
        "ds2_jax/errors.py",
        "or any(t in str(e) for t in DISK_FULL_TEXT)",
        'or "RESOURCE_EXHAUSTED" in str(e) or any(t in str(e) for t in DISK_FULL_TEXT)',
        ("tests/test_faults.py::test_out_of_memory_and_disk_full_have_one_rule_each_and_print_their_own_line",),
        "device out of memory reads 'error: disk full'",
    ),
    Mutation(
        "absurd_batch_reaches_numpy",
        "ds2_jax/train.py",
        "    memory.check_host_memory(\n        config,\n        sharding.local_batch,",
        "    (lambda *a: None)(\n        config,\n        sharding.local_batch,",
        ("tests/test_faults.py::test_an_absurd_batch_is_refused_before_numpy_allocates_naming_per_device_batch_size",),
        "per_device_batch_size=100000000 dies in numpy ('Unable to allocate 23 TiB') after minutes",
    ),
    Mutation(
        "steps_in_flight_unbounded",
        "ds2_jax/reporting.py",
        "            resilience.wait_ready(self.pending[-1 - most])\n",
        "            pass\n",
        ("tests/test_faults.py::test_a_stop_signal_checkpoints_within_two_steps_of_the_device",),
        "the loop queues steps without bound: a stop waits for all of them (20 minutes on a slow device)",
    ),
    Mutation(
        "second_signal_waits",
        "ds2_jax/resilience.py",
        "        os._exit(128 + signum)\n",
        "        raise KeyboardInterrupt\n",
        ("tests/test_faults.py::test_a_second_signal_abandons_the_wait_at_once_with_a_clear_line",),
        "a second Ctrl-C raises inside the loop, which still waits for the in-flight checkpoint",
    ),
    Mutation(
        "eval_batches_no_progress",
        "ds2_jax/evaluation.py",
        "            if on_batch is not None:\n                on_batch()\n",
        "",
        ("tests/test_faults.py::test_the_watchdog_counts_compiles_evals_and_saves_as_progress",),
        "an eval longer than step_timeout_s reads as a hang: the watchdog ends a healthy run (exit 3)",
    ),
    Mutation(
        "watchdog_ignores_suspension",
        "ds2_jax/resilience.py",
        "            if self._suspended:\n                continue\n",
        "",
        ("tests/test_faults.py::test_the_watchdog_does_not_fire_while_suspended_and_fires_after",),
        "the first compile or a checkpoint save longer than step_timeout_s trips the watchdog",
    ),
    Mutation(
        "eval_split_checked_late",
        "ds2_jax/train.py",
        "    if config.eval_every_steps:\n        source.check_eval_split(",
        "    if False:\n        source.check_eval_split(",
        ("tests/test_faults.py::test_a_missing_eval_split_is_found_before_training",),
        "a missing dataset.eval_split is found at the first eval, thousands of steps in",
    ),
    Mutation(
        "eval_name_ignores_lm_settings",
        "ds2_jax/evaluation.py",
        'tag += f"-lm-{_stem(cfg.lm_path)}-a{beam.alpha:g}-b{beam.beta:g}"',
        'tag += "-lm"',
        ("tests/test_faults.py::test_eval_result_names_tell_every_decoder_apart_and_are_written_atomically",),
        "evals with other LMs or alpha/beta write the same eval-...-beam32-lm.json: the first is lost",
    ),
    Mutation(
        "fingerprint_sizes_only",
        "ds2_jax/datasets/build.py",
        '"content_fingerprint": hashlib.sha256(sizes + texts.digest()).hexdigest()[:16],',
        '"content_fingerprint": hashlib.sha256(sizes).hexdigest()[:16],',
        ("tests/test_faults.py::test_the_prepared_data_fingerprint_sees_a_same_size_transcript_edit",),
        "a same-size transcript edit passes the prepared data's check: training reads the old text",
    ),
    Mutation(
        "transcribe_whole_files",
        "ds2_jax/infer/engine.py",
        "        if num_samples <= window:",
        "        if True:",
        ("tests/test_faults.py::test_long_audio_is_transcribed_in_windows_with_memory_bounded_by_the_window",),
        "a long file runs in one forward pass: memory grows with its length (a 10-minute file aborted)",
    ),
    Mutation(
        "read_long_file_whole",
        "ds2_jax/audio.py",
        "            if declared > block:",
        "            if False:",
        ("tests/test_transcribe.py::test_a_long_file_is_read_block_by_block_like_in_one_piece",),
        "a long file is read whole as float32 channels (an hour of 44.1 kHz stereo: 1.3 GB)",
    ),
    Mutation(
        "memory_estimate_without_activations",
        "ds2_jax/memory.py",
        "        per_row=residual_per_row + staged_batches * batch_per_row,",
        "        per_row=staged_batches * batch_per_row,",
        ("tests/test_memory.py",),
        "the estimate counts only the input batches, not what the backward keeps: a batch 10x too large compiles",
    ),
    Mutation(
        "memory_not_checked",
        "ds2_jax/train.py",
        '    log.info("%s", memory.check(est, config.per_device_batch_size, memory.device_limit(par.devices[0])))\n',
        "",
        ("tests/test_memory.py::test_training_refuses_before_compiling",),
        "the loop never checks the estimate: an oversized batch is silent for minutes, then fails to allocate",
    ),
    # ---- issue 38: your own speech
    Mutation(
        "manifest_duplicates_kept",
        "ds2_jax/datasets/manifest.py",
        "        if e.id in seen:",
        "        if False:",
        ("tests/test_manifest.py::test_every_bad_line_is_a_counted_skip_naming_its_file_and_line",),
        "a duplicated id is written twice (tfds's duplicate-key error, or one utterance weighted double)",
    ),
    Mutation(
        "normalize_without_nfc",
        "ds2_jax/text.py",
        '    text = unicodedata.normalize("NFC", text.replace("\\ufeff", ""))',
        '    text = text.replace("\\ufeff", "")',
        ("tests/test_manifest.py::test_normalize_is_unicode_aware_and_settable",),
        "decomposed accents (NFD) stay two code points: one letter, two labels, and an alphabet of combining marks",
    ),
    Mutation(
        "alphabet_from_every_split",
        "ds2_jax/datasets/manifest.py",
        "    present = [s for s in wanted if s in manifests]",
        "    present = list(manifests)",
        ("tests/test_manifest.py::test_an_asked_split_without_a_manifest_is_one_error_line",),
        "the alphabet is derived from every split, the test transcripts included",
    ),
    Mutation(
        "eval_alphabet_unchecked",
        "ds2_jax/evaluation.py",
        "    check_alphabet(config, source, workdir)\n",
        "",
        ("tests/test_manifest.py::test_train_eval_and_transcribe_on_common_voice_any_split_names",),
        "an eval on data of another alphabet scores label ids spelled in the wrong symbols",
    ),
    Mutation(
        "shards_in_manifest_order",
        "ds2_jax/datasets/manifest.py",
        "            ordered = [todos[split][i] for i in shards.tfds_order([t[1] for t in todos[split]], split)]",
        "            ordered = todos[split]",
        ("tests/test_manifest.py::test_one_and_two_processes_write_the_same_shards_in_tfds_order",),
        "the shards hold the manifest's order, not tfds's: the prepared data differs from tfds's own build",
    ),
    Mutation(
        "alphabet_keeps_rare_characters",
        "ds2_jax/datasets/manifest.py",
        "if n < options.alphabet_min_count}",
        "if n < 1}",
        ("tests/test_manifest.py::test_a_derived_alphabet_leaves_out_characters_rarer_than_the_minimum_count",),
        "a one-off character of the train split becomes a label (dataset.alphabet_min_count ignored)",
    ),
    Mutation(
        "record_varint_one_byte_short",
        "ds2_jax/datasets/shards.py",
        "    while n > 0x7F:",
        "    while n > 0xFF:",
        ("tests/test_manifest.py::test_a_workers_records_are_tfds_own_serialization",),
        "the hand-written tf.Example misencodes lengths of 128-255: records tfds cannot parse",
    ),
    Mutation(
        "failed_file_ends_the_build",
        "ds2_jax/datasets/shards.py",
        "            except Exception as e:  # noqa: BLE001 - one file's failure is its skip",
        "            except OSError as e:",
        ("tests/test_manifest.py::test_a_file_whose_work_raises_in_a_worker_is_a_counted_skip",),
        "one file whose work raises ends the whole build instead of being a counted skip",
    ),
    # ---- issue 39: fine-tuning, the best checkpoints, waveform augmentation
    Mutation(
        "finetune_fresh_normalization",
        "ds2_jax/finetune.py",
        "        feature_mean=source.feature_mean,",
        "        feature_mean=fresh.feature_mean,",
        (FT + "test_the_first_state_is_the_sources_parameters_statistics_and_normalization_at_step_0",),
        "a fine-tune normalizes the features by its own data's statistics, not those the source learned with",
    ),
    Mutation(
        "finetune_output_refused",
        "ds2_jax/finetune.py",
        '    reinit = [p for p in differing if p.split("/")[1] == OUTPUT_LAYER]',
        "    reinit = []",
        (FT + "test_an_output_layer_of_another_size_starts_afresh_and_the_rest_comes_from_the_source",),
        "another alphabet's output layer is refused like any other shape change",
    ),
    Mutation(
        "finetune_reinitializes_on_rerun",
        "ds2_jax/train.py",
        "    if restored is not None:\n        if config.init_from:",
        "    if restored is not None and not config.init_from:\n        if config.init_from:",
        (FT + "test_a_rerun_resumes_the_fine_tunes_own_checkpoints_and_config_json_records_the_source",),
        "rerunning a fine-tune starts again from the source instead of resuming its own checkpoints",
    ),
    Mutation(
        "freeze_ignored",
        "ds2_jax/state.py",
        "    if not frozen:\n        return adam",
        "    return adam",
        (FT + "test_frozen_parts_keep_the_sources_values_and_the_rest_trains",),
        "config.freeze changes nothing: the frozen parts train",
    ),
    Mutation(
        "best_keeps_the_worst",
        "ds2_jax/checkpoint.py",
        "pp.BestN(get_metric_fn=_wer, reverse=True,",
        "pp.BestN(get_metric_fn=_wer, reverse=False,",
        ("tests/test_best_checkpoint.py::test_the_lowest_wer_checkpoints_are_kept_beside_the_newest_across_a_restart",),
        "keep_best keeps the highest WERs",
    ),
    Mutation(
        "best_not_saved_at_eval",
        "ds2_jax/train.py",
        "    if not config.keep_best_checkpoints:\n        return None\n",
        "    if True:\n        return None\n",
        ("tests/test_best_checkpoint.py::test_eval_of_best_scores_the_step_with_the_lowest_in_training_wer",),
        "no checkpoint is saved with its eval's WER: nothing is ever 'best'",
    ),
    Mutation(
        "best_dropped_on_resume_without_keep_best",
        "ds2_jax/checkpoint.py",
        "policy = pp.AnyPreservationPolicy([pp.LatestN(keep), pp.CustomSteps(kept)])",
        "policy = pp.LatestN(keep)",
        ("tests/test_best_checkpoint.py::test_a_resume_that_keeps_no_best_deletes_none_of_those_kept_before",),
        "a resume with keep_best_checkpoints=0 deletes the best checkpoints an earlier run kept",
    ),
    Mutation(
        "tune_lm_best_is_latest",
        "ds2_jax/tools/tune_lm.py",
        "                FLAGS.max_utterances,\n                step,\n",
        "                FLAGS.max_utterances,\n                None,\n",
        ("tests/test_best_checkpoint.py::test_eval_of_best_scores_the_step_with_the_lowest_in_training_wer",),
        "tune_lm --step=best tunes the latest checkpoint",
    ),
    Mutation(
        "waveform_row_per_process",
        "ds2_jax/pipeline/tfds_source.py",
        "audio = [self.augment(a, step, s.start + i) for i, a in enumerate(audio)]",
        "audio = [self.augment(a, step, i) for i, a in enumerate(audio)]",
        (AUG_SHARES,),
        "augmentation drawn by the row within the process: 2 processes augment differently from 1",
    ),
    Mutation(
        "waveform_same_every_step",
        "ds2_jax/pipeline/augment.py",
        "rng = np.random.default_rng([self.seed, SALT, int(step), int(row)])",
        "rng = np.random.default_rng([self.seed, SALT, int(row)])",
        ("tests/test_augment.py::test_each_utterance_is_a_function_of_seed_step_and_row",),
        "every step draws the same augmentation for a row",
    ),
    Mutation(
        "buckets_not_stretched",
        "ds2_jax/pipeline/plan.py",
        "    return int(samples) if stretch == 1.0 else int(np.ceil(samples * stretch)) + 1",
        "    return int(samples)",
        (AUG_SHARES,),
        "buckets padded for the original lengths: a slowed-down utterance does not fit its batch",
    ),
    # ---- issue 40, the last items: a checkpoint being written, a lost peer, Ctrl-C in the compile, a full disk
    Mutation(
        "saving_folder_needs_a_time",
        "ds2_jax/checkpoint.py",
        'SAVING = re.compile(r"(\\d+)\\.orbax-checkpoint-tmp")',
        'SAVING = re.compile(r"(\\d+)\\.orbax-checkpoint-tmp-")',
        (LIVE,),
        "only older orbax's tmp-<time> folders are seen: a save under way is taken for no checkpoint",
    ),
    Mutation(
        "wait_without_reload",
        "ds2_jax/checkpoint.py",
        "        time.sleep(poll_s)\n        mgr.reload()\n",
        "        time.sleep(poll_s)\n",
        (LIVE,),
        "the wait never rereads the steps: the checkpoint it waited for is not used",
    ),
    Mutation(
        "no_wait",
        "ds2_jax/checkpoint.py",
        "SAVE_WAIT_S = 60.0",
        "SAVE_WAIT_S = 0.0",
        (LIVE,),
        "eval/transcribe never wait for a save under way",
    ),
    Mutation(
        "unfinished_called_damaged",
        "ds2_jax/checkpoint.py",
        '    if not move_damaged and all(reason.startswith("never finished") for _, reason in failures):',
        "    if False:",
        (LIVE,),
        "only unfinished checkpoints: 'damaged, move them away'",
    ),
    Mutation(
        "peer_lost_not_3",
        "ds2_jax/errors.py",
        "    exit_code = 3\n",
        "    exit_code = 1\n",
        (ERR + "test_each_project_error_ends_a_command_with_one_error_line",),
        "a dead peer exits 1, not the documented 3 a supervisor restarts on",
    ),
    Mutation(
        "peer_lost_any_gloo_error",
        "ds2_jax/errors.py",
        'PEER_LOST_TEXT = (\n    "Connection reset by peer",',
        'PEER_LOST_TEXT = (\n    "Gloo",\n    "Connection reset by peer",',
        (ERR + "test_a_lost_peer_is_recognized_by_the_collectives_words_only",),
        "any gloo error (a bug) is called a lost peer",
    ),
    Mutation(
        "half_made_keeps_tensorboard_runs",
        "ds2_jax/resilience.py",
        'SCAFFOLDING_PREFIXES = ("events.out.tfevents.",)',
        'SCAFFOLDING_PREFIXES = ("events.out",)',
        ("tests/test_cli.py::test_cleanup_after_a_failure_removes_only_a_workdir_without_a_result",),
        "a clean-up deletes a workdir whose only result is its TensorBoard events",
    ),
    Mutation(
        "build_disk_full_names_cwd",
        "ds2_jax/datasets/build.py",
        'f"building {name} in {root} from {manual_dir}",\n                    root,',
        'f"building {name} in {os.getcwd()} from {manual_dir}",\n                    os.getcwd(),',
        ("tests/test_datasets.py::test_a_full_disk_during_the_build_is_the_projects_disk_full_line",),
        "the build's disk-full line names the current directory, not data_dir",
    ),
    Mutation(
        "unfinished_first_marker_only",
        "ds2_jax/checkpoint.py",
        "    for marker in COMMIT_MARKERS:\n",
        "    for marker in COMMIT_MARKERS[:1]:\n",
        (LIVE,),
        "a step folder written in place (metadata first, commit marker last) taken for a finished one",
    ),
    Mutation(
        "build_any_oserror_is_disk_full",
        "ds2_jax/datasets/build.py",
        "            if errors.is_disk_full(e):  # tfds removed",
        "            if isinstance(e, OSError):  # tfds removed",
        ("tests/test_datasets.py::test_a_truncated_archive_names_itself_and_costs_only_its_own_split",),
        "any OSError of the build (a truncated archive) called a full disk",
    ),
    Mutation(
        "damaged_archive_stops_the_build",
        "ds2_jax/datasets/librispeech_local.py",
        "                    if archive_error is None:\n                        raise",
        "                    if True:\n                        raise",
        ("tests/test_datasets.py::test_a_truncated_archive_names_itself_and_costs_only_its_own_split",),
        "a damaged archive stops the build: the splits after it are not built",
    ),
    Mutation(
        "kept_split_taken_whatever_its_files",
        "ds2_jax/datasets/kept_splits.py",
        '    if meta.get("key") != split_key:',
        "    if False:",
        (
            "tests/test_datasets.py::test_a_kept_split_is_built_again_when_its_files_change_and_any_failure_keeps_the_finished_ones",
        ),
        "a split kept from a failed build is taken back after its files changed",
    ),
    Mutation(
        "timestamps_without_the_delay",
        "ds2_jax/transcribe.py",
        "        transcriber.emission_delay = timing.delay_of_workdir(args.workdir, transcriber)",
        "        timing.delay_of_workdir(args.workdir, transcriber)",
        ("tests/test_word_timings.py::test_every_words_start_is_within_one_output_frame_of_the_truth",),
        "transcribe --timestamps measures the model's emission delay but prints the uncorrected times",
    ),
    Mutation(
        "delay_from_every_word",
        "ds2_jax/infer/delay.py",
        "    return words[0].start - onset if words else None",
        "    return words[-1].start - onset if words else None",
        ("tests/test_timing.py::test_delay_is_the_median_lag_of_first_words_after_a_lead_in_of_silence",),
        "the delay taken from the last word's start against the speech onset, not the first word's",
    ),
    Mutation(
        "stream_forgets_rnn_state",
        "ds2_jax/infer/streaming.py",
        "self.carry, ys = _rnn_layer(",
        "_, ys = _rnn_layer(",
        ("tests/test_streaming.py::test_chunks_of_any_size_give_the_whole_files_log_probs",),
        "each chunk's recurrence starts from zero: the RNN state is not carried",
    ),
    Mutation(
        "stream_no_right_padding",
        "ds2_jax/infer/streaming.py",
        "self.buffer.append(np.zeros((p, *frames.shape[1:]), np.float32))",
        "self.buffer.append(np.zeros((0, *frames.shape[1:]), np.float32))",
        ("tests/test_streaming.py::test_chunks_of_any_size_give_the_whole_files_log_probs",),
        "finish() leaves out the conv's right padding: the last frames never come",
    ),
    Mutation(
        "word_start_one_frame_late",
        "ds2_jax/decoding.py",
        '            words.append(_timed("".join(chars), first, last, frame_seconds, delay))\n            chars = []',
        '            words.append(_timed("".join(chars), first + 1, last, frame_seconds, delay))\n'
        "            chars = []",
        ("tests/test_decoding.py::test_word_timings_span_each_words_frames_and_spell_greedys_words",),
        "a word closed by a space starts one frame late",
    ),
    Mutation(
        "export_without_feature_stats",
        "ds2_jax/export.py",
        "features.normalize(spectrogram, frames, state.feature_mean, state.feature_std)",
        "features.normalize(spectrogram, frames, 0.0, 1.0)",
        ("tests/test_export.py::test_onnx_log_probs_and_greedy_texts_match_the_jax_path",),
        "the exported graph leaves out the checkpoint's feature normalization",
    ),
    # ---- inference RTFx on a GPU (benchmarks.export_rtf): the figure, its audio, its decoder, its files
    Mutation(
        "rtfx_over_warmup",
        "benchmarks/export_rtf.py",
        '"rtfx": audio_s / t["median_s"],',
        '"rtfx": audio_s / t["first_pass_s"],',
        (EXPORT_RTF,),
        "RTFx taken from the warm-up pass (the JAX compile counted) instead of the median timed pass",
    ),
    Mutation(
        "rtfx_audio_per_distinct_file",
        "benchmarks/export_rtf.py",
        "[audio_lib.read(f, rate) for f in files]",
        "[audio_lib.read(f, rate) for f in dict.fromkeys(files)]",
        (EXPORT_RTF,),
        "a file named twice counted once in the audio seconds (RTFx too low)",
    ),
    Mutation(
        "rtfx_beam_row_greedy",
        "benchmarks/export_rtf.py",
        "settings.Decoding(beam_width=fv.beam_width, lm_path=fv.lm)",
        "settings.Decoding(beam_width=fv.beam_width)",
        (EXPORT_RTF,),
        "the beam + LM rows search without the LM",
    ),
    Mutation(
        "rtfx_first_batch_only",
        "benchmarks/export_rtf.py",
        "for first in range(0, len(files), batch_size):",
        "for first in range(0, batch_size, batch_size):",
        (EXPORT_RTF,),
        "a pass transcribes the first batch of files only",
    ),
    # ---- issue 52's house fixes: each keeps a structure rule from coming back
    Mutation(
        "datasets_import_up",
        "ds2_jax/datasets/build.py",
        "from ds2_jax import errors, files\n",
        "from ds2_jax import errors, files\nfrom ds2_jax.pipeline.source import DataSettings  # noqa: F401\n",
        ("tests/test_architecture.py::test_the_dataset_builders_never_reach_up_into_pipeline_model_or_training",),
        "the dataset builder imports the input pipeline again (an import upward)",
    ),
    Mutation(
        "layout_spelled_again",
        "ds2_jax/checkpoint.py",
        "os.path.join(workdir, layout.CHECKPOINTS)",
        'os.path.join(workdir, "checkpoints")',
        ("tests/test_architecture.py::test_the_workdir_layout_is_spelled_in_one_module",),
        "a module spells a workdir file name of its own again (the layout in two places)",
    ),
    Mutation(
        "role_fixed_dropped",
        "ds2_jax/settings.py",
        'rnn_size: int = setting(2048, "Hidden units per direction.", role=FIXED)',
        'rnn_size: int = setting(2048, "Hidden units per direction.")',
        ("tests/test_settings.py::test_every_setting_has_a_role_on_its_field_and_the_roles_are_the_old_lists",),
        "a model shape setting loses its fixed role: a resume that changes it is recorded, not refused",
    ),
    Mutation(
        "eval_role_read_as_resume_role",
        "ds2_jax/workdir_config.py",
        'return roles[key].eval == "given"',
        'return roles[key].resume == "ignored"',
        (
            "tests/test_settings.py::"
            "test_an_evaluation_takes_what_its_role_says_from_config_json_and_a_removed_key_follows_its_section",
        ),
        "an evaluation reads the resume role for what it takes from --config",
    ),
    Mutation(
        "source_checked_in_every_worker",
        "ds2_jax/pipeline/tfds_source.py",
        "elif not data.source_checked:",
        "else:",
        ("tests/test_tfds_source.py::test_input_workers_open_the_prepared_data_without_checking_its_source_again",),
        "every input worker walks and hashes the manual dir again to check the prepared data",
    ),
    Mutation(
        "source_never_checked_by_a_copy",
        "ds2_jax/pipeline/loader.py",
        "checked = self._source is not None or self.data.source_checked",
        "checked = True",
        ("tests/test_tfds_source.py::test_input_workers_open_the_prepared_data_without_checking_its_source_again",),
        "a batch maker whose process opened no source takes the prepared data unchecked",
    ),
    Mutation(
        "build_flags_not_read",
        "ds2_jax/datasets/build.py",
        'sys_argv=["ds2-build", *argv],',
        'sys_argv=["ds2-build", *argv[:1]],',
        ("tests/test_manifest.py::test_the_build_command_reads_the_settings_a_training_run_reads",),
        "ds2-build reads only its first --config flag: the rest never reach the build",
    ),
    Mutation(
        "build_spectrogram_default",
        "ds2_jax/datasets/build.py",
        "return manifest.Options.of(config.dataset, config.features.spectrogram)",
        "return manifest.Options.of(config.dataset, type(config.features.spectrogram)())",
        ("tests/test_manifest.py::test_the_build_command_reads_the_settings_a_training_run_reads",),
        "ds2-build resamples to the default rate whatever --config.features.sample_rate says",
    ),
    Mutation(
        "build_config_file_ignored",
        "ds2_jax/datasets/build.py",
        '            path = a.split("=", 1)[1]\n',
        "            pass\n",
        ("tests/test_manifest.py::test_the_build_command_reads_a_training_config_file_and_its_overrides",),
        "ds2-build --config=FILE builds the defaults, not what the file's training run reads",
    ),
    # ---- issue 52: the two classes that survived two audits (the order of an epoch, per-split results)
    Mutation(
        "epoch_order_repeats_after_the_second",
        "ds2_jax/pipeline/tfds_source.py",
        "bucket, members = self._plan(epoch)[pos]",
        "bucket, members = self._plan(min(epoch, 1))[pos]",
        (EPOCH_ORDER,),
        "every epoch after the second repeats the second's order",
    ),
    Mutation(
        "epoch_order_depends_on_history",
        "ds2_jax/pipeline/tfds_source.py",
        "self.seed, epoch, self.buckets, self.sharding.global_batch, self.sortagrad",
        "self.seed + len(self._plans), epoch, self.buckets, self.sharding.global_batch, self.sortagrad",
        (EPOCH_ORDER,),
        "an epoch's order depends on the epochs planned before it: a resumed run reads another order",
    ),
    Mutation(
        "epoch_same_batches_reshuffled",
        "ds2_jax/pipeline/plan.py",
        "members = np.random.default_rng([seed, epoch, b]).permutation(members)",
        "members = np.random.default_rng([seed, b]).permutation(members)",
        (EPOCH_ORDER,),
        "every epoch cuts the same batches (only their order changes)",
    ),
    Mutation(
        "epoch_draws_with_replacement",
        "ds2_jax/pipeline/plan.py",
        "members = np.random.default_rng([seed, epoch, b]).permutation(members)",
        "members = np.random.default_rng([seed, epoch, b]).choice(members, len(members))",
        (EPOCH_ORDER,),
        "an epoch draws utterances with replacement: some twice, some never",
    ),
    Mutation(
        "eval_reads_the_training_eval_split",
        "ds2_jax/pipeline/tfds_source.py",
        "(name,) = [self._resolve(s) for s in split_names(split or self.eval_split)]",
        "(name,) = [self._resolve(s) for s in split_names(self.eval_split or split)]",
        (OWN_SPLIT,),
        "every split named to --mode=eval is scored on dataset.eval_split's utterances",
    ),
    Mutation(
        "eval_labels_of_the_training_eval_split",
        "ds2_jax/pipeline/tfds_source.py",
        '"labels": idx.labels[r],',
        '"labels": self._index(self._resolve(split_names(self.eval_split)[0])).labels[r],',
        (OWN_SPLIT,),
        "an eval split's audio scored against dataset.eval_split's transcripts of the same record numbers",
    ),
    # ---- issue 49: own data never silently wrong
    Mutation(
        "float_audio_read_as_int16",
        "ds2_jax/audio.py",
        'dtype = "int16" if f.subtype in INT_SUBTYPES else "float32"',
        'dtype = "int16"',
        (AUDIO + "test_every_lossless_subtype_is_stored_at_the_same_scale",),
        "float and double files read as int16 by libsndfile (unscaled: silence)",
    ),
    Mutation(
        "clipped_samples_not_counted",
        "ds2_jax/audio.py",
        "clipped = int(np.count_nonzero(np.abs(audio) > 1.0))",
        "clipped = 0",
        (AUDIO + "test_floats_beyond_full_scale_are_clipped_and_counted",),
        "floats beyond [-1, 1] clipped without a count",
    ),
    Mutation(
        "cut_header_not_checked",
        "ds2_jax/audio.py",
        "if int(actual) < int(declared) < UNKNOWN_LENGTH:",
        "if False:",
        (AUDIO + "test_a_file_cut_short_is_a_counted_skip",),
        "a WAV/W64 chunk longer than the file is read as the audio there is",
    ),
    Mutation(
        "decoded_frames_not_checked",
        "ds2_jax/audio.py",
        "if 0 < audio.shape[0] < declared:",
        "if False:",
        (AUDIO + "test_a_file_cut_short_is_a_counted_skip",),
        "an MP3 decoding fewer frames than its Xing header declares is kept",
    ),
    Mutation(
        "manifest_bytes_replaced",
        "ds2_jax/text.py",
        'line = raw.decode("utf-8-sig" if number == 1 else "utf-8")',
        'line = raw.decode("utf-8-sig" if number == 1 else "utf-8", errors="replace")',
        ("tests/test_manifest.py::test_a_manifest_in_another_encoding_is_an_error_naming_file_line_and_the_fix",),
        "a manifest's bytes that are not UTF-8 replaced (Latin-1 'señor' trains on 'se or')",
    ),
    Mutation(
        "json_array_as_lines",
        "ds2_jax/datasets/manifest.py",
        'if first.lstrip().startswith("["):',
        "if False:",
        ("tests/test_manifest.py::test_a_json_array_manifest_is_read_as_its_objects_with_their_lines",),
        "a train.json that is one JSON array read as JSON lines (every line a bad line)",
    ),
    Mutation(
        "no_transcripts_blamed_on_min_count",
        "ds2_jax/datasets/manifest.py",
        "if not counts:  # no transcript at all",
        "if False:  # no transcript at all",
        ("tests/test_manifest.py::test_a_broken_json_array_or_a_manifest_without_transcripts_names_its_cause",),
        "a manifest without one readable line answered with advice to lower alphabet_min_count",
    ),
    Mutation(
        "validated_only_without_hint",
        "ds2_jax/datasets/manifest.py",
        "if side and not options.manifest_splits:",
        "if False:",
        ("tests/test_manifest.py::test_a_common_voice_folder_with_only_validated_tsv_gets_the_manifest_splits_hint",),
        "a validated.tsv-only Common Voice folder is 'no manifest', without dataset.manifest_splits",
    ),
    # ---- issue 52: make test's time (a training process pays no torch import)
    Mutation(
        "metrics_import_torch",
        "ds2_jax/metrics.py",
        'hide = "torch" not in sys.modules',
        "hide = False",
        ("tests/test_metrics.py::test_the_metric_writer_writes_tensorboard_scalars_without_importing_torch",),
        "every training process imports torch through tensorboardX (seconds of CPU each)",
    ),
    # ---- issue 52, by property: records and fingerprints, field by field
    Mutation(
        "build_record_without_stereo",
        "ds2_jax/datasets/manifest.py",
        '            "stereo": self.stereo,\n',
        "",
        FIELD_BY_FIELD,
        "the build record leaves out dataset.stereo: data built with 'skip' reopens under 'downmix'",
    ),
    Mutation(
        "resume_accepts_a_changed_boolean",
        "ds2_jax/workdir_config.py",
        'fixed = [d for d in _differences(trained, given) if _resume_role(d[0], config) == "fixed"]',
        'fixed = [d for d in _differences(trained, given) if _resume_role(d[0], config) == "fixed" '
        "and not isinstance(d[1], bool)]",
        FIELD_BY_FIELD,
        "a resume that flips a fixed boolean (bidirectional, share_rnn_weights) is not refused",
    ),
    Mutation(
        "fingerprint_without_manifest_text",
        "ds2_jax/datasets/manifest.py",
        "splits[split] = hashlib.sha256(data + audio.encode()).hexdigest()[:16]",
        "splits[split] = hashlib.sha256(audio.encode()).hexdigest()[:16]",
        FIELD_BY_FIELD,
        "a same-size edit of a transcript reopens the data built from the old text",
    ),
    Mutation(
        "audio_files_not_fingerprinted",
        "ds2_jax/datasets/manifest.py",
        'h.update(f"{e.audio}\\0{stat.st_size}\\0{stat.st_mtime_ns}\\n".encode())',
        'h.update(f"{e.audio}\\n".encode())',
        ("tests/test_manifest.py::test_an_edited_replaced_deleted_or_added_audio_file_rebuilds_the_split_it_is_in",),
        "the build's record covers the manifests only: an edited or replaced clip reuses the stale build",
    ),
    Mutation(
        "unchanged_splits_built_again",
        "ds2_jax/datasets/manifest.py",
        "for split in sorted(unchanged & set(manifests) & set(old.keys())):",
        "for split in []:",
        ("tests/test_manifest.py::test_an_edited_replaced_deleted_or_added_audio_file_rebuilds_the_split_it_is_in",),
        "a change rebuilds every split, not the ones it touches",
    ),
    Mutation(
        "noise_contents_unchecked",
        "ds2_jax/pipeline/augment.py",
        "why = why or fault(path)",
        "why = why",
        ("tests/test_augment.py::test_a_non_finite_or_silent_noise_or_rir_recording_is_refused_naming_it",),
        "a noise or RIR recording with NaN samples (or silent) is used: every utterance mixed with it zeroed",
    ),
    Mutation(
        "untrainable_step_logged_as_loss_0",
        "ds2_jax/reporting.py",
        '"loss": None if none_finite or s["loss_count"] == 0 else s["loss_sum"] / s["loss_count"],',
        '"loss": None if none_finite else s["loss_sum"] / max(s["loss_count"], 1.0),',
        ("tests/test_reporting.py::test_an_interval_without_a_trainable_utterance_logs_no_loss_and_says_why",),
        "steps without one trainable utterance logged as loss=0",
    ),
    Mutation(
        "untrainable_not_counted",
        "ds2_jax/train.py",
        '"untrainable": (count == 0).astype(jnp.float32),',
        '"untrainable": jnp.zeros((), jnp.float32),',
        ("tests/test_train_step.py::test_a_step_without_a_trainable_utterance_is_marked_untrainable",),
        "a step without a trainable utterance is not marked, so nothing says it",
    ),
    Mutation(
        "speed_factor_unbounded",
        "ds2_jax/settings.py",
        '"waveform.speed_max": Range(0.5, 2.0, why="a speed factor: beyond half or twice the speed it is no speech"),',
        '"waveform.speed_max": _above(0.0, "a speed factor"),',
        ("tests/test_augment.py::test_a_bad_setting_names_its_key",),
        "waveform.speed_max=40 accepted: every utterance CTC-infeasible",
    ),
    # ---- issue 52, by property: ties made by hand; errors in every shape
    Mutation(
        "best_oldest_of_equals",
        "ds2_jax/checkpoint.py",
        "return [step for step, _ in sorted(scored, key=lambda sm: (_wer(sm[1]), -sm[0]))]",
        "return [step for step, _ in sorted(scored, key=lambda sm: (_wer(sm[1]), sm[0]))]",
        (TIES,),
        "of checkpoints with equal WER and CER, --eval_step=best takes the oldest (orbax keeps the newest)",
    ),
    Mutation(
        "best_ignores_cer",
        "ds2_jax/checkpoint.py",
        "return float(metrics[BEST_METRIC]), float(metrics.get(TIE_METRIC, 0.0))",
        "return float(metrics[BEST_METRIC]), 0.0",
        (TIES,),
        "checkpoints of equal WER are not told apart by CER",
    ),
    Mutation(
        "classifiers_skip_the_cause",
        "ds2_jax/errors.py",
        'todo += [*getattr(e, "exceptions", ()), e.__context__, e.__cause__]',
        'todo += [*getattr(e, "exceptions", ()), e.__context__]',
        SHAPES,
        "a disk-full, out-of-memory or lost-peer error raised as another's cause (raise ... from) is not recognized",
    ),
    Mutation(
        "classifiers_skip_groups",
        "ds2_jax/errors.py",
        'todo += [*getattr(e, "exceptions", ()), e.__context__, e.__cause__]',
        "todo += [e.__context__, e.__cause__]",
        SHAPES,
        "an error inside an exception group is not recognized",
    ),
    Mutation(
        "oom_by_text_only",
        "ds2_jax/errors.py",
        "isinstance(e, MemoryError) or ",
        "",
        SHAPES,
        "a host MemoryError (numpy: 'Unable to allocate ...') is not out of memory",
    ),
    # ---- issue 51: gradient accumulation
    Mutation(
        "accumulate_mean_of_means",
        "ds2_jax/train.py",
        "grads = jax.tree_util.tree_map(lambda g: g / jnp.maximum(count, 1.0), grad_sum)",
        "grads = jax.tree_util.tree_map("
        "lambda g: g / jnp.maximum(count // accumulate_steps * accumulate_steps, 1), grad_sum)",
        (ACC + "test_k_micro_batches_of_b_give_the_update_of_one_batch_of_k_times_b",),
        "each micro-batch weighed as holding the whole-number mean count (its mean of means), not its utterances",
    ),
    Mutation(
        "accumulate_last_micro_batch",
        "ds2_jax/train.py",
        "grad_sum = jax.tree_util.tree_map(jnp.add, grad_sum, grads)",
        "grad_sum = jax.tree_util.tree_map(lambda a, g: g, grad_sum, grads)",
        (ACC + "test_k_micro_batches_of_b_give_the_update_of_one_batch_of_k_times_b",),
        "only the last micro-batch's gradient kept",
    ),
    Mutation(
        "accumulate_rows_across_devices",
        "ds2_jax/train.py",
        "x = x.reshape(devices, k, rows, *x.shape[1:])",
        "x = x.reshape(k, devices, rows, *x.shape[1:]).swapaxes(0, 1)",
        (ACC + "test_micro_batch_k_is_rows_k_b_to_k_b_plus_b_of_each_devices_shard",),
        "jit's micro-batches cut from the global batch in the wrong order (rows of another micro-batch)",
    ),
    Mutation(
        "accumulate_stats_first_only",
        "ds2_jax/train.py",
        "return (new_stats, grad_sum, loss_sum + local_sum, count + micro_count), None",
        "return (stats, grad_sum, loss_sum + local_sum, count + micro_count), None",
        (ACC + "test_batch_norm_running_statistics_are_updated_once_per_micro_batch",),
        "batch-norm running statistics not carried from one micro-batch to the next",
    ),
    Mutation(
        "accumulate_not_in_step",
        "ds2_jax/state.py",
        "accumulate_steps=config.optimizer.accumulate_steps,",
        "accumulate_steps=1,",
        (ACC + "test_the_setting_reaches_the_step_and_the_data",),
        "optimizer.accumulate_steps never reaches the step",
    ),
    # ---- issue 51: weight EMA
    Mutation(
        "ema_no_warmup",
        "ds2_jax/train.py",
        "d = jnp.minimum(decay, (1.0 + updates) / (10.0 + updates)).astype(jnp.float32)",
        "d = jnp.asarray(decay, jnp.float32)",
        (EMA + "test_the_average_starts_at_the_parameters_and_moves_by_its_warmed_up_decay",),
        "the EMA's decay without its warm-up (the average remembers the random start)",
    ),
    Mutation(
        "ema_of_old_params",
        "ds2_jax/train.py",
        "moving_average(state.ema_params, updated.params, ema_decay, state.step)",
        "moving_average(state.ema_params, state.params, ema_decay, state.step)",
        (EMA + "test_the_average_starts_at_the_parameters_and_moves_by_its_warmed_up_decay",),
        "the average moved towards the parameters before the update",
    ),
    Mutation(
        "ema_kept_through_skip",
        "ds2_jax/train.py",
        "ema_params=keep(moving_average(state.ema_params, updated.params, ema_decay, state.step), state.ema_params)",
        "ema_params=moving_average(state.ema_params, updated.params, ema_decay, state.step)",
        (EMA + "test_a_skipped_step_leaves_the_average_where_it_was",),
        "a skipped (non-finite) step still moves the average",
    ),
    Mutation(
        "ema_not_for_eval",
        "ds2_jax/state.py",
        "return state.replace(params=state.ema_params) if ema and state.ema_params is not None else state",
        "return state",
        (EMA + "test_eval_transcribe_and_export_take_the_average_unless_told_not_to",),
        "eval, transcribe and export use the trained weights whatever the flag",
    ),
    Mutation(
        "ema_in_training_eval_raw",
        "ds2_jax/train.py",
        "with_eval_weights(state, config.eval.ema_weights),",
        "state,",
        (EMA + "test_eval_transcribe_and_export_take_the_average_unless_told_not_to",),
        "the in-training eval (and the best checkpoint's rank) scores the trained weights",
    ),
    # ---- issue 52, by property: non-finite state part by part; read-modify-write files; metadata round trips
    Mutation(
        "save_refuses_nan_only",
        "ds2_jax/checkpoint.py",
        "if np.issubdtype(x.dtype, np.inexact) and not np.isfinite(x).all():",
        "if np.issubdtype(x.dtype, np.inexact) and np.isnan(x).any():",
        (NON_FINITE_PARTS,),
        "a checkpoint holding inf (not NaN) is written",
    ),
    Mutation(
        "save_checks_the_parameters_only",
        "ds2_jax/checkpoint.py",
        "for path, leaf in jax.tree_util.tree_leaves_with_path(state):",
        'for path, leaf in jax.tree_util.tree_leaves_with_path(getattr(state, "params", state)):',
        (NON_FINITE_PARTS,),
        "NaN in the optimizer moments, batch-norm or feature statistics is written to the checkpoint",
    ),
    Mutation(
        "timing_table_rewritten",
        "ds2_jax/infer/delay.py",
        "        if os.path.exists(path):\n            with open(path) as f:\n                table = json.load(f)\n",
        "",
        ("tests/test_timing.py::test_two_checkpoints_delays_both_survive_in_timing_json",),
        "each measured delay rewrites timing.json: the other checkpoints' delays are lost",
    ),
    Mutation(
        "export_window_as_two_hops",
        "ds2_jax/infer/onnx_model.py",
        "            window=fc.window,",
        "            window=2 * fc.hop,",
        ("tests/test_timing.py::test_every_export_metadata_field_round_trips_at_non_default_values",),
        "the export records the window as two hops (true at the default 20/10 ms only)",
    ),
    # ---- issue 51: checkpoint averaging
    Mutation(
        "average_keeps_newest_stats",
        "ds2_jax/average.py",
        "batch_stats=mean_of([s.batch_stats for s in states]),",
        "batch_stats=newest.batch_stats,",
        (AVG + "test_the_average_of_two_checkpoints_is_their_arithmetic_mean",),
        "the batch-norm statistics of the newest checkpoint kept beside averaged weights",
    ),
    Mutation(
        "average_first_n",
        "ds2_jax/average.py",
        "return steps[-last:]",
        "return steps[:last]",
        (AVG + "test_the_average_of_two_checkpoints_is_their_arithmetic_mean",),
        "--last=N averages the oldest N checkpoints",
    ),
    Mutation(
        "average_ema_not_averaged",
        "ds2_jax/average.py",
        "ema_params=None if newest.ema_params is None else mean_of([s.ema_params for s in states]),",
        "ema_params=newest.ema_params,",
        (AVG + "test_the_average_of_two_checkpoints_is_their_arithmetic_mean",),
        "the EMA weights (what eval uses) left at the newest checkpoint's",
    ),
    Mutation(
        "average_best_worst_first",
        "ds2_jax/checkpoint.py",
        "return [step for step, _ in sorted(scored, key=lambda sm: (_wer(sm[1]), -sm[0]))]",
        "return [step for step, _ in sorted(scored, key=lambda sm: (_wer(sm[1]), -sm[0]), reverse=True)]",
        (AVG + "test_best_averages_the_checkpoints_of_lowest_eval_wer",),
        "--best=N averages the checkpoints of highest WER",
    ),
    # ---- issue 52, by property: a real-shaped Common Voice release; awkward text through every parser
    Mutation(
        "cv_side_files_built",
        "ds2_jax/datasets/manifest.py",
        "    return {s: p for s, p in found.items() if s not in CV_SIDE_FILES}",
        "    return found",
        CV_RELEASE,
        "a Common Voice release builds validated, invalidated, other, ... as splits beside train/dev/test",
    ),
    Mutation(
        "cv_other_tsv_is_a_split",
        "ds2_jax/datasets/manifest.py",
        '    "other",\n',
        "",
        CV_RELEASE,
        "Common Voice's other.tsv (clips not yet reviewed) is built as a split",
    ),
    Mutation(
        "tsv_quotes_parsed",
        "ds2_jax/datasets/manifest.py",
        'csv.reader(f, delimiter="\\t", quoting=csv.QUOTE_NONE)',
        'csv.reader(f, delimiter="\\t")',
        (AWKWARD,),
        "a TSV transcript with a quote is parsed as a quoted field (Common Voice's quotes are text)",
    ),
    Mutation(
        "csv_quotes_ignored",
        "ds2_jax/datasets/manifest.py",
        "if tsv else csv.reader(f)",
        "if tsv else csv.reader(f, quoting=csv.QUOTE_NONE)",
        (AWKWARD,),
        "a CSV field quoted for its commas is split at them",
    ),
    Mutation(
        "utterance_id_cut_at_the_first_dot",
        "ds2_jax/datasets/manifest.py",
        'return os.path.splitext(rel)[0].replace(os.sep, "/")',
        'return rel.split(".")[0].replace(os.sep, "/")',
        (AWKWARD,),
        "an audio path with a dot before its extension gets a cut id (two files can share it)",
    ),
    # the inference wing (issue 50): its wall, the one loader's numerics, an unmeasured delay
    Mutation(
        "wing_reaches_the_pipeline",
        "ds2_jax/infer/jax_backend.py",
        "        from ds2_jax import forward, state, workdir_config\n",
        "        from ds2_jax import forward, state, timing, workdir_config  # noqa: F401\n",
        ("tests/test_infer.py::test_the_wing_never_imports_the_training_side_at_any_depth",),
        "the engine imports ds2_jax.timing, which reads the eval split through the input pipeline",
    ),
    Mutation(
        "unmeasured_delay_written_as_zero",
        "ds2_jax/infer/onnx_model.py",
        "delay = UNMEASURED if self.emission_delay_s is None else repr(float(self.emission_delay_s))",
        "delay = repr(float(self.emission_delay_s or 0.0))",
        ("tests/test_timing.py::test_the_export_carries_the_delay_and_an_unmeasured_or_older_export_reads_as_none",),
        "an export that could not measure the emission delay writes 0: word times silently uncorrected",
    ),
    # ---- issue 52, by property: every boundary at equality (the CTC check of each builder)
    Mutation(
        "librispeech_build_needs_a_spare_frame",
        "ds2_jax/datasets/librispeech_local.py",
        "if out_frames < geometry.ctc_min_frames(labels):",
        "if out_frames <= geometry.ctc_min_frames(labels):",
        ("tests/test_datasets.py::test_each_builder_keeps_an_utterance_whose_frames_equal_what_its_labels_need",),
        "the LibriSpeech build skips an utterance whose frames are exactly what its labels need",
    ),
    Mutation(
        "manifest_build_ignores_repeats",
        "ds2_jax/datasets/shards.py",
        "if frames < geometry.ctc_min_frames(labels):",
        "if frames < len(labels):",
        ("tests/test_datasets.py::test_each_builder_keeps_an_utterance_whose_frames_equal_what_its_labels_need",),
        "the manifest build keeps a transcript with repeats that its frames cannot emit (no blank between)",
    ),
    # ---- issue 52, by property: augmentation by what it does to the signal
    Mutation(
        "noise_rate_ignored",
        "ds2_jax/pipeline/augment.py",
        "    if rec.rate != rate:\n",
        "    if False:\n",
        AUG_SIGNAL,
        "a noise or impulse-response recording at another rate is used unresampled (other pitch and duration)",
    ),
    Mutation(
        "last_noise_never_drawn",
        "ds2_jax/pipeline/augment.py",
        "rec = self.noise[int(pick * len(self.noise))]",
        "rec = self.noise[int(pick * (len(self.noise) - 1))]",
        AUG_SIGNAL,
        "the last noise recording of the folder is never drawn",
    ),
    Mutation(
        "last_rir_never_drawn",
        "ds2_jax/pipeline/augment.py",
        "self.rirs[int(u[3] * len(self.rirs))]",
        "self.rirs[int(u[3] * (len(self.rirs) - 1))]",
        AUG_SIGNAL,
        "the last impulse response of the folder is never drawn",
    ),
    Mutation(
        "speed_draws_half_the_range",
        "ds2_jax/pipeline/augment.py",
        "x = speed(x, c.speed_min + u[1] * (c.speed_max - c.speed_min))",
        "x = speed(x, c.speed_min + u[1] * (c.speed_max - c.speed_min) / 2)",
        AUG_SIGNAL,
        "speed factors are drawn from the lower half of [speed_min, speed_max] only",
    ),
    Mutation(
        "connections_never_refused",
        "ds2_jax/serve/app.py",
        "        if self.active >= self.limit:",
        "        if False:",
        ("tests/test_serve.py::test_streams_and_connections_past_their_limits_get_a_503",),
        "requests past --max_connections are all taken in: memory and latency grow without bound",
    ),
    Mutation(
        "uploads_never_batched",
        "ds2_jax/serve/app.py",
        "            while len(batch) < self.limits.max_batch:",
        "            while False:",
        ("tests/test_serve.py::test_uploads_that_arrive_together_run_as_one_batch",),
        "uploads that arrive together each run their own forward pass",
    ),
    Mutation(
        "stream_rate_not_resampled",
        "ds2_jax/serve/app.py",
        "        if rate != engine.sample_rate:\n            import soxr",
        "        if False:\n            import soxr",
        ("tests/test_serve.py::test_a_stream_at_another_rate_is_resampled",),
        "PCM declared at 48 kHz fed to a 16 kHz model as it is",
    ),
    Mutation(
        "uploads_never_batched_onnx",
        "ds2_jax/infer/onnx_backend.py",
        "self.batch_size, self.fixed_batch = batch_size, False",
        "self.batch_size, self.fixed_batch = 1, False",
        ("tests/test_serve.py::test_uploads_that_arrive_together_run_as_one_batch",),
        "an exported model runs the uploads the server batched one forward pass each",
    ),
    Mutation(
        "redecoded_stream_at_a_fixed_interval",
        "ds2_jax/infer/engine.py",
        "due = max(REDECODE_SECONDS * self.engine.sample_rate, REDECODE_SHARE * self.decoded)",
        "due = REDECODE_SECONDS * self.engine.sample_rate",
        (
            "tests/test_streaming.py::"
            "test_a_bidirectional_models_stream_is_redecoded_within_its_bounds_and_ends_with_the_files_text",
        ),
        "a bidirectional model's stream decodes all its audio again every second however long it runs: its "
        "compute grows with the square of its length",
    ),
    Mutation(
        "page_worklet_repeats_a_sample",
        "ds2_jax/serve/static/worklet.js",
        "this.buffer = this.buffer.slice(drop); this.t -= drop; }",
        "this.buffer = this.buffer.slice(drop); this.t -= drop + 1; }",
        ("tests/test_page.py",),
        "the page's worklet repeats one sample per render quantum: the audio it streams is 0.8% slower than "
        "the microphone's (the server still transcribes exactly what it was sent)",
    ),
    Mutation(
        "training_eval_delay_not_recorded",
        "ds2_jax/train.py",
        '    if result["delay_utterances"] and jax.process_index() == 0:',
        "    if False:",
        (DELAY_AT_EVAL,),
        "training's evals never record the emission delay: an export without the data says 'unmeasured'",
    ),
    Mutation(
        "training_eval_delay_frame_length",
        "ds2_jax/train.py",
        "frame_seconds = fc.hop * geometry.FIRST_CONV.strides[0] / fc.sample_rate",
        "frame_seconds = fc.hop / fc.sample_rate",
        (DELAY_AT_EVAL,),
        "training's eval measures the delay with output frames of one hop, not hop x the first conv's stride",
    ),
    Mutation(
        "flops_without_output_layer",
        "benchmarks/flops.py",
        "    macs += frames * features * model.vocab_size\n",
        "",
        ("tests/test_flops.py::test_counted_forward_flops_match_xla",),
        "the counted model FLOPs leave out the output layer (0.4% of them at 29 symbols, within the 8% "
        "tolerance; 28% at 3,000)",
    ),
    Mutation(
        "suite_without_huge_pages",
        "tests/conftest.py",
        '"glibc.malloc.hugetlb=1"]))',
        '"glibc.malloc.arena_max=8"]))',
        ("tests/test_suite_setup.py",),
        "the processes the suite starts fault their large XLA buffers in 4 kB pages (the suite's tests ~10% slower)",
    ),
    # ---- issue 52's self-audit: the survivors' classes, tested since
    Mutation(
        "ctc_negative_loss_unclipped",
        "ds2_jax/ctc.py",
        "jnp.where(ok, jnp.maximum(loss, 0.0), 0.0)",
        "jnp.where(ok, loss, 0.0)",
        ("tests/test_ctc.py::test_a_certain_path_has_a_loss_of_zero_never_below",),
        "a feasible loss that float32 rounds below zero reaches the step unclipped",
    ),
    Mutation(
        "freq_mask_short_of_its_maximum",
        "ds2_jax/features.py",
        "jax.random.randint(keys[k], (b, 1), 0, freq_mask_width + 1)",
        "jax.random.randint(keys[k], (b, 1), 0, freq_mask_width)",
        (
            "tests/test_features.py::test_spec_augment_widths_are_drawn_over_their_whole_range_zero_and_the_maximum_included",
        ),
        "a SpecAugment frequency mask never reaches its maximum width",
    ),
    Mutation(
        "filter_keeps_bad_text",
        "ds2_jax/pipeline/filters.py",
        "keep = ~(short | long | idx.bad_text | infeasible)",
        "keep = ~(short | long | infeasible)",
        ("tests/test_tfds_source.py::test_each_filter_drops_an_utterance_for_its_own_reason_alone",),
        "the source keeps utterances with characters outside the alphabet",
    ),
    Mutation(
        "eval_extra_shape_narrower",
        "ds2_jax/pipeline/plan.py",
        "shapes.append((max(extra[0], shapes[-1][0]), max(extra[1], shapes[-1][1])))",
        "shapes.append(extra)",
        (
            "tests/test_plan.py::test_eval_shapes_hold_every_utterance_in_the_smallest_shape_it_fits_and_grow_in_both_dimensions",
        ),
        "the extra eval shape can be narrower than the largest bucket in one dimension",
    ),
    Mutation(
        "output_layer_unit_by_unit",
        "ds2_jax/finetune.py",
        "if fresh_output or (alphabets is not None and alphabets[0] != alphabets[1]):",
        "if fresh_output or (alphabets is not None and len(alphabets[0]) != len(alphabets[1])):",
        (
            "tests/test_finetune.py::test_the_same_symbols_in_another_order_give_the_sources_transcripts_before_any_step",
        ),
        "an alphabet of the same size keeps the source's output layer unit by unit: its units spell other letters",
    ),
    Mutation(
        "output_columns_by_position",
        "ds2_jax/finetune.py",
        "return np.array([0] + [where.get(c, -1) for c in symbols])",
        "return np.array([0] + [i + 1 if i < len(source_symbols) else -1 for i in range(len(symbols))])",
        (
            "tests/test_finetune.py::test_the_same_symbols_in_another_order_give_the_sources_transcripts_before_any_step",
        ),
        "the output layer's units mapped by position, not by symbol",
    ),
    Mutation(
        "shared_audio_not_counted",
        "ds2_jax/datasets/manifest.py",
        "shared = {a: s for a, s in splits_of.items() if len(s) > 1}",
        "shared = {}",
        ("tests/test_manifest.py::test_one_audio_file_in_two_splits_is_warned_and_counted",),
        "the same clip in train and test built into both without a word",
    ),
    Mutation(
        "split_named_twice_accepted",
        "ds2_jax/settings.py",
        "twice = sorted({n for n in names if names.count(n) > 1})",
        "twice = []",
        ("tests/test_manifest.py::test_a_split_named_twice_is_refused_naming_the_key",),
        "dataset.train_splits='train+train' reads the split twice",
    ),
    Mutation(
        "pipe_called_empty",
        "ds2_jax/audio.py",
        "regular = os.path.isfile(source)",
        "regular = True",
        ("tests/test_transcribe.py::test_a_pipe_such_as_dev_stdin_is_read_not_called_empty",),
        "/dev/stdin (no size) called an empty file",
    ),
    Mutation(
        "librispeech_duplicate_to_tfds",
        "ds2_jax/datasets/librispeech_local.py",
        "            if key in seen:  # tfds would stop",
        "            if False:  # tfds would stop",
        ("tests/test_datasets.py::test_a_duplicate_utterance_id_is_a_counted_skip_not_a_tensorflow_error",),
        "a duplicate LibriSpeech utterance id reaches tfds's writer: 'No module named tensorflow'",
    ),
    Mutation(
        "torn_stats_cache_trusted",
        "ds2_jax/pipeline/tfds_source.py",
        "            except Exception as e:  # noqa: BLE001 - a torn or foreign file",
        "            except KeyError as e:  # noqa: BLE001 - a torn or foreign file",
        ("tests/test_identity.py::test_a_torn_or_damaged_feature_statistics_cache_is_computed_again_with_a_warning",),
        "a torn feature-statistics cache is a traceback",
    ),
    Mutation(
        "build_workers_outlive_the_build",
        "ds2_jax/datasets/shards.py",
        "mp_context=ctx, initializer=ds2_workers.die_with_parent",
        "mp_context=ctx",
        ("tests/test_manifest.py::test_build_workers_and_the_resource_tracker_die_with_a_killed_build",),
        "kill -9 of a build leaves its workers and the resource tracker running",
    ),
    Mutation(
        "eval_ignores_the_workdirs_data",
        "ds2_jax/workdir_config.py",
        "        given, taken = _data_of(trained, given, set(overrides))",
        "        taken = []",
        (
            "tests/test_faults.py::test_eval_of_an_own_data_workdir_reads_its_dataset_settings_from_config_json_unless_given",
        ),
        "--mode=eval of an own-data workdir must be given every dataset flag of its training again",
    ),
    Mutation(
        "deleted_checkpoint_not_reread",
        "ds2_jax/checkpoint.py",
        "        if _gone(mgr, step) and retries > 0:  # replaced by a newer save meanwhile",
        "        if False:  # replaced by a newer save meanwhile",
        ("tests/test_faults.py::test_a_checkpoint_deleted_while_read_gives_the_newest_not_being_written",),
        "transcribe beside a keep_checkpoints=1 run: the step it listed, deleted by the next save, is an error",
    ),
    Mutation(
        "finetune_study_win_on_either_metric",
        "benchmarks/finetune_study.py",
        '    return sum(all(r[f"{variant}_{m}"] < r[f"scratch_{m}"] for m in METRICS) for r in both)\n',
        '    return sum(any(r[f"{variant}_{m}"] < r[f"scratch_{m}"] for m in METRICS) for r in both)\n',
        (
            "tests/test_benchmarks.py::test_finetune_study_reads_back_each_run_and_reports_seeds_means_and_wins_over_scratch",
        ),
        "a seed counts as beating scratch when only CER or only WER is lower",
    ),
    Mutation(
        "finetune_study_probe_not_restored",
        "benchmarks/finetune_study.py",
        "    finally:\n        finetune.merge = real\n",
        "    finally:\n        pass\n",
        (
            "tests/test_benchmarks.py::test_finetune_study_probes_change_only_the_feature_statistics_or_the_output_layer",
        ),
        "a probe's merge stays in place for the runs after it (tuned would run as a target_stats variant)",
    ),
    Mutation(
        "finetune_fresh_output_maps_by_symbol",
        "ds2_jax/finetune.py",
        "        columns = None if fresh_output else output_columns(*alphabets)\n",
        "        columns = output_columns(*alphabets) if alphabets else None\n",
        (
            "tests/test_benchmarks.py::test_finetune_study_probes_change_only_the_feature_statistics_or_the_output_layer",
            "tests/test_finetune.py::test_init_output_decides_where_each_output_unit_starts_and_nothing_else",
        ),
        "init_output='fresh' keeps the output layer mapped by symbol (the setting changes nothing)",
    ),
    Mutation(
        "finetune_auto_output_maps_by_symbol",
        "ds2_jax/finetune.py",
        '    return init_output == "fresh" or (init_output == "auto" and alphabets[0] != alphabets[1])\n',
        '    return init_output == "fresh"\n',
        ("tests/test_finetune.py::test_init_output_decides_where_each_output_unit_starts_and_nothing_else",),
        "init_output='auto' maps another alphabet by symbol instead of starting the layer afresh",
    ),
    Mutation(
        "valid_conv_cpu_keeps_autodiff",
        "ds2_jax/valid_conv.py",
        "        cpu=lambda x, w: _canonical(x, w, precision),\n",
        "        cpu=lambda x, w: _conv(x, w, precision),\n",
        ("tests/test_accumulate.py::test_on_the_cpu_the_accumulating_steps_convolutions_are_in_the_fast_layout",),
        "the CPU keeps autodiff's backward convolutions (the generic emitter inside the micro-batch loop)",
    ),
    Mutation(
        "valid_conv_input_gradient_kernel_unflipped",
        "ds2_jax/valid_conv.py",
        "    dx = _conv(padded, jnp.flip(w, (0, 1)).transpose(0, 1, 3, 2), precision)\n",
        "    dx = _conv(padded, w.transpose(0, 1, 3, 2), precision)\n",
        ("tests/test_valid_conv.py::test_values_and_gradients_are_lax_convs",),
        "the input's gradient correlates with the kernel instead of convolving (no flip)",
    ),
]


def copy_tree(dest: str) -> None:
    """The working tree's files (tracked, and untracked but not ignored) into dest."""
    files = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout.split("\0")
    for rel in filter(None, files):
        src = os.path.join(ROOT, rel)
        if os.path.isfile(src):
            os.makedirs(os.path.dirname(os.path.join(dest, rel)), exist_ok=True)
            shutil.copy2(src, os.path.join(dest, rel))


def run_tests(copy: str, tests, timeout: int) -> tuple[int, str]:
    # The compilation cache lets unchanged programs (references, other tests) compile once.
    env = dict(
        os.environ,
        PYTHONPATH=copy,
        PYTHONDONTWRITEBYTECODE="1",
        JAX_COMPILATION_CACHE_DIR=os.path.join(copy, ".jax_cache"),
        JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
    )
    cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *tests]
    try:
        proc = subprocess.run(cmd, cwd=copy, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return -1, "timed out"
    lines = (proc.stdout + proc.stderr).strip().splitlines()
    return proc.returncode, lines[-1] if lines else ""


def apply(copy: str, m: Mutation) -> str | None:
    """Writes the mutated file; returns the original text, or None where `old` is not there once."""
    path = os.path.join(copy, m.path)
    with open(path) as f:
        original = f.read()
    if original.count(m.old) != 1:
        return None
    with open(path, "w") as f:
        f.write(original.replace(m.old, m.new))
    return original


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-k", action="append", default=[], help="only mutations whose name contains this")
    parser.add_argument("--list", action="store_true", help="print the mutations and exit")
    parser.add_argument("--no-baseline", action="store_true", help="skip the unmutated run")
    parser.add_argument("--timeout", type=int, default=900, help="seconds per pytest run")
    parser.add_argument("--out", help="also write the result table (markdown) here")
    args = parser.parse_args(argv)
    chosen = [m for m in MUTATIONS if not args.k or any(k in m.name for k in args.k)]
    if args.list:
        for m in chosen:
            with open(os.path.join(ROOT, m.path)) as f:
                applies = f.read().count(m.old) == 1
            print(f"{m.name:32} {m.path:28} {m.why}{'' if applies else '  (DOES NOT APPLY)'}")
        return 0
    rows, failed = [], False
    with tempfile.TemporaryDirectory(prefix="ds2_mutate_") as copy:
        copy_tree(copy)
        if not args.no_baseline:
            tests = sorted({t for m in chosen for t in m.tests})
            rc, last = run_tests(copy, tests, args.timeout * 2)
            print(f"baseline (unmutated): rc={rc} {last}", flush=True)
            if rc != 0:
                print("the unmutated tests fail: fix them before mutating", file=sys.stderr)
                return 1
        for m in chosen:
            start = time.perf_counter()
            original = apply(copy, m)
            if original is None:
                result, last = "not applied", f"{m.old!r} is not in {m.path} exactly once: update tests/mutate.py"
                failed = True
            else:
                try:
                    rc, last = run_tests(copy, m.tests, args.timeout)
                finally:
                    with open(os.path.join(copy, m.path), "w") as f:
                        f.write(original)
                # 1: a test failed; 2: collection failed (the mutated module does not import)
                result = {0: "SURVIVED", 1: "killed", 2: "killed (import)"}.get(rc, f"error (rc {rc})")
                failed |= rc not in (1, 2)
            seconds = time.perf_counter() - start
            rows.append((m, result, last, seconds))
            print(f"{m.name:32} {result:12} {seconds:6.0f} s  {last}", flush=True)
    table = ["| mutation | file | wrong version | tests run | result |", "|---|---|---|---|---|"]
    table += [
        f"| `{m.name}` | {m.path} | {m.why} | {', '.join(t.split('::')[-1] for t in m.tests)} | {r} |"
        for m, r, _, _ in rows
    ]
    print("\n".join(table))
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(table) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
