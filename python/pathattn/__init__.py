"""pathattn: PaTH attention (data-dependent Householder position encoding) for PyTorch.

Importing loads libpathattn_torch.so from $PATHATTN_LIBRARY, else from this package's folder (where
`pip install .` puts it), else from <repo>/build/torch/ (see _library.py, docs/python.md).
"""
from ._library import LibraryNotFoundError, library_path, load

load()

from .context_parallel import context_parallel_attention  # noqa: E402
from .layer import PaTHAttention, PaTHLayerCache  # noqa: E402  (needs the ops registered above)
from .ops import DecodeCache, decode, path_attention, prefill, rope_rotate, short_conv_w  # noqa: E402

__all__ = [
    "path_attention",
    "context_parallel_attention",
    "prefill",
    "short_conv_w",
    "rope_rotate",
    "decode",
    "DecodeCache",
    "PaTHAttention",
    "PaTHLayerCache",
    "LibraryNotFoundError",
    "library_path",
]
