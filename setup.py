"""ds2_jax: DeepSpeech2 in JAX/Flax, compiled and data parallel."""

from setuptools import find_packages, setup

INSTALL_REQUIRES = [
    "absl-py>=1.4",
    "array-record>=0.5",
    "etils[epath]>=1.5",
    "flax>=0.8.5",
    "grain>=0.2.18",  # worker processes that make training batches (ds2_jax.pipeline.loader)
    "importlib_resources>=5",  # tensorflow_datasets' builders import it; not in its own requirements
    "jax>=0.10",  # the Mosaic GPU Pallas API of ds2_jax.kernels.mosaic_rnn (plgpu.kernel, inline_mgpu)
    "jiwer>=3.0",
    "ml-collections>=0.1.1",
    # jax's own dtype package: 0.7.0 takes 0.66 s of CPU to import (its ufunc loops registered with
    # numpy 2.4), 0.6.0 5 ms, in every process that imports jax (benchmarks/results/2026-12-06-cpu-hugepages/)
    "ml_dtypes>=0.5,!=0.7.0",
    "numpy>=1.26",
    "optax>=0.2.3",
    "orbax-checkpoint>=0.6",
    "soundfile>=0.12",
    "soxr>=0.3",  # resampling in transcribe (any input rate -> 16 kHz)
    "tensorboardX>=2.6",
    "tensorflow-datasets>=4.9.6",
    "tqdm>=4.66",
]

# torch is pinned exactly: the version that installs as a CPU build offline.
TORCH = "torch==2.13.0"

# pytest < 9.2: pytest-xdist 3.8 cannot group tests (--dist loadgroup) under 9.2 (tests/conftest.py).
# ds2_jax.export: jax2onnx writes the ONNX model, onnxruntime runs it (transcribe --model needs only
# onnxruntime). jax2onnx 0.17 asks for jax >= 0.8.1, flax >= 0.12.1 and orbax-checkpoint < 0.11.37.
EXPORT = ["jax2onnx>=0.17", "onnx>=1.20", "onnxruntime>=1.24"]

# ds2-serve (ds2_jax.serve): an ASGI app under uvicorn (httptools: its C HTTP parser), WebSockets,
# Prometheus metrics; the browser test drives Debian's chromium with playwright's client (no browser download).
SERVE = ["starlette>=0.40", "uvicorn>=0.30", "httptools>=0.6", "websockets>=12", "prometheus_client>=0.20"]

EXTRAS = {
    "test": [
        "pytest>=7.4,<9.2",
        "pytest-timeout>=2.2",
        "pytest-xdist>=3.5",
        TORCH,
        "matplotlib>=3.7",
        "psutil>=5.9",
        "ruff>=0.6",  # make lint (.ci/run): lint and format, configured in pyproject.toml
        *EXPORT,
        *SERVE,
        "httpx>=0.27",  # the server's HTTP tests
        "playwright>=1.45",  # the page's test in chromium (.ci/run installs Debian's chromium)
    ],  # benchmarks and the export are tested too
    "bench": [TORCH, "matplotlib>=3.7", "psutil>=5.9"],  # psutil: worker memory in benchmarks.input_pipeline
    # A CUDA 12 jax: the pip CUDA/cuDNN/NCCL wheels, so only an NVIDIA driver >= 525 is needed
    # on the host (jax[cuda13] would need >= 580).
    "cuda": ["jax[cuda12]>=0.10"],
    # LM beam search: flashlight-text's C++ CTC decoder with KenLM inside (binary wheels, no
    # numpy pin). ARPA files come from ds2_jax.tools.build_lm: no pip package ships lmplz.
    "lm": ["flashlight-text>=0.0.7"],
    "plot": ["matplotlib>=3.7"],  # ds2_jax.plot; make demo installs it
    "export": EXPORT,
    "serve": [*SERVE, "onnxruntime>=1.24"],
}

setup(
    name="ds2_jax",
    version="0.1.0",
    description="DeepSpeech2 in JAX/Flax: compiled, data-parallel training on LibriSpeech.",
    packages=find_packages(include=["ds2_jax", "ds2_jax.*"]),
    package_data={"ds2_jax.serve": ["static/*.html", "static/*.js"]},
    python_requires=">=3.11",
    install_requires=INSTALL_REQUIRES,
    extras_require=EXTRAS,
    # The commands (ds2_jax/commands.py): ds2-train is launch.py, the others their `python -m` forms.
    entry_points={
        "console_scripts": [
            "ds2-train=ds2_jax.commands:train",
            "ds2-eval=ds2_jax.commands:evaluate",
            "ds2-build=ds2_jax.commands:build",
            "ds2-transcribe=ds2_jax.commands:transcribe",
            "ds2-export=ds2_jax.commands:export",
            "ds2-build-lm=ds2_jax.commands:build_lm",
            "ds2-tune-lm=ds2_jax.commands:tune_lm",
            "ds2-plot=ds2_jax.commands:plot",
            "ds2-average=ds2_jax.commands:average",
            "ds2-serve=ds2_jax.commands:serve",
        ]
    },
)
