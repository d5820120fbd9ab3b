"""The engine of a training workdir's checkpoint, run by jax (its streaming by infer.streaming)."""

from __future__ import annotations

import functools

from ds2_jax import decoding, settings, text
from ds2_jax.infer import delay, engine, onnx_model


class JaxEngine(engine.Engine):
    """A restored checkpoint of `workdir` with the config it was trained with (W/config.json) and
    the feature statistics stored in its state. Its emission delay is the one recorded for the
    checkpoint (infer.delay; ds2_jax.timing measures it on the eval split), else None."""

    def __init__(
        self,
        workdir: str,
        decoder_cfg: settings.Decoding | None = None,
        step: int | str | None = None,
        batch_size: int = 8,
        config: settings.Settings | None = None,
        restored: tuple | None = None,
    ):
        """`step`: a number, 'best' or None (the latest); `config`: the workdir's
        (workdir_config.load_config), when the caller has read it already; `restored`: (state, step)
        of state.restore_state, when the caller has restored it already."""
        import jax

        from ds2_jax import forward, state, workdir_config

        self.config = config if config is not None else workdir_config.load_config(workdir)
        self.alphabet = text.Alphabet.of_setting(self.config.model.alphabet)  # the model's outputs
        self.beam = decoding.make_beam_decoder(decoder_cfg or settings.Decoding(), self.alphabet)
        self.state, self.step = restored or state.restore_state(self.config, workdir, step)
        fc = self.config.features
        self.sample_rate, self.hop, self.window = fc.sample_rate, fc.hop, fc.window
        self.num_conv_layers = self.config.model.num_conv_layers
        self.bidirectional = self.config.model.bidirectional
        self.lookahead_seconds = onnx_model.lookahead_seconds(self.config)
        self.batch_size = batch_size
        self.emission_delay = delay.recorded(workdir, self.step)
        kw = state.step_kwargs(self.config)
        infer = jax.jit(
            functools.partial(
                forward.infer,
                model_cfg=kw["model_cfg"],
                feature_cfg=kw["feature_cfg"],
                log_probs=self.beam is not None,
            )
        )
        self._forward = functools.partial(infer, self.state)  # (audio, lengths) -> forward.decoder_inputs

    def _log_prob_stream(self):
        from ds2_jax.infer import streaming

        return streaming.Stream(self.config, self.state)
