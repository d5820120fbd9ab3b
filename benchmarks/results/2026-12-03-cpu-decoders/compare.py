"""pyctcdecode + kenlm vs flashlight-text on the demo model's log-probabilities (see NOTES.md).

    python benchmarks/results/2026-12-03-cpu-decoders/compare.py dump --workdir=W --out=lp.npz
    python benchmarks/results/2026-12-03-cpu-decoders/compare.py compare --logprobs=lp.npz --lm=lm.arpa \\
        --out=results.json
    python benchmarks/results/2026-12-03-cpu-decoders/compare.py pool --logprobs=lp.npz --lm=lm.arpa \\
        --out=pool.json

`dump` runs the model once over test-clean and dev-clean and keeps the log-probabilities;
`compare` decodes them with both libraries (one process, so utt/s is per core), beam 32 and
128, with and without the LM; the LM weights of each library are tuned on dev-clean first.
`pool` times ds2_jax.decoding's decode_all on test-clean repeated (one process vs the
host's cores).
The pyctcdecode adapter below is the decoder ds2_jax used before flashlight-text.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, ROOT)

from ds2_jax import decoding, metrics, text  # noqa: E402

SPLITS = ("test-clean", "dev-clean")


class PyctcdecodeDecoder:
    """pyctcdecode 0.5 prefix beam search (installed with --no-deps: it pins numpy<2)."""

    def __init__(self, cfg: decoding.DecoderConfig):
        import logging

        import pyctcdecode

        logging.getLogger("pyctcdecode").setLevel(logging.ERROR)
        self.cfg = cfg
        unigrams = decoding.arpa_unigrams(cfg.lm_path) if cfg.lm_path else None
        self._decoder = pyctcdecode.build_ctcdecoder(
            ["", *text.SYMBOLS], kenlm_model_path=cfg.lm_path or None, unigrams=unigrams,
            alpha=cfg.alpha, beta=cfg.beta, unk_score_offset=-10.0)

    def set_weights(self, alpha, beta):
        self._decoder.reset_params(alpha=alpha, beta=beta)

    def decode(self, lp):
        out = self._decoder.decode(np.asarray(lp, np.float32), beam_width=self.cfg.beam_width,
                                   beam_prune_logp=self.cfg.beam_prune_logp, token_min_logp=self.cfg.token_min_logp)
        return " ".join(out.split())


LIBRARIES = {"pyctcdecode": PyctcdecodeDecoder, "flashlight": decoding.BeamSearchDecoder}


def dump(workdir: str, out: str) -> None:
    from ds2_jax import evaluation, train

    config = train.load_config(workdir)
    os.chdir(ROOT)  # the demo config's corpus paths are relative to the repository
    run = evaluation.prepare(config, workdir, log_probs=True)
    arrays, meta = {}, {"step": run.step}
    for split in SPLITS:
        o = evaluation.run_split(run.p_eval, run.state, run.source, split, 0, run.par)
        meta[split] = {"references": o.references, "greedy": o.greedy}
        for i, lp in enumerate(o.log_probs):
            arrays[f"{split}/{i}"] = lp
    np.savez(out, meta=json.dumps(meta), **arrays)


def load(path: str):
    z = np.load(path)
    meta = json.loads(str(z["meta"]))
    lps = {s: [z[f"{s}/{i}"] for i in range(len(meta[s]["references"]))] for s in SPLITS}
    return meta, lps


def timed_decode(decoder, lps, repeats: int):
    """Hypotheses and the best (least disturbed) of `repeats` wall times, in seconds."""
    best, hyps = float("inf"), None
    for _ in range(repeats):
        t = time.perf_counter()
        hyps = [decoder.decode(lp) for lp in lps]
        best = min(best, time.perf_counter() - t)
    return hyps, best


def tune(decoder, refs, lps, alphas, betas):
    rows = []
    for a in alphas:
        for b in betas:
            decoder.set_weights(a, b)
            rows.append({"alpha": a, "beta": b, **metrics.error_rates(refs, [decoder.decode(lp) for lp in lps])})
    return min(rows, key=lambda r: (r["wer"], r["cer"], r["alpha"], r["beta"])), rows


def compare(logprobs: str, lm: str, out: str, beams, repeats: int, alphas, betas) -> list[dict]:
    meta, lps = load(logprobs)
    refs = meta["test-clean"]["references"]
    rows = [{"library": "greedy", "beam": 0, "lm": False, **metrics.error_rates(refs, meta["test-clean"]["greedy"])}]
    for name, cls in LIBRARIES.items():
        tuned = tune(cls(decoding.DecoderConfig(beam_width=32, lm_path=lm)), meta["dev-clean"]["references"],
                     lps["dev-clean"], alphas, betas)[0]
        print(f"{name}: dev-clean best alpha {tuned['alpha']} beta {tuned['beta']} WER {tuned['wer']:.4f}", flush=True)
        for beam in beams:
            for with_lm in (False, True):
                cfg = decoding.DecoderConfig(beam_width=beam, lm_path=lm if with_lm else "",
                                             **({"alpha": tuned["alpha"], "beta": tuned["beta"]} if with_lm else {}))
                t0 = time.perf_counter()
                dec = cls(cfg)
                setup = time.perf_counter() - t0
                hyps, seconds = timed_decode(dec, lps["test-clean"], repeats)
                row = {"library": name, "beam": beam, "lm": with_lm, "alpha": cfg.alpha if with_lm else None,
                       "beta": cfg.beta if with_lm else None, **metrics.error_rates(refs, hyps),
                       "utt_per_s": len(refs) / seconds, "seconds": seconds, "setup_s": setup}
                print(json.dumps(row), flush=True)
                rows.append(row)
    with open(out, "w") as f:
        json.dump({"utterances": len(refs), "step": meta["step"], "rows": rows}, f, indent=2)
    return rows


def pool(logprobs: str, lm: str, copies: int, beam: int, out: str) -> dict:
    """decode_all of test-clean repeated `copies` times: one process vs os.cpu_count() workers."""
    meta, lps = load(logprobs)
    utterances = lps["test-clean"] * copies
    dec = decoding.BeamSearchDecoder(decoding.DecoderConfig(beam_width=beam, lm_path=lm))
    result = {"utterances": len(utterances), "frames": sum(len(x) for x in utterances), "beam": beam,
              "cpu_count": os.cpu_count()}
    for workers in sorted({1, os.cpu_count() or 1}):
        t = time.perf_counter()
        hyps = dec.decode_all(utterances, workers=workers) if workers > 1 else [dec.decode(x) for x in utterances]
        result[f"utt_per_s_{workers}_workers"] = len(utterances) / (time.perf_counter() - t)
        result[f"wer_{workers}_workers"] = metrics.error_rates(meta["test-clean"]["references"] * copies, hyps)["wer"]
    print(json.dumps(result), flush=True)
    with open(out, "w") as f:
        json.dump(result, f, indent=2)
    return result


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("dump")
    d.add_argument("--workdir", required=True)
    d.add_argument("--out", required=True)
    c = sub.add_parser("compare")
    c.add_argument("--logprobs", required=True)
    c.add_argument("--lm", required=True)
    c.add_argument("--out", required=True)
    c.add_argument("--beams", default="32,128")
    c.add_argument("--repeats", type=int, default=3)
    c.add_argument("--alphas", default="0.25,0.5,1,2")
    c.add_argument("--betas", default="0,1,2")
    q = sub.add_parser("pool")
    q.add_argument("--logprobs", required=True)
    q.add_argument("--lm", default="", help="ARPA LM; empty = no LM")
    q.add_argument("--out", required=True)
    q.add_argument("--copies", type=int, default=100)
    q.add_argument("--beam", type=int, default=128)
    a = p.parse_args(argv)
    if a.cmd == "dump":
        dump(a.workdir, a.out)
    elif a.cmd == "pool":
        pool(a.logprobs, a.lm, a.copies, a.beam, a.out)
    else:
        floats = lambda s: [float(x) for x in s.split(",")]
        compare(a.logprobs, a.lm, a.out, [int(b) for b in a.beams.split(",")], a.repeats, floats(a.alphas), floats(a.betas))


if __name__ == "__main__":
    main()
