"""Not PyTorch: a numpy stand-in for the few torch calls scripts/subjects/torch_subject.py makes,
so a host test (tests/cli/subject_rows.rs) drives that subject's protocol plumbing — the rows
schedule, the batched [B, in] projections, the lanes and the tape — where torch is not installed.
Its numbers are numpy's (f32; bf16 as f32 values rounded to bf16), never evidence about torch.
"""
import contextlib
import numpy as np

__version__ = "numpy-shim"


class _Dt:
    def __init__(self, name, np_dtype):
        self.name, self.np = name, np_dtype


float32 = _Dt("float32", np.float32)
bfloat16 = _Dt("bfloat16", None)
int32 = _Dt("int32", np.int32)
int64 = _Dt("int64", np.int64)
uint8 = _Dt("uint8", np.uint8)


class device:
    def __init__(self, type, index=None):
        self.type = type


def _bf16(a):
    b = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    b = ((b + 0x7FFF + ((b >> 16) & 1)) >> 16) << 16
    return b.astype(np.uint32).view(np.float32)


def _w(a):
    return np.asarray(a).view(T)


class T(np.ndarray):
    def to(self, x):
        if x is bfloat16:
            return _w(_bf16(self))
        if isinstance(x, _Dt):
            return _w(np.asarray(self).astype(x.np))
        return self

    def float(self):
        return _w(np.asarray(self).astype(np.float32))

    def long(self):
        return _w(np.asarray(self).astype(np.int64))

    def cpu(self):
        return self

    def contiguous(self):
        return _w(np.ascontiguousarray(self))

    def t(self):
        return _w(np.asarray(self).T)

    def numel(self):
        return self.size

    def unsqueeze(self, d):
        return _w(np.expand_dims(np.asarray(self), d))

    def repeat_interleave(self, n, dim):
        return _w(np.repeat(np.asarray(self), n, axis=dim))

    def mean(self, dim, keepdim=False):
        return _w(np.mean(np.asarray(self), axis=dim, keepdims=keepdim).astype(np.float32))

    def view(self, *args):
        if args and isinstance(args[0], _Dt):
            return _w(np.ascontiguousarray(self).view(args[0].np))
        if args and all(isinstance(a, int) for a in args):
            return _w(np.asarray(self).reshape(args))
        return np.ndarray.view(self, *args)


class _Cuda:
    @staticmethod
    def is_available():
        return False


cuda = _Cuda()


class _Backends:
    class cuda:
        class matmul:
            allow_tf32 = False


backends = _Backends()


def set_float32_matmul_precision(p):
    pass


def no_grad():
    return contextlib.nullcontext()


def _np(d):
    return np.float32 if d is None else (np.float32 if d is bfloat16 else d.np)


def tensor(v, dtype=None, device=None):
    return _w(np.array(v, dtype=_np(dtype)))


def frombuffer(data, dtype):
    if dtype is bfloat16:
        u = np.frombuffer(bytes(data), dtype="<u2").astype(np.uint32) << 16
        return _w(u.view(np.float32))
    return _w(np.frombuffer(bytes(data), dtype=dtype.np).copy())


def zeros(*shape, device=None):
    if len(shape) == 1 and isinstance(shape[0], tuple):
        shape = shape[0]
    return _w(np.zeros(shape, dtype=np.float32))


def arange(a, b, dtype=None, device=None):
    return _w(np.arange(a, b, dtype=_np(dtype)))


class Generator:
    def manual_seed(self, s):
        self.rng = np.random.default_rng(s)
        return self


def randn(n, generator=None):
    return _w(generator.rng.standard_normal(n).astype(np.float32))


def cat(xs, dim=0):
    return _w(np.concatenate([np.asarray(x) for x in xs], axis=dim))


def stack(xs, dim=0):
    return _w(np.stack([np.asarray(x) for x in xs], axis=dim))


def einsum(eq, *xs):
    return _w(np.einsum(eq, *[np.asarray(x) for x in xs]).astype(np.float32))


def softmax(x, dim):
    x = np.asarray(x)
    e = np.exp(x - x.max(axis=dim, keepdims=True))
    return _w((e / e.sum(axis=dim, keepdims=True)).astype(np.float32))


def sigmoid(x):
    return _w((1 / (1 + np.exp(-np.asarray(x)))).astype(np.float32))


def exp(x):
    return _w(np.exp(np.asarray(x)))


def sqrt(x):
    return _w(np.sqrt(np.asarray(x)))


def isnan(x):
    return _w(np.isnan(np.asarray(x)))


def full_like(x, v):
    return _w(np.full_like(np.asarray(x), v))


def where(c, a, b):
    return _w(np.where(np.asarray(c), np.asarray(a), np.asarray(b)))


def minimum(a, b):
    return _w(np.minimum(np.asarray(a), np.asarray(b)))


def clamp(x, lo, hi):
    return _w(np.clip(np.asarray(x), lo, hi).astype(np.float32))


class _TopK:
    def __init__(self, values):
        self.values = values


def topk(x, k, dim=-1):
    s = -np.sort(-np.asarray(x), axis=dim)
    return _TopK(_w(np.take(s, range(k), axis=dim)))


def argmax(x, dim=None):
    return _w(np.argmax(np.asarray(x), axis=dim))
