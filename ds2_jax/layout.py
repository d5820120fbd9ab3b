"""A workdir's file layout: the name of every file and folder that training, evaluation and
the tools write in a workdir W, in one place. The modules that write or read them import the
names from here (a test holds that no other module spells them).

    W/config.json                 the settings the run started with (workdir_config)
    W/config_changes.jsonl        settings a resume changed, per step (workdir_config)
    W/checkpoints/<step>/         orbax checkpoints (checkpoint)
    W/metrics.jsonl, tensorboard/ scalars (metrics, reporting; plot draws them to curves.png)
    W/log.txt, log-process<i>.txt the full log, one file per process (cli)
    W/error.log                   tracebacks of explained errors (errors)
    W/run.lock                    the running training's lock (resilience)
    W/timing.json                 the model's emission delay per checkpoint (infer.delay; training's evals)
    W/averaged.json               a checkpoint average's source and steps (average)
    W/eval-<split>-<step>-<decoder>[-max<N>].json         evaluation results (evaluation)
    W/tune_lm-<split>-<step>-beam<B>-lm-<lm>[-max<N>].json LM weight tuning (tools.tune_lm)
"""

from __future__ import annotations

CONFIG = "config.json"
CONFIG_CHANGES = "config_changes.jsonl"  # {"step", "time", "changes": {key: [before, after]}} per changing resume
CHECKPOINTS = "checkpoints"
METRICS = "metrics.jsonl"
TENSORBOARD = "tensorboard"
CURVES = "curves.png"
LOG = "log.txt"
ERROR_LOG = "error.log"
LOCK = "run.lock"
TIMING = "timing.json"  # {step: {emission_delay_s, utterances, split}}
AVERAGED = "averaged.json"  # {source, steps, how}: a workdir written by ds2-average (average)


def log_file(process_index: int) -> str:
    """The log file of one process of a run (process 0: LOG)."""
    return LOG if process_index == 0 else f"log-process{process_index}.txt"


def _subset(max_utterances: int) -> str:
    """A result over at most N utterances has a name of its own: it never replaces the whole split's."""
    return f"-max{max_utterances}" if max_utterances else ""


def eval_result(split: str, step: int, decoder: str, max_utterances: int = 0) -> str:
    """An evaluation result's file name; `decoder` is evaluation.decoding_tag's."""
    return f"eval-{split}-{step}-{decoder}{_subset(max_utterances)}.json"


def tune_lm_result(split: str, step: int, beam_width: int, lm: str, max_utterances: int = 0) -> str:
    """An LM tuning result's file name (one per split, step, beam, LM and subset); `lm` is evaluation.lm_name's."""
    return f"tune_lm-{split}-{step}-beam{beam_width}-lm-{lm}{_subset(max_utterances)}.json"
