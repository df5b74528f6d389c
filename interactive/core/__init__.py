"""tapescope.core — the MLX-compatible array API: ``import tapescope.core as mx``."""

__version__ = "0.32.4"  # the MLX release whose Python API tapescope.core follows

from . import array_methods as _array_methods  # noqa: F401  (every method beyond array.py's)
from .array import ArrayIterator, ArrayLike, array  # noqa: F401
from .array_indexing import ArrayAt  # noqa: F401
from .device import (  # noqa: F401
    Device, DeviceType, Stream, StreamContext, cpu, default_device, default_stream, device_count,
    ThreadLocalStream, gpu, is_available, new_stream, new_thread_local_stream,
    new_thread_unsafe_stream, set_default_device, set_default_stream, stream,
)
from .dtypes import (  # noqa: F401
    Dtype, DtypeCategory, bfloat16, bool_, complex64, complexfloating, finfo, float16, float32,
    float64, floating, generic, iinfo, inexact, int8, int16, int32, int64, integer, issubdtype,
    number, signedinteger, uint8, uint16, uint32, uint64, unsignedinteger,
)
from .memory import *  # noqa: F401,F403
from .printing import PrintOptions, get_printoptions, printoptions, set_printoptions  # noqa: F401
from . import cuda, metal  # noqa: F401
from .ops import *  # noqa: F401,F403
from . import distributed, fast, fft, linalg, random  # noqa: F401
from .linalg import norm as matrix_norm  # noqa: F401  (MLX: mx.matrix_norm is mx.linalg.norm)
from .interop import from_dlpack, get_array_buffer_size  # noqa: F401
from .serialize import load, save, save_safetensors, savez, savez_compressed  # noqa: F401
from .gguf import save_gguf  # noqa: F401
from .export_dot import export_to_dot  # noqa: F401
from .export_function import FunctionExporter, export_function, exporter, import_function  # noqa: F401
from .eval_api import async_eval, clear_streams, eval, synchronize  # noqa: F401
from .autodiff import (  # noqa: F401,E402
    checkpoint, custom_function, grad, jvp, value_and_grad, vjp,
)
from .vmap import vmap  # noqa: F401,E402
