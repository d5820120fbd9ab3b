// AudioWorklet: the microphone's float samples at the context's rate -> int16 PCM at the model's rate.
// Resampling: a windowed-sinc low-pass (cutoff at the lower Nyquist) evaluated at each output instant,
// so 48 kHz -> 16 kHz keeps nothing above 8 kHz to alias. Posts Int16Array chunks of ~chunkMs.
class Resampler extends AudioWorkletProcessor {
  constructor(options) {
    super();
    const o = options.processorOptions;
    this.inRate = sampleRate;
    this.outRate = o.outRate;
    this.step = this.inRate / this.outRate; // input samples per output sample
    this.chunk = Math.round((o.chunkMs / 1000) * this.outRate);
    const cutoff = Math.min(1, this.outRate / this.inRate); // of the input Nyquist
    this.half = Math.ceil(16 / cutoff); // taps each side
    this.cutoff = cutoff;
    this.buffer = new Float32Array(0); // input history not yet consumed
    this.t = 0; // the next output instant, in input samples from buffer[0]
    this.out = [];
    this.port.onmessage = (e) => { if (e.data === "flush") this.flush(); };
  }
  tap(x) { // windowed sinc at distance x (input samples)
    if (Math.abs(x) > this.half) return 0;
    const c = this.cutoff, w = 0.5 + 0.5 * Math.cos((Math.PI * x) / this.half); // Hann
    return x === 0 ? c : (c * Math.sin(Math.PI * c * x)) / (Math.PI * c * x) * w;
  }
  process(inputs) {
    const input = inputs[0];
    if (!input || input.length === 0) return true;
    const mono = new Float32Array(input[0].length);
    for (const ch of input) for (let i = 0; i < mono.length; i++) mono[i] += ch[i] / input.length;
    const joined = new Float32Array(this.buffer.length + mono.length);
    joined.set(this.buffer); joined.set(mono, this.buffer.length);
    this.buffer = joined;
    while (this.t + this.half < this.buffer.length) {
      let acc = 0;
      const center = Math.floor(this.t);
      for (let k = center - this.half + 1; k <= center + this.half; k++) {
        const v = k < 0 ? 0 : this.buffer[k];
        acc += v * this.tap(this.t - k);
      }
      this.out.push(Math.max(-32768, Math.min(32767, Math.round(acc * 32768))));
      this.t += this.step;
    }
    const drop = Math.max(0, Math.floor(this.t) - this.half);
    if (drop > 0) { this.buffer = this.buffer.slice(drop); this.t -= drop; }
    if (this.out.length >= this.chunk) this.send();
    return true;
  }
  send() {
    if (this.out.length === 0) return;
    const pcm = Int16Array.from(this.out);
    this.out = [];
    this.port.postMessage(pcm, [pcm.buffer]);
  }
  flush() { this.send(); this.port.postMessage("flushed"); }
}
registerProcessor("resampler", Resampler);
