"""PyTorch twins of ds2_jax's DeepSpeech2, built from the same `ds2_jax.model.ModelConfig`.

One module, `TorchDS2`, with three recurrence back ends:

- `rnn_impl='loop'`: a Python loop over time steps, both directions stacked in one
  `bmm` per step (the launch-bound design; ~10 kernels per step and layer). Exactly the
  JAX math: clipped ReLU min(max(x, 0), 20) for the simple cell, GRU/LSTM in PyTorch
  gate order with no biases.
- `rnn_impl='cudnn'`: the cuDNN RNNs behind nn.RNN(nonlinearity='relu'), nn.GRU and
  nn.LSTM (bias=False), called through torch._VF (what those modules call) over a packed
  sequence, so the weights stay this module's own parameters. Deviations, by
  necessity of the cuDNN API:
    * the simple cell is plain ReLU, not clipped at 20 (cuDNN has no clipped ReLU, and
      clipping after the call would not feed back into the recurrence);
    * cuDNN always multiplies its input by W_ih. The shared input projection + batch
      norm (Paddle's share_rnn_weights) must happen before the nonlinearity, so the
      RNN is fed the projected, batch-normed sequence with W_ih fixed to the identity
      (a buffer, not a parameter: no extra trainable weights). Cost: one extra
      [T*B, G*H] x [G*H, G*H] GEMM per direction and layer, batched over time (off the
      recurrent critical path). With separate (unshared) projections each direction is
      its own unidirectional cuDNN call on its own projection.
  No biases (bias=False), so GRU/LSTM are exactly the JAX cells.
- `rnn_impl='cudnn_padded'`: the same cuDNN calls on the padded batch instead of a
  packed sequence, so no lengths travel to the host and the layer can be captured in a
  CUDA graph (torch_bench's torch_cudnn_graphs). The input is zeroed on padding frames:
  with no biases every cell maps (h = 0, x = 0) to h = 0, so the backward direction
  enters each utterance's last valid frame from the zero state, as the packed call does,
  and the padding adds nothing to any gradient (its h_prev is 0; its inputs are masked).

Parameters are laid out like the JAX model, so counts are equal by construction and
a test asserts it: conv kernels (no bias), batch-norm scale/bias, input projection
(no bias), recurrent matrices stacked per direction ([D, G*H, H], PyTorch's W_hh layout),
row convolution, output dense with bias.

Featurization from int16 audio runs inside the model (the same math as
ds2_jax/features.py). `ctc_loss` is the mean over utterances of
torch.nn.functional.ctc_loss, as the JAX step's loss.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from ds2_jax import geometry, settings
from ds2_jax.model import CELL_GATES, ModelConfig

RNN_IMPLS = ("loop", "cudnn", "cudnn_padded")


def time_mask(lengths: torch.Tensor, num_steps: int) -> torch.Tensor:
    """<bool>[B, T]: True on valid frames."""
    return torch.arange(num_steps, device=lengths.device)[None, :] < lengths[:, None]


def mask_time(x: torch.Tensor, lengths: torch.Tensor, time_axis: int = 1) -> torch.Tensor:
    """Zeros frames at and beyond `lengths` along `time_axis` (batch is axis 0)."""
    m = time_mask(lengths, x.shape[time_axis])
    shape = [1] * x.ndim
    shape[0], shape[time_axis] = m.shape
    return x * m.reshape(shape).to(x.dtype)


def reverse_valid(x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Reverses x[b, :lengths[b]] along axis 1 and leaves the padding in place."""
    t = torch.arange(x.shape[1], device=x.device)[None, :]
    idx = torch.where(t < lengths[:, None], lengths[:, None] - 1 - t, t)
    return torch.gather(x, 1, idx.reshape(idx.shape + (1,) * (x.ndim - 2)).expand_as(x))


class Featurizer(nn.Module):
    """<int16>[B, S] audio -> normalized <float32>[B, T, bins] and <int64>[B] frames."""

    def __init__(self, fc: settings.Spectrogram, mean: np.ndarray, std: np.ndarray):
        super().__init__()
        self.fc = fc
        hann = np.hanning(fc.window).astype(np.float32)  # as Paddle
        window = torch.tensor(hann)
        scale = float((hann**2).sum()) * fc.sample_rate
        bin_scale = torch.full((fc.num_bins,), 2.0 / scale)
        bin_scale[0] = bin_scale[-1] = 1.0 / scale
        self.register_buffer("window", window, persistent=False)
        self.register_buffer("bin_scale", bin_scale, persistent=False)
        self.register_buffer("mean", torch.as_tensor(mean, dtype=torch.float32), persistent=False)
        self.register_buffer("std", torch.as_tensor(std, dtype=torch.float32), persistent=False)

    def forward(self, audio: torch.Tensor, audio_lengths: torch.Tensor):
        fc = self.fc
        x = audio.float() / 32768.0
        frames = x.unfold(1, fc.window, fc.hop) * self.window  # [B, T, window]
        spec = torch.fft.rfft(frames, dim=-1)
        power = spec.real**2 + spec.imag**2
        feats = (torch.log(power * self.bin_scale + fc.eps) - self.mean) / self.std
        lengths = torch.clamp((audio_lengths.long() - fc.window) // fc.hop + 1, min=0)
        return mask_time(feats, lengths), lengths


class MaskedBatchNorm(nn.Module):
    """Batch norm over `channel_axis` with statistics of valid frames only.

    With `sync` and an initialized process group, counts and sums are all-reduced
    (with gradients), so every rank normalizes with the global batch's statistics.
    Statistics are computed in float32 whatever the input dtype.
    """

    def __init__(self, channels: int, momentum: float, eps: float, sync: bool):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(channels))
        self.bias = nn.Parameter(torch.zeros(channels))
        self.register_buffer("running_mean", torch.zeros(channels))
        self.register_buffer("running_var", torch.ones(channels))
        self.momentum, self.eps, self.sync = momentum, eps, sync

    def _all_reduce(self, x):
        if self.sync and dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            import torch.distributed.nn.functional as dist_fn

            return dist_fn.all_reduce(x)
        return x

    def forward(self, x: torch.Tensor, mask: torch.Tensor, channel_axis: int) -> torch.Tensor:
        """x: batch on axis 0, time on axis 1 or 2 (see mask), channels on channel_axis.

        mask: float [B, T] broadcastable to x once reshaped by the caller: here given
        already shaped to broadcast against x.
        """
        shape = [1] * x.ndim
        shape[channel_axis] = x.shape[channel_axis]
        if self.training:
            xf = x.float()
            reduce_axes = [a for a in range(x.ndim) if a != channel_axis]
            m = mask.float()
            count = (m * torch.ones_like(xf.select(channel_axis, 0)).unsqueeze(channel_axis)).sum()
            total = (xf * m).sum(dim=reduce_axes)
            stats = self._all_reduce(torch.cat([count[None], total]))
            count, total = stats[0], stats[1:]
            mean = total / count.clamp(min=1.0)
            sq = self._all_reduce((((xf - mean.reshape(shape)) ** 2) * m).sum(dim=reduce_axes))
            var = sq / count.clamp(min=1.0)
            with torch.no_grad():
                self.running_mean.mul_(self.momentum).add_((1 - self.momentum) * mean.detach())
                self.running_var.mul_(self.momentum).add_((1 - self.momentum) * var.detach())
        else:
            mean, var = self.running_mean, self.running_var
        mul = self.weight * torch.rsqrt(var + self.eps)
        shift = self.bias - mean * mul
        return x * mul.reshape(shape).to(x.dtype) + shift.reshape(shape).to(x.dtype)


def _bn(cfg: ModelConfig, channels: int) -> MaskedBatchNorm:
    return MaskedBatchNorm(channels, cfg.batch_norm_momentum, cfg.batch_norm_epsilon, cfg.sync_batch_norm)


class ConvBlock(nn.Module):
    """Conv2d (no bias) over [B, C, T, F] -> masked batch norm -> clipped ReLU -> re-mask."""

    def __init__(self, spec: geometry.ConvSpec, c_in: int, c_out: int, cfg: ModelConfig):
        super().__init__()
        self.spec = spec
        self.conv = nn.Conv2d(c_in, c_out, spec.kernel, stride=spec.strides, padding=spec.padding, bias=False)
        self.bn = _bn(cfg, c_out)

    def forward(self, x, lengths):
        s = self.spec
        x = self.conv(x)
        lengths = geometry.conv_out(lengths, s.kernel[0], s.strides[0], s.padding[0])
        mask = time_mask(lengths, x.shape[2])[:, None, :, None]
        x = torch.clamp(self.bn(x, mask, channel_axis=1), 0.0, 20.0)
        return mask_time(x, lengths, time_axis=2), lengths


def _cell_step(cell: str, clip: bool):
    """(carry, proj_t [D, B, G*H] f32, rec_t [D, B, G*H] f32) -> (carry, h)."""

    def simple(carry, x, r):
        h = x + r
        h = torch.clamp(h, 0.0, 20.0) if clip else torch.relu(h)
        return h, h

    def gru(carry, x, r):
        xr, xz, xn = x.chunk(3, dim=-1)
        hr, hz, hn = r.chunk(3, dim=-1)
        rg = torch.sigmoid(xr + hr)
        z = torch.sigmoid(xz + hz)
        n = torch.tanh(xn + rg * hn)
        h = (1.0 - z) * n + z * carry
        return h, h

    def lstm(carry, x, r):
        _, c = carry
        i, f, g, o = (x + r).chunk(4, dim=-1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        h = torch.sigmoid(o) * torch.tanh(c)
        return (h, c), h

    return {"simple": simple, "gru": gru, "lstm": lstm}[cell]


class RNNLayer(nn.Module):
    """Input projection (no bias) + masked batch norm, then the recurrence per direction."""

    def __init__(self, cfg: ModelConfig, d_in: int, rnn_impl: str, clip: bool = True):
        super().__init__()
        if rnn_impl not in RNN_IMPLS:
            raise ValueError(f"rnn_impl={rnn_impl!r}: expected one of {RNN_IMPLS}")
        self.cfg, self.rnn_impl, self.clip = cfg, rnn_impl, clip
        gates = CELL_GATES[cfg.rnn_cell]
        self.width = gates * cfg.rnn_size
        self.num_dirs = 2 if cfg.bidirectional else 1
        self.shared = cfg.share_rnn_weights or self.num_dirs == 1
        n_proj = 1 if self.shared else self.num_dirs
        self.proj = nn.ModuleList([nn.Linear(d_in, self.width, bias=False) for _ in range(n_proj)])
        self.proj_bn = nn.ModuleList([_bn(cfg, self.width) for _ in range(n_proj)])
        # PyTorch's W_hh layout [G*H, H] per direction; JAX stores [H, G*H]. Same count.
        bound = 1.0 / np.sqrt(cfg.rnn_size)
        self.recurrent = nn.Parameter(torch.empty(self.num_dirs, self.width, cfg.rnn_size).uniform_(-bound, bound))
        if rnn_impl != "loop":
            self.register_buffer("identity", torch.eye(self.width), persistent=False)

    def forward(self, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """x: [B, T, D_in] -> [B, T, H * directions]."""
        mask = time_mask(lengths, x.shape[1])[:, :, None]
        projections = [bn(p(x), mask, channel_axis=2) for p, bn in zip(self.proj, self.proj_bn)]
        if self.rnn_impl == "loop":
            h = self._loop(projections, lengths)
        else:
            h = self._cudnn(projections, lengths)
        return mask_time(h, lengths)

    def _loop(self, projections, lengths):
        cfg = self.cfg
        inputs = projections * self.num_dirs if self.shared else list(projections)
        if self.num_dirs == 2:
            inputs[1] = reverse_valid(inputs[1], lengths)
        xs = torch.stack(inputs, 0).permute(2, 0, 1, 3)  # [T, D, B, W]
        t_steps, d, b = xs.shape[0], xs.shape[1], xs.shape[2]
        step = _cell_step(cfg.rnn_cell, self.clip)
        w = self.recurrent.transpose(1, 2).to(xs.dtype)  # [D, H, G*H]
        h = xs.new_zeros(d, b, cfg.rnn_size, dtype=torch.float32)
        carry = (h, torch.zeros_like(h)) if cfg.rnn_cell == "lstm" else h
        outs = []
        for t in range(t_steps):
            hid = carry[0] if isinstance(carry, tuple) else carry
            rec = torch.bmm(hid.to(w.dtype), w)
            carry, out = step(carry, xs[t].float(), rec.float())  # cell math in f32, as JAX
            outs.append(out.to(xs.dtype))
        ys = torch.stack(outs, 0)  # [T, D, B, H]
        outs = [ys[:, k].transpose(0, 1) for k in range(d)]
        if d == 2:
            outs[1] = reverse_valid(outs[1], lengths)
        return torch.cat(outs, dim=-1)

    def _cudnn(self, projections, lengths):
        cfg = self.cfg
        fn = {"simple": torch._VF.rnn_relu, "gru": torch._VF.gru, "lstm": torch._VF.lstm}[cfg.rnn_cell]
        b = projections[0].shape[0]
        packed = self.rnn_impl == "cudnn"
        lengths_cpu = lengths.detach().to("cpu") if packed else None  # a host sync: not capturable

        def run(x, weights, bidirectional):
            dirs = 2 if bidirectional else 1
            h0 = x.new_zeros(dirs, b, cfg.rnn_size)
            hx = (h0, h0) if cfg.rnn_cell == "lstm" else h0
            if not packed:
                # Padded signature: (input, hx, weights, has_biases, num_layers, dropout,
                # train, bidirectional, batch_first). Zero input on padding keeps h at 0 there.
                return fn(mask_time(x, lengths), hx, weights, False, 1, 0.0, self.training, bidirectional, True)[0]
            packed_x = nn.utils.rnn.pack_padded_sequence(x, lengths_cpu, batch_first=True, enforce_sorted=False)
            # Packed-sequence signature: (data, batch_sizes, hx, weights, has_biases,
            # num_layers, dropout, train, bidirectional).
            out = fn(packed_x.data, packed_x.batch_sizes, hx, weights, False, 1, 0.0, self.training, bidirectional)
            packed_out = nn.utils.rnn.PackedSequence(
                out[0], packed_x.batch_sizes, packed_x.sorted_indices, packed_x.unsorted_indices
            )
            y, _ = nn.utils.rnn.pad_packed_sequence(packed_out, batch_first=True, total_length=x.shape[1])
            return y

        eye = self.identity.to(projections[0].dtype)
        rec = [self.recurrent[k].to(projections[0].dtype) for k in range(self.num_dirs)]
        if self.shared:
            weights = [eye, rec[0]] + ([eye, rec[1]] if self.num_dirs == 2 else [])
            return run(projections[0], weights, self.num_dirs == 2)
        outs = [run(projections[0], [eye, rec[0]], False)]
        rev = run(reverse_valid(projections[1], lengths), [eye, rec[1]], False)
        outs.append(reverse_valid(rev, lengths))
        return torch.cat(outs, dim=-1)


class RowConv(nn.Module):
    """Lookahead row convolution over time, depthwise, no bias."""

    def __init__(self, channels: int, context: int):
        super().__init__()
        self.context = context
        self.conv = nn.Conv1d(channels, channels, context + 1, groups=channels, bias=False)

    def forward(self, x, lengths):
        y = self.conv(F.pad(x.transpose(1, 2), (0, self.context))).transpose(1, 2)
        return mask_time(y, lengths)


class TorchDS2(nn.Module):
    """int16 audio -> per-frame logits over blank + 28 symbols (ds2_jax.model.DeepSpeech2)."""

    def __init__(
        self, cfg: ModelConfig, fc: settings.Spectrogram, mean, std, rnn_impl: str = "loop", clip: bool = True
    ):
        super().__init__()
        self.cfg = cfg
        self.features = Featurizer(fc, mean, std)
        convs, c_in = [], 1
        for spec in geometry.conv_specs(cfg.num_conv_layers):
            convs.append(ConvBlock(spec, c_in, cfg.conv_channels, cfg))
            c_in = cfg.conv_channels
        self.convs = nn.ModuleList(convs)
        d = geometry.output_bins(cfg.num_bins, cfg.num_conv_layers) * cfg.conv_channels
        layers = []
        for _ in range(cfg.num_rnn_layers):
            layers.append(RNNLayer(cfg, d, rnn_impl, clip))
            d = cfg.rnn_size * layers[-1].num_dirs
        self.rnns = nn.ModuleList(layers)
        self.row_conv = RowConv(d, cfg.row_conv_context) if not cfg.bidirectional and cfg.row_conv_context > 0 else None
        self.output = nn.Linear(d, cfg.vocab_size)

    def forward(self, audio: torch.Tensor, audio_lengths: torch.Tensor):
        """audio: <int16>[B, S]; returns (<float32>[B, T', vocab] logits, <int64>[B] frames)."""
        feats, lengths = self.features(audio, audio_lengths)
        x = feats[:, None]  # [B, 1, T, F]
        for conv in self.convs:
            x, lengths = conv(x, lengths)
        b, c, t, f = x.shape
        x = x.permute(0, 2, 3, 1).reshape(b, t, f * c)  # JAX's [B, T, F, C] flattening
        for rnn in self.rnns:
            x = rnn(x, lengths)
        if self.row_conv is not None:
            x = self.row_conv(x, lengths)
        return self.output(x).float(), lengths


def ctc_loss(logits: torch.Tensor, logit_lengths, labels, label_lengths) -> torch.Tensor:
    """Mean over utterances of the CTC negative log likelihood (blank = 0).

    Infeasible utterances (inf loss) contribute 0, as masked in ds2_jax/ctc.py.
    """
    log_probs = F.log_softmax(logits.float(), dim=-1).transpose(0, 1)  # [T, B, V]
    loss = F.ctc_loss(log_probs, labels, logit_lengths, label_lengths, blank=0, reduction="none", zero_infinity=True)
    return loss.mean()


def count_params(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters() if p.requires_grad)


def load_jax_params(net: TorchDS2, params) -> None:
    """Copies a ds2_jax DeepSpeech2 parameter tree into `net` (same ModelConfig).

    Layouts: conv [kt, kf, in, out] -> [out, in, kt, kf]; dense [in, out] -> [out, in];
    recurrent [D, H, G*H] -> [D, G*H, H]. Used to check that both compute the same thing.
    """

    def put(dst: torch.Tensor, src) -> None:
        src = torch.tensor(np.array(src, dtype=np.float32))
        if tuple(src.shape) != tuple(dst.shape):
            raise ValueError(f"shape {tuple(src.shape)} does not fit {tuple(dst.shape)}")
        with torch.no_grad():
            dst.copy_(src)

    def bn(dst: MaskedBatchNorm, src) -> None:
        put(dst.weight, src["scale"])
        put(dst.bias, src["bias"])

    for k, conv in enumerate(net.convs):
        p = params[f"ConvBlock_{k}"]
        put(conv.conv.weight, np.transpose(p["Conv_0"]["kernel"], (3, 2, 0, 1)))
        bn(conv.bn, p["MaskedBatchNorm_0"])
    for k, rnn in enumerate(net.rnns):
        p = params[f"RNNLayer_{k}"]
        names = ["input_proj"] if rnn.shared else ["input_proj_fwd", "input_proj_bwd"]
        for proj, proj_bn, name in zip(rnn.proj, rnn.proj_bn, names):
            put(proj.weight, np.asarray(p[name]["kernel"]).T)
            bn(proj_bn, p[f"{name}_bn"])
        put(rnn.recurrent, np.transpose(p["recurrent_kernel"], (0, 2, 1)))
    if net.row_conv is not None:
        put(net.row_conv.conv.weight, np.transpose(params["RowConv_0"]["Conv_0"]["kernel"], (2, 1, 0)))
    put(net.output.weight, np.asarray(params["output"]["kernel"]).T)
    put(net.output.bias, params["output"]["bias"])
