"""arrayjit for Python: tensors with NumPy-style broadcasting and reverse-mode autodiff, compiled
by arrayjit's backends (C on CPU cores, CUDA, WGSL) and run on devices.

    import numpy as np, arrayjit as aj
    x = aj.tensor(np.random.rand(32, 2).astype(np.float32), label="x")
    w = aj.param("w", (2, 1), seed=1)
    loss = ((x @ w) - 1.0).relu().mean()
    trainer = aj.Trainer(loss, aj.Adam(lr=0.01))
    for _ in range(100):
        trainer.step()
    print(w.numpy())

Building tensors computes nothing: ``compile`` (outputs), ``backward`` (a loss and its
gradients) and ``Trainer`` (forward, gradients and the optimizer's update) compile the graph on a
backend; ``Tensor.numpy()`` reads hosted values, ``Tensor.assign()`` sets inputs between runs.
Every error is an ``ArrayjitError`` subclass carrying the library's message.
"""

# Arrays go in and out as NumPy's: without it the extension would fail deep inside a call.
try:
    import numpy as _numpy
except ImportError as _missing:  # pragma: no cover - NumPy is a dependency of the package
    raise ImportError(
        "arrayjit needs NumPy, a dependency of the package: install it with `pip install numpy`"
    ) from _missing
del _numpy

from ._arrayjit import (
    ArrayjitError,
    AxisError,
    Backend,
    BackendUnavailableError,
    BadValueError,
    CharVocab,
    CheckpointError,
    CompileError,
    DeviceError,
    Gpt2,
    Gpt2Tokenizer,
    GptTrainer,
    IndexOutOfBoundsError,
    InvalidArgumentError,
    IoError,
    LaunchError,
    LimitExceededError,
    MemoryModeError,
    Optimizer,
    OutOfMemoryError,
    PoolError,
    PrecisionError,
    Routine,
    SettingError,
    ShapeMismatchError,
    Tensor,
    Trainer,
    UnsupportedError,
    Adam,
    SGD,
    __version__,
    backend,
    backends,
    backward,
    compile,
    cross_entropy,
    debug_level,
    einsum,
    full,
    guarded_product,
    scaled_dot_product_attention,
    ids,
    load,
    moons,
    mse,
    param,
    save,
    set_debug_level,
    set_ids,
    set_run_timing,
    softmax_cross_entropy,
    start_trace,
    stop_trace,
    tensor,
    where,
)
from . import nn

__all__ = [
    "ArrayjitError",
    "AxisError",
    "Backend",
    "BackendUnavailableError",
    "BadValueError",
    "CharVocab",
    "CheckpointError",
    "CompileError",
    "DeviceError",
    "Gpt2",
    "Gpt2Tokenizer",
    "GptTrainer",
    "IndexOutOfBoundsError",
    "InvalidArgumentError",
    "IoError",
    "LaunchError",
    "LimitExceededError",
    "MemoryModeError",
    "Optimizer",
    "OutOfMemoryError",
    "PoolError",
    "PrecisionError",
    "Routine",
    "SettingError",
    "ShapeMismatchError",
    "Tensor",
    "Trainer",
    "UnsupportedError",
    "Adam",
    "SGD",
    "__version__",
    "backend",
    "backends",
    "backward",
    "compile",
    "cross_entropy",
    "debug_level",
    "einsum",
    "guarded_product",
    "scaled_dot_product_attention",
    "full",
    "ids",
    "load",
    "moons",
    "mse",
    "param",
    "save",
    "nn",
    "set_debug_level",
    "set_ids",
    "set_run_timing",
    "softmax_cross_entropy",
    "start_trace",
    "stop_trace",
    "tensor",
    "where",
]
