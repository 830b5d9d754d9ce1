"""The K and V rows of every layer in one of the KV cache types, shared by the single
sequence's cache (kv_cache.py) and the page pool of batches (kv_paged.py).

Types (llama.cpp's -ctk / -ctv names; K and V may differ):

| name | Type | a head's row (D values) | bytes per value, D = 64 |
|---|---|---|---|
| f32  | F32  | floats | 4 |
| f16  | F16  | halves (the default) | 2 |
| q8_0 | Q8_0 | llama.cpp's blocks of 32: int8 and an F16 scale | 1.0625 |
| q4_0 | Q4_0 | llama.cpp's blocks of 32: 4-bit and an F16 scale | 0.5625 |
| int8 | I8   | int8, one F32 scale per (token, head), symmetric | 1.0625 |

An int8 row is written once, when its token is computed: scale = max|x| / 127 over the
head, q = round(x / scale) (set_rows into an I8 pool). Only the attention op reads the
quantized types (gg.attention): the three-node graph reads F16 and F32 rows.

Shapes are numpy order: Hkv = n_head_kv, D = head_dim.
"""
import numpy as np

from ggml_py.core import ops
from ggml_py.core.quants import dequantize, quantize
from ggml_py.core.types import Type, row_bytes

KV_TYPE_NAMES = {"f32": Type.F32, "f16": Type.F16, "q8_0": Type.Q8_0, "q4_0": Type.Q4_0,
                 "int8": Type.I8}
KV_TYPES = tuple(KV_TYPE_NAMES.values())
GRAPH_KV_TYPES = (Type.F16, Type.F32)     # what the three-node attention reads


def kv_type(value, where):
    """A KV cache type from a Type or its name ('f16', 'q8_0', 'int8', 'I8' ...);
    ValueError naming `where` for any other."""
    if isinstance(value, str) and value.lower() in KV_TYPE_NAMES:
        return KV_TYPE_NAMES[value.lower()]
    t = Type.of(value, where)
    if t not in KV_TYPES:
        raise ValueError(f"{where} must be one of {', '.join(KV_TYPE_NAMES)}, got {t.name}")
    return t


def kv_type_name(t):
    """The -ctk / -ctv name of a KV type ('int8' for I8)."""
    return next(name for name, v in KV_TYPE_NAMES.items() if v == t)


def row_bytes_per_token(type, n_head_kv, head_dim):
    """Bytes of one token's row of one layer (K or V) in `type`, scales included."""
    if type == Type.I8:
        return n_head_kv * (head_dim + 4)
    return row_bytes(type, n_head_kv * head_dim)


class AttentionKV:
    """What the attention op reads of one layer: the written pools k, v (Hkv, slots, D)
    and, for I8 pools, their scales (Hkv, slots, 1)."""

    def __init__(self, k, v, k_scales=None, v_scales=None):
        self.k, self.v, self.k_scales, self.v_scales = k, v, k_scales, v_scales


class KVRows:
    """k[l], v[l] (Hkv, n_slots, D) of every layer, head-major: numpy arrays of F32 / F16
    values, Q8_0 / Q4_0 blocks (uint8 (Hkv, n_slots, bytes of D values)), or int8 with
    k_scales[l] / v_scales[l] (Hkv, n_slots) float32 (None for the other types).

    Head-major because attention reads one head's rows over many slots: that way they lie
    one after the other (a page's slots in one run of memory), not a slot's width apart.
    The numpy helpers below take and give a token's heads side by side, (slots, Hkv*D)."""

    def __init__(self, n_layer, n_slots, n_head_kv, head_dim, type_k, type_v, what):
        self.type_k, self.type_v = type_k, type_v
        self.n_head_kv, self.head_dim = n_head_kv, head_dim
        for t in (type_k, type_v):
            if t in (Type.Q8_0, Type.Q4_0) and head_dim % 32:
                raise ValueError(f"a {t.name} KV cache needs a head size that is a multiple "
                                 f"of 32, not {head_dim}")
        try:
            self.k = [self._rows(type_k, n_slots) for _ in range(n_layer)]
            self.v = [self._rows(type_v, n_slots) for _ in range(n_layer)]
            self.k_scales = self._scales(type_k, n_layer, n_slots)
            self.v_scales = self._scales(type_v, n_layer, n_slots)
        except (MemoryError, ValueError, OverflowError):   # numpy: "array is too big"
            size = n_layer * n_slots * (row_bytes_per_token(type_k, n_head_kv, head_dim)
                                        + row_bytes_per_token(type_v, n_head_kv, head_dim))
            raise ValueError(f"cannot allocate {what}: {size / 2**30:.1f} GiB") from None

    def _rows(self, type, n_slots):
        D = self.head_dim
        if type in (Type.F32, Type.F16, Type.I8):
            dtype = {Type.F32: np.float32, Type.F16: np.float16, Type.I8: np.int8}[type]
            return np.zeros((self.n_head_kv, n_slots, D), dtype)
        return np.zeros((self.n_head_kv, n_slots, row_bytes(type, D)), np.uint8)

    def _scales(self, type, n_layer, n_slots):
        if type != Type.I8:
            return None
        return [np.zeros((self.n_head_kv, n_slots), np.float32) for _ in range(n_layer)]

    @property
    def nbytes(self):
        """Bytes of every row and scale."""
        arrays = self.k + self.v + (self.k_scales or []) + (self.v_scales or [])
        return sum(a.nbytes for a in arrays)

    def bytes_per_token(self):
        """Bytes one token holds over all layers, K and V."""
        return len(self.k) * (row_bytes_per_token(self.type_k, self.n_head_kv, self.head_dim)
                              + row_bytes_per_token(self.type_v, self.n_head_kv, self.head_dim))

    # ---- graph ops ---------------------------------------------------------------------

    def leaves(self, ctx, il, name):
        """Tensors over layer il's pools (Hkv, n_slots, D) and scales (Hkv, n_slots, 1):
        (k, v, k_scales, v_scales)."""
        shape = self.k[il].shape[:2] + (self.head_dim,)
        out = [ctx.from_buffer(self.k[il], self.type_k, shape, name=f"{name}_k.{il}"),
               ctx.from_buffer(self.v[il], self.type_v, shape, name=f"{name}_v.{il}")]
        for scales, which in ((self.k_scales, "k"), (self.v_scales, "v")):
            out.append(None if scales is None else
                       ctx.from_buffer(scales[il], Type.F32, scales[il].shape + (1,),
                                       name=f"{name}_{which}_scales.{il}"))
        return out

    def store(self, ctx, il, k, v, slots, name):
        """Graph ops of layer il: write k, v (T, Hkv*D) F32 into the rows at `slots`
        (I32 (T,)); the written pools as an AttentionKV, to be read after the writes."""
        pool_k, pool_v, k_scales, v_scales = self.leaves(ctx, il, name)
        return AttentionKV(ops.set_rows(pool_k, self.by_head(k), slots, k_scales),
                           ops.set_rows(pool_v, self.by_head(v), slots, v_scales),
                           k_scales, v_scales)

    def by_head(self, x):
        """A view of rows x (T, Hkv*D) as (Hkv, T, D), the pools' order."""
        T = x.shape[0]
        return ops.permute(ops.reshape(x, (T, self.n_head_kv, self.head_dim)), (1, 0, 2))

    # ---- rows in numpy (context shift) -----------------------------------------------------

    def keys_f32(self, il, slots):
        """Layer il's K rows at `slots` as float32 (len(slots), Hkv*D)."""
        return self._values(self.type_k, self.k[il], self.k_scales and self.k_scales[il], slots)

    def set_keys(self, il, slots, rows):
        """Write float32 K rows (len(slots), Hkv*D) at `slots`, in the cache's type (the
        same quantizers as the graph's set_rows)."""
        t, D = self.type_k, self.head_dim
        heads = rows.reshape(len(slots), self.n_head_kv, D).transpose(1, 0, 2)   # (Hkv, n, D)
        if t == Type.I8:
            amax = np.abs(heads).max(axis=2)
            scale = (amax / np.float32(127)).astype(np.float32)
            inv = np.divide(np.float32(1), scale, out=np.zeros_like(scale), where=scale != 0)
            self.k[il][:, slots] = np.rint(heads * inv[:, :, None]).astype(np.int8)   # ties to even
            self.k_scales[il][:, slots] = scale
        elif t in (Type.F32, Type.F16):
            self.k[il][:, slots] = heads
        else:
            self.k[il][:, slots] = quantize(heads, t, reference=False)

    def copy(self, il, src, dst):
        """Copy layer il's K and V rows (and scales) from slots src to slots dst."""
        self.k[il][:, dst] = self.k[il][:, src]
        if self.k_scales is not None:
            self.k_scales[il][:, dst] = self.k_scales[il][:, src]
        self.move(il, src, dst)

    def move(self, il, src, dst):
        """Copy layer il's V rows (and scales) from slots src to slots dst."""
        self.v[il][:, dst] = self.v[il][:, src]
        if self.v_scales is not None:
            self.v_scales[il][:, dst] = self.v_scales[il][:, src]

    def _values(self, type, rows, scales, slots):
        n, D = len(slots), self.head_dim
        if type in (Type.F32, Type.F16):
            heads = rows[:, slots].astype(np.float32)                        # (Hkv, n, D)
        elif type == Type.I8:
            heads = rows[:, slots].astype(np.float32) * scales[:, slots][:, :, None]
        else:
            heads = dequantize(rows[:, slots], type, (self.n_head_kv, n, D))
        return heads.transpose(1, 0, 2).reshape(n, self.n_head_kv * D)   # (a copy)
