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
BN = ("tests/test_model.py::test_batch_norm_normalizes_with_masked_moments_and_updates_running_stats_by_momentum",
      "tests/test_model.py::test_synchronized_batch_norm_over_devices_equals_one_device",
      "tests/test_model.py::test_batch_norm_ignores_padding_statistics")
SATURATED = "tests/test_recurrence.py::test_saturated_recurrence_matches_numpy_and_its_gradient_stops_at_the_clip"
BACKWARD = "tests/test_recurrence.py::test_backward_direction_starts_at_each_sequence_end"
CTC = "tests/test_ctc.py::"


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
    Mutation("grad_pmean", "ds2_jax/train.py", "grads = psum(grads, axis_name)",
             "grads = grads if axis_name is None else jax.lax.pmean(grads, axis_name)", (SGD, ADAM),
             "gradients averaged (pmean) instead of summed over devices"),
    Mutation("local_feasible_count", "ds2_jax/train.py", "count = psum(jnp.sum(used), axis_name)",
             "count = jnp.sum(used)", (SGD, ADAM), "loss divided by the device's own feasible count"),
    Mutation("infeasible_used", "ds2_jax/train.py", "used = ok.astype(jnp.float32) * weights", "used = weights",
             (SGD,), "infeasible utterances counted in the loss's denominator"),
    Mutation("bn_var_over_padding", "ds2_jax/model.py", "sq = jnp.sum(jnp.square(xf - mean) * m, axis=reduce_axes)",
             "sq = jnp.sum(jnp.square(xf - mean), axis=reduce_axes)", (*BN, PADDING),
             "batch-norm variance sums padded frames too"),
    Mutation("bn_running_var_frozen", "ds2_jax/model.py",
             "ra_var.value = self.momentum * ra_var.value + (1 - self.momentum) * var", "ra_var.value = ra_var.value",
             BN, "running variance never updated"),
    Mutation("skip_keeps_no_batch_stats", "ds2_jax/train.py", "batch_stats=keep(updated.batch_stats, state.batch_stats)",
             "batch_stats=updated.batch_stats", (NAN_LOSS, NAN_GRAD),
             "a skipped step keeps params and optimizer state but not batch-norm statistics"),
    Mutation("finite_loss_only", "ds2_jax/train.py", "finite = jnp.isfinite(loss_sum) & jnp.isfinite(grad_norm)",
             "finite = jnp.isfinite(loss_sum)", (NAN_LOSS, NAN_GRAD), "finiteness checked on the loss only"),
    Mutation("rnn_grad_ignores_upper_clip", "ds2_jax/rnn/gates.py", "return (y > 0) & (y < CLIP)",
             "return y > 0", (SATURATED,),
             "clipped-ReLU gradient (scan_vjp and the Pallas kernel) passes at the clip of 20"),
    Mutation("wer_as_cer", "ds2_jax/metrics.py", '"wer": float(jiwer.wer(refs, hypotheses))',
             '"wer": float(jiwer.cer(refs, hypotheses))', ("tests/test_metrics.py",), "WER computed as CER"),
    Mutation("time_mask_past_valid", "ds2_jax/features.py",
             "* jnp.maximum(lengths[:, None] - width, 1)).astype(jnp.int32)",
             "* jnp.maximum(t - width, 1)).astype(jnp.int32)", ("tests/test_features.py",),
             "SpecAugment time masks start anywhere in the padded batch"),
    # ---- further gaps
    Mutation("utterances_local", "ds2_jax/train.py", "utterances = psum(jnp.sum(weights), axis_name)",
             "utterances = jnp.sum(weights)", (SGD,), "utterance (and infeasible) counts of one device only"),
    Mutation("skip_counts_loss", "ds2_jax/train.py", '"loss_count": jnp.where(finite, count, 0.0)',
             '"loss_count": count', (NAN_LOSS, NAN_GRAD), "a skipped step's utterances count in the mean loss"),
    Mutation("consecutive_skips_never_reset", "ds2_jax/train.py",
             "consecutive_skips=jnp.where(finite, 0, state.consecutive_skips + 1)",
             "consecutive_skips=state.consecutive_skips + (~finite).astype(jnp.int32)", (NAN_GRAD,),
             "a good step does not reset the consecutive-skip count (runs stop too early)"),
    Mutation("no_gradient_clipping", "ds2_jax/state.py", "optax.clip_by_global_norm(opt.clip_global_norm),",
             "optax.identity(),", (f"{STEP}::test_optimizer_clips_the_global_gradient_norm_before_adam",),
             "optimizer.clip_global_norm ignored"),
    Mutation("warmup_from_full_rate", "ds2_jax/state.py", "optax.linear_schedule(0.0, opt.learning_rate",
             "optax.linear_schedule(opt.learning_rate, opt.learning_rate",
             (f"{STEP}::test_learning_rate_warms_up_linearly_from_zero_then_decays",), "warm-up starts at the full rate"),
    Mutation("bn_count_ignores_frequency", "ds2_jax/model.py", "count = jnp.sum(m) * per_row", "count = jnp.sum(m)",
             BN, "conv batch norm divides by frames, not frames x frequency bins"),
    Mutation("sync_bn_local_variance", "ds2_jax/model.py", "sq = jax.lax.psum(sq, self.axis_name)", "sq = sq",
             BN, "synchronized batch norm: variance of the device's rows only"),
    Mutation("conv_relu_no_upper_clip", "ds2_jax/activation.py", "return jnp.clip(x, 0.0, CLIP)",
             "return jnp.maximum(x, 0.0)",
             ("tests/test_model.py::test_clipped_relu_clips_at_0_and_20_and_passes_gradient_only_between",),
             "the shared clipped ReLU (conv blocks, RNN cells) not clipped at 20"),
    Mutation("rnn_cell_no_upper_clip", "ds2_jax/rnn/reference.py", "h = clipped_relu(proj_t + rec_t)",
             "h = jnp.maximum(proj_t + rec_t, 0.0)", (SATURATED,),
             "the reference recurrence not clipped at 20"),
    Mutation("auto_kernel_above_16_rows", "ds2_jax/rnn/dispatch.py", 'if asked == "auto" and rows > persistent.ROWS:',
             "if False:", ("tests/test_dispatch.py",),
             "'auto' takes the Triton kernel above 16 rows per device, where scan_vjp is faster"),
    Mutation("rnn_padding_not_zeroed", "ds2_jax/rnn/recurrence.py",
             "xs = jnp.where(valid, jnp.stack(projections, axis=2), jnp.zeros((), projections[0].dtype))",
             "xs = jnp.stack(projections, axis=2)", (BACKWARD,),
             "backward direction starts from the padded end, not each sequence's end"),
    Mutation("features_keep_one_padded_frame", "ds2_jax/features.py",
             "mask = jnp.arange(feats.shape[1])[None, :] < lengths[:, None]",
             "mask = jnp.arange(feats.shape[1])[None, :] <= lengths[:, None]", ("tests/test_features.py",),
             "the first padded frame keeps its (padding-dependent) features"),
    Mutation("ctc_repeats_need_no_blank", "ds2_jax/geometry.py",
             "return label_lengths + repeats.sum(axis=1).astype(label_lengths.dtype)", "return label_lengths",
             (CTC + "test_min_frames_counts_repeats",), "feasibility ignores the blank a repeated label needs"),
    Mutation("ctc_empty_label_feasible", "ds2_jax/ctc.py", "return (label_lengths > 0) & (", "return (",
             (CTC + "test_infeasible_labels_are_masked_out_of_loss_and_gradient",), "empty transcripts trained on"),
    Mutation("greedy_keeps_repeats", "ds2_jax/ctc.py", "keep[1:] = path[1:] != path[:-1]", "keep[1:] = True",
             ("tests/test_decoding.py::test_greedy_texts_collapse_repeats_and_respect_lengths",),
             "greedy decoding does not merge repeated labels"),
    Mutation("index_repeats_across_rows", "ds2_jax/tfds_source.py",
             "    repeat[offsets[:-1][lengths > 0]] = False  # an utterance's first label repeats nothing\n", "",
             ("tests/test_tfds_source.py::test_vectorized_min_frames_match_the_per_sequence_rule",),
             "the index's CTC need counts a repeat across two utterances"),
    Mutation("input_wait_while_busy", "ds2_jax/train.py",
             "idle_since = start if last_metrics is None else None", "idle_since = start",
             ("tests/test_loader.py::test_input_wait_counts_only_time_the_devices_sit_idle",),
             "input wait counted while the devices still run the last step"),
    Mutation("synthetic_pool_ignored", "ds2_jax/input_pipeline.py",
             "key = (EVAL_INDEX_OFFSET if held_out else 0) + index % self.pool_size", "key = index",
             ("tests/test_loader.py::test_synthetic_pool_repeats_after_its_size_and_keeps_eval_apart",),
             "synthetic utterances regenerated per index (the pool never reused)"),
    # ---- issue 24's list
    Mutation("bar_counts_dispatched_steps", "ds2_jax/progress.py",
             "while self._pending and _is_ready(self._pending[0]):", "while self._pending:",
             ("tests/test_progress.py::test_bar_advances_when_steps_finish_not_when_dispatched",),
             "the progress bar advances when a step is dispatched, not when it finishes"),
    Mutation("logs_write_over_the_bar", "ds2_jax/progress.py", "            h.handle = self._clearing(h.handle, h.filter)\n",
             "            pass\n", ("tests/test_progress.py::test_log_lines_clear_the_bar_and_it_comes_back",),
             "log lines land inside the progress bar"),
    Mutation("bar_rate_since_the_start", "ds2_jax/progress.py",
             "        self._times.append((now, self.finished, self._utterances))  # the first: after the compile\n",
             "        self._times.append((now, self.finished, self._utterances))\n"
             "        if len(self._times) == 1:\n            self._times.appendleft((now - 60.0, self.finished - 1, 0.0))\n",
             ("tests/test_progress.py::test_rates_and_eta_leave_out_the_first_step_which_compiles",),
             "the bar's step/s and ETA count the compiling first step"),
    Mutation("shm_left_to_the_collector", "ds2_jax/loader.py", "        shm.unlink()\n", "        return np.asarray(array)\n",
             ("tests/test_loader.py::test_a_process_that_read_with_workers_leaves_no_shared_memory_behind",),
             "batches alive at exit leave their shared-memory segments behind (resource_tracker's leak warning)"),
    Mutation("last_word_never_ends", "ds2_jax/decoding.py",
             "            lp = np.concatenate([lp, boundary_frame(lp.shape[1])])\n", "            pass\n",
             ("tests/test_decoding.py::test_lm_corrects_an_acoustically_ambiguous_word",),
             "the LM search drops an utterance's last word (its spelling never reaches the boundary)"),
    Mutation("lm_weight_on_log10", "ds2_jax/decoding.py", "lm_weight=self.alpha * math.log(10)",
             "lm_weight=self.alpha", ("tests/test_decoding.py::test_alpha_weighs_the_natural_log_lm_score",),
             "alpha weighs KenLM's log10 score, not the natural-log score the config documents"),
    Mutation("plot_rows_unsorted", "ds2_jax/plot.py", "points = sorted((r[\"step\"], r[key]) for r in rows if key in r)",
             "points = [(r[\"step\"], r[key]) for r in rows if key in r]",
             ("tests/test_plot.py::test_each_panel_draws_its_keys_in_step_order",),
             "curves drawn in file order, so a resumed run's rows zigzag"),
    Mutation("build_announces_a_download", "ds2_jax/datasets/librispeech_local.py",
             "        with contextlib.redirect_stdout(io.StringIO()):\n            yield\n", "        yield\n",
             ("tests/test_datasets.py::test_a_local_build_says_nothing_of_downloads",),
             "a local build prints tfds's 'Downloading and preparing dataset'"),
    Mutation("cudnn_padded_keeps_padding", "benchmarks/torch_model.py",
             "return fn(mask_time(x, lengths), hx,", "return fn(x, hx,",
             ("tests/test_benchmarks.py::test_padded_cudnn_layout_trains_like_the_packed_one",),
             "the padded cuDNN layout lets padding frames drive the state, unlike the packed one"),
    Mutation("all_skipped_split_left_to_tfds", "ds2_jax/datasets/librispeech_local.py",
             "        if not report.kept:", "        if False:",
             ("tests/test_datasets.py::test_a_split_with_every_utterance_skipped_says_why",),
             "a split with nothing kept fails deep in tfds ('No examples were yielded')"),
    Mutation("transcribe_drops_lexicon", "ds2_jax/transcribe.py",
             "lexicon_path=args.lexicon or (base.lexicon_path if lm_path == base.lm_path else \"\"),",
             "lexicon_path=base.lexicon_path if lm_path == base.lm_path else \"\",",
             ("tests/test_transcribe.py::test_transcribes_wav_flac_8k_44k_stereo_and_reports_a_bad_file",),
             "transcribe --lexicon is accepted but ignored"),
    Mutation("watchdog_outlives_an_error", "ds2_jax/train.py",
             "with _closed_after(writer), contextlib.closing(watchdog):",
             "with _closed_after(writer):",
             ("tests/test_faults.py::test_non_finite_steps_skipped_counted_and_bounded",),
             "a run that raises leaves its watchdog running, which ends the caller's process later"),
    Mutation("eval_on_a_host_copy", "ds2_jax/train.py",
             "evaluation.evaluate(p_eval, state, source,",
             "evaluation.evaluate(p_eval, par.put_replicated(host_state()), source,",
             ("tests/test_evaluation.py::test_eval_during_training_reads_the_placed_train_state",),
             "each eval during training copies the train state to the host and places it again"),
    Mutation("eval_rows_device_minor", "ds2_jax/parallel.py",
             "lambda x: x.reshape((-1,) + x.shape[2:])", "lambda x: x.swapaxes(0, 1).reshape((-1,) + x.shape[2:])",
             ("tests/test_evaluation.py::test_pmap_jit_and_eager_evaluate_a_checkpoint_alike_placing_it_once",),
             "pmap eval outputs read back in another row order than the host batch's references"),
    Mutation("eval_rows_blocks_reversed", "ds2_jax/parallel.py", "for k in sorted(blocks)]",
             "for k in sorted(blocks, reverse=True)]",
             ("tests/test_distributed.py::test_two_processes_under_jit_match_one_process",),
             "with several processes under jit, a process's eval rows read back out of order"),
]


def copy_tree(dest: str) -> None:
    """The working tree's files (tracked, and untracked but not ignored) into dest."""
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, check=True,
                           capture_output=True, text=True).stdout.split("\0")
    for rel in filter(None, files):
        src = os.path.join(ROOT, rel)
        if os.path.isfile(src):
            os.makedirs(os.path.dirname(os.path.join(dest, rel)), exist_ok=True)
            shutil.copy2(src, os.path.join(dest, rel))


def run_tests(copy: str, tests, timeout: int) -> tuple[int, str]:
    # The compilation cache lets unchanged programs (references, other tests) compile once.
    env = dict(os.environ, PYTHONPATH=copy, PYTHONDONTWRITEBYTECODE="1",
               JAX_COMPILATION_CACHE_DIR=os.path.join(copy, ".jax_cache"),
               JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")
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
    table += [f"| `{m.name}` | {m.path} | {m.why} | {', '.join(t.split('::')[-1] for t in m.tests)} | {r} |"
              for m, r, _, _ in rows]
    print("\n".join(table))
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(table) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
