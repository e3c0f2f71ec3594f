"""FLOPs and bytes of one operator call, from what ``record_shapes`` puts in the trace: each
input's dtype (``Input type``), shape (``Input Dims``) and, from PyTorch 2.4 on, the scalar
and list arguments as text (``Concrete Inputs``: a convolution's stride, padding, dilation
and groups, an attention's ``is_causal``, a reduction's dims).

Conventions (those of ``torch.utils.flop_counter``, so the two can be checked against each
other, and of the MFU formulas of training scripts):

- a multiply-add is 2 FLOPs; a matrix product ``[m,k] @ [k,n]`` is ``2·m·k·n``; bias
  additions of GEMMs and convolutions are not counted;
- a convolution is ``2·N·C_out·(C_in/groups)·prod(kernel)·prod(output)`` (a transposed one
  over its input's positions); its backward is the forward once per gradient asked for
  (``output_mask``). ``flop_counter`` counts a grouped convolution's weight gradient as if
  ungrouped (``groups`` times too many); here it is what the math does;
- attention: ``2·b·h_q·s_q·s_k·(d_q + d_v)`` forward, ``2·b·h_q·s_q·s_k·(3·d_q + 2·d_v)``
  backward (the scores recomputed). These *model* FLOPs count causal attention dense, as
  ``flop_counter`` and the MFU formulas do; the *executed* FLOPs (what the kernel computes,
  which a causal kernel skips above the diagonal) count the unmasked pairs only;
- every other class counts one FLOP per output element (normalisations and softmax a few:
  ``_PER_ELEMENT``). They are bound by memory, where the FLOPs matter little.

Bytes are the compulsory traffic: every tensor input read once, every output written once
(what a kernel that reuses nothing through the caches moves at the least). An optimizer's
step is modelled in ``_table``, from the parameters' gradients, since its tensor lists carry
no shapes.

Each function here runs once per distinct (operator, shapes, dtypes, arguments), never per
event.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["CLASSES", "MATRIX_CLASSES", "Cost", "cost", "op_class", "DTYPES"]

CLASSES = ("gemm", "conv", "attention", "elementwise", "norm", "softmax", "reduction", "embedding", "copy", "optimizer")
MATRIX_CLASSES = ("gemm", "conv", "attention")

# Input type -> (dtype as proflab names it, bytes per element)
DTYPES: dict[str, tuple[str, int]] = {
    "float": ("fp32", 4), "double": ("fp64", 8), "c10::Half": ("fp16", 2), "c10::BFloat16": ("bf16", 2),
    "c10::Float8_e4m3fn": ("fp8", 1), "c10::Float8_e5m2": ("fp8", 1), "c10::Float8_e4m3fnuz": ("fp8", 1),
    "c10::Float8_e5m2fnuz": ("fp8", 1), "c10::Float8_e8m0fnu": ("fp8", 1),
    "long int": ("int64", 8), "long long": ("int64", 8), "int": ("int32", 4), "short int": ("int16", 2), "short": ("int16", 2),
    "signed char": ("int8", 1), "unsigned char": ("uint8", 1), "bool": ("bool", 1),
    "c10::complex<float>": ("complex64", 8), "c10::complex<double>": ("complex128", 16), "c10::complex<c10::Half>": ("complex32", 4),
}  # fmt: skip
# torch's ScalarType codes, as a dtype argument's concrete text gives them
_SCALAR_TYPES = {0: ("uint8", 1), 1: ("int8", 1), 2: ("int16", 2), 3: ("int32", 4), 4: ("int64", 8), 5: ("fp16", 2),
                 6: ("fp32", 4), 7: ("fp64", 8), 9: ("complex64", 8), 10: ("complex128", 16), 11: ("bool", 1),
                 15: ("bf16", 2), 23: ("fp8", 1), 24: ("fp8", 1), 25: ("fp8", 1), 26: ("fp8", 1)}  # fmt: skip


@dataclass(frozen=True)
class Cost:
    """One operator call: ``flops`` (model FLOPs), ``exec_flops`` (executed: causal attention
    only its unmasked part), ``bytes`` (compulsory traffic, None when the shapes cannot say),
    ``dtype`` (the compute dtype: "bf16", "fp16", "fp8", "fp32", "fp64", ...)."""

    cls: str
    flops: int
    exec_flops: int
    bytes: int | None
    dtype: str | None


class _Unknown(Exception):
    """The shapes or arguments do not describe the call as the formula needs (the message says why)."""


class _Call:
    """One call's inputs, decoded: ``tensors`` are (position, shape, dtype, bytes per element)."""

    def __init__(self, name: str, types: str | None, dims: str | None, concrete: str | None) -> None:
        if dims is None or types is None:
            raise _Unknown("no input shapes recorded (record_shapes off)")
        try:
            self.dims = json.loads(dims)
        except ValueError:
            raise _Unknown("input shapes not readable") from None
        self.types = types.split(",")
        if not isinstance(self.dims, list) or len(self.types) != len(self.dims):
            raise _Unknown("input shapes and types do not match")
        self.concrete = None
        if concrete is not None:
            try:
                c = json.loads(concrete)
                self.concrete = c if isinstance(c, list) else None
            except ValueError:
                pass
        self.name = name
        self.tensors = []
        for i, (t, d) in enumerate(zip(self.types, self.dims)):
            dt = DTYPES.get(t)
            if dt is not None and isinstance(d, list) and all(isinstance(x, int) and x >= 0 for x in d):
                self.tensors.append((i, d, dt[0], dt[1]))

    def tensor(self, pos: int) -> tuple[list[int], str, int]:
        """The shape, dtype and element size of the tensor input at ``pos``."""
        for i, d, dt, e in self.tensors:
            if i == pos:
                return d, dt, e
        raise _Unknown(f"input {pos} is not a tensor with a recorded shape")

    def has_tensor(self, pos: int) -> bool:
        return any(i == pos for i, *_ in self.tensors)

    def arg(self, pos: int) -> str:
        """The concrete text of argument ``pos`` ('' where it is a tensor or None)."""
        if self.concrete is None:
            raise _Unknown("no concrete inputs recorded (PyTorch before 2.4 records no stride, padding or flags)")
        if pos >= len(self.concrete) or not isinstance(self.concrete[pos], str):
            raise _Unknown(f"argument {pos} not recorded")
        return self.concrete[pos]

    def ints(self, pos: int, n: int | None = None) -> list[int]:
        text = self.arg(pos)
        try:
            v = json.loads(text)
        except ValueError:
            raise _Unknown(f"argument {pos} ({text!r}) is not a list of integers") from None
        v = [v] if isinstance(v, int) else v
        if not isinstance(v, list) or not all(isinstance(x, int) for x in v):
            raise _Unknown(f"argument {pos} ({text!r}) is not a list of integers")
        if n is not None and len(v) == 1 and n > 1:
            v = v * n
        if n is not None and len(v) != n:
            raise _Unknown(f"argument {pos} ({text!r}) has not {n} values")
        return v

    def int(self, pos: int, default: int | None = None) -> int:
        text = self.arg(pos) if self.concrete is not None or default is None else ""
        if text in ("", "None"):
            if default is None:
                raise _Unknown(f"argument {pos} not recorded")
            return default
        try:
            return int(text)
        except ValueError:
            raise _Unknown(f"argument {pos} ({text!r}) is not an integer") from None

    def bool(self, pos: int, default: bool | None = None) -> bool:
        text = self.arg(pos) if self.concrete is not None or default is None else ""
        if text in ("True", "False"):
            return text == "True"
        if default is None:
            raise _Unknown(f"argument {pos} ({text!r}) is not a flag")
        return default

    def bools(self, pos: int) -> list[bool]:
        text = self.arg(pos)
        words = [w.strip() for w in text.strip("[]").split(",") if w.strip()]
        if not words or any(w not in ("True", "False") for w in words):
            raise _Unknown(f"argument {pos} ({text!r}) is not a list of flags")
        return [w == "True" for w in words]

    def scalar_type(self, pos: int) -> tuple[str, int] | None:
        """A dtype argument (torch's ScalarType code as text); None when not given."""
        if self.concrete is None or pos >= len(self.concrete) or self.concrete[pos] in ("", "None"):
            return None
        try:
            return _SCALAR_TYPES.get(int(self.concrete[pos]))
        except (ValueError, TypeError):
            return None


def _numel(shape: list[int]) -> int:
    return math.prod(shape)


def _broadcast(shapes: list[list[int]]) -> list[int]:
    n = max((len(s) for s in shapes), default=0)
    out = [1] * n
    for s in shapes:
        for i, x in enumerate(s, start=n - len(s)):
            if x != 1:
                if out[i] not in (1, x):
                    raise _Unknown(f"shapes {shapes} do not broadcast")
                out[i] = x
    return out


def _input_bytes(c: _Call) -> int:
    return sum(_numel(d) * e for _, d, _, e in c.tensors)


# -- matrix products ----------------------------------------------------------------------

def _mm(c: _Call, a: int, b: int, out_dtype: int | None = None) -> Cost:
    (sa, dt, e), (sb, _, _) = c.tensor(a), c.tensor(b)
    if len(sa) != 2 or len(sb) != 2 or sa[1] != sb[0]:
        raise _Unknown(f"{sa} @ {sb} is not a matrix product")
    m, k, n = sa[0], sa[1], sb[1]
    od = c.scalar_type(out_dtype) if out_dtype is not None else None
    out_e = od[1] if od else e
    fl = 2 * m * k * n
    return Cost("gemm", fl, fl, _input_bytes(c) + m * n * out_e, dt)


def _bmm(c: _Call, a: int, b: int, reduce_batch: bool = False) -> Cost:
    (sa, dt, e), (sb, _, _) = c.tensor(a), c.tensor(b)
    if len(sa) != 3 or len(sb) != 3 or sa[2] != sb[1] or sa[0] != sb[0]:
        raise _Unknown(f"{sa} @ {sb} is not a batched matrix product")
    bt, m, k, n = sa[0], sa[1], sa[2], sb[2]
    fl = 2 * bt * m * k * n
    return Cost("gemm", fl, fl, _input_bytes(c) + (1 if reduce_batch else bt) * m * n * e, dt)


def _mv(c: _Call, a: int, v: int) -> Cost:
    (sa, dt, e), (sv, _, _) = c.tensor(a), c.tensor(v)
    if len(sa) != 2 or len(sv) != 1 or sa[1] != sv[0]:
        raise _Unknown(f"{sa} @ {sv} is not a matrix-vector product")
    fl = 2 * sa[0] * sa[1]
    return Cost("gemm", fl, fl, _input_bytes(c) + sa[0] * e, dt)


def _dot(c: _Call) -> Cost:
    (sa, dt, e), (sb, _, _) = c.tensor(0), c.tensor(1)
    if len(sa) != 1 or sa != sb:
        raise _Unknown(f"{sa} . {sb} is not a dot product")
    return Cost("gemm", 2 * sa[0], 2 * sa[0], _input_bytes(c) + e, dt)


# -- convolutions -------------------------------------------------------------------------

# per operator: positions of input, weight, stride, padding, dilation, transposed (a position,
# or the constant), output_padding, groups (a position, or the constant)
_CONV_ARGS: dict[str, tuple] = {
    "aten::convolution": (0, 1, 3, 4, 5, 6, 7, 8),
    "aten::_convolution": (0, 1, 3, 4, 5, 6, 7, 8),
    "aten::convolution_overrideable": (0, 1, 3, 4, 5, 6, 7, 8),
    "aten::cudnn_convolution": (0, 1, 3, 2, 4, False, None, 5),
    "aten::cudnn_convolution_transpose": (0, 1, 4, 2, 5, True, 3, 6),
    "aten::miopen_convolution": (0, 1, 4, 3, 5, False, None, 6),
    "aten::miopen_convolution_transpose": (0, 1, 5, 3, 6, True, 4, 7),
    "aten::mkldnn_convolution": (0, 1, 4, 3, 5, False, None, 6),
}


def _conv_forward_flops(x: list[int], w: list[int], out_spatial: list[int], transposed: bool) -> int:
    """2·N·prod(weight)·prod(positions): each output position (input position, transposed)
    meets the whole filter of C_out·C_in/groups·prod(kernel) weights."""
    return 2 * x[0] * _numel(w) * _numel(x[2:] if transposed else out_spatial)


def _conv(c: _Call) -> Cost:
    xi, wi, si, pi, di, ti, oi, gi = _CONV_ARGS[c.name]
    (x, dt, e), (w, _, we) = c.tensor(xi), c.tensor(wi)
    nd = len(x) - 2
    if nd < 1 or len(w) != len(x):
        raise _Unknown(f"input {x} and weight {w} are not a convolution's")
    stride, padding, dilation = c.ints(si, nd), c.ints(pi, nd), c.ints(di, nd)
    transposed = ti if isinstance(ti, bool) else c.bool(ti)
    groups = c.int(gi)
    k = w[2:]
    if transposed:
        outpad = c.ints(oi, nd) if oi is not None else [0] * nd
        out = [(i - 1) * s - 2 * p + d * (kk - 1) + op + 1 for i, s, p, d, kk, op in zip(x[2:], stride, padding, dilation, k, outpad)]
        c_out = w[1] * groups
    else:
        out = [(i + 2 * p - d * (kk - 1) - 1) // s + 1 for i, s, p, d, kk in zip(x[2:], stride, padding, dilation, k)]
        c_out = w[0]
    if min(out, default=0) <= 0 or min(stride) <= 0:
        raise _Unknown(f"input {x}, weight {w}, stride {stride}, padding {padding}: no output")
    fl = _conv_forward_flops(x, w, out, transposed)
    return Cost("conv", fl, fl, _input_bytes(c) + x[0] * c_out * _numel(out) * e, dt)


def _conv_backward(c: _Call) -> Cost:
    """convolution_backward(grad_output, input, weight, bias_sizes, stride, padding, dilation,
    transposed, output_padding, groups, output_mask): the shapes give the output's, so only
    the flags are read."""
    (go, dt, e), (x, _, xe), (w, _, we) = c.tensor(0), c.tensor(1), c.tensor(2)
    if len(go) != len(x) or len(w) != len(x) or len(x) < 3:
        raise _Unknown(f"grad {go}, input {x}, weight {w} are not a convolution's")
    transposed = c.bool(7)
    mask = c.bools(10)
    gi, gw = mask[0], mask[1] if len(mask) > 1 else False
    fwd = _conv_forward_flops(x, w, go[2:], transposed)
    fl = fwd * (int(gi) + int(gw))
    moved = _numel(go) * e + (_numel(x) * xe if gw else 0) + (_numel(w) * we if gi else 0)  # read
    moved += (_numel(x) * xe if gi else 0) + (_numel(w) * we if gw else 0)  # written
    return Cost("conv", fl, fl, moved, dt)


# -- attention ----------------------------------------------------------------------------

# per operator: forward or backward, layout, positions of query, key and value, where is_causal
# is (or the efficient kernels' custom mask type, "mask:N"), and where the cumulative sequence
# lengths of variable-length attention are (None: it has none). The composite
# ``aten::scaled_dot_product_attention`` is not here: the kernel it picks is (its math
# fallback's matrix products and softmax are modelled one by one, dense as they run).
_ATTN: dict[str, tuple[str, str, tuple[int, int, int], str | int, int | None]] = {
    "aten::_scaled_dot_product_flash_attention": ("fwd", "bhsd", (0, 1, 2), 4, None),
    "aten::_scaled_dot_product_flash_attention_for_cpu": ("fwd", "bhsd", (0, 1, 2), 4, None),
    "aten::_scaled_dot_product_efficient_attention": ("fwd", "bhsd", (0, 1, 2), 6, None),
    "aten::_scaled_dot_product_cudnn_attention": ("fwd", "bhsd", (0, 1, 2), 6, None),
    "aten::_scaled_dot_product_fused_attention_overrideable": ("fwd", "bhsd", (0, 1, 2), 5, None),
    "aten::_flash_attention_forward": ("fwd", "bshd", (0, 1, 2), 8, 3),
    "aten::_efficient_attention_forward": ("fwd", "bshd", (0, 1, 2), "mask:9", 4),
    "flash_attn::_flash_attn_forward": ("fwd", "bshd", (0, 1, 2), 5, None),
    "aten::_scaled_dot_product_flash_attention_backward": ("bwd", "bhsd", (1, 2, 3), 11, None),
    "aten::_scaled_dot_product_flash_attention_for_cpu_backward": ("bwd", "bhsd", (1, 2, 3), 7, None),
    "aten::_scaled_dot_product_efficient_attention_backward": ("bwd", "bhsd", (1, 2, 3), 11, None),
    "aten::_scaled_dot_product_cudnn_attention_backward": ("bwd", "bhsd", (1, 2, 3), 14, None),
    "aten::_scaled_dot_product_fused_attention_overrideable_backward": ("bwd", "bhsd", (1, 2, 3), 13, None),
    "aten::_flash_attention_backward": ("bwd", "bshd", (1, 2, 3), 11, 6),
    "aten::_efficient_attention_backward": ("bwd", "bshd", (1, 2, 3), "mask:14", 6),
    "flash_attn::_flash_attn_backward": ("bwd", "bshd", (1, 2, 3), 11, None),
}


def causal_fraction(s_q: int, s_k: int) -> float:
    """The share of (query, key) pairs a causal mask keeps (aligned at the top left, as
    ``is_causal`` is): ``sum over i < s_q of min(i + 1, s_k)`` over ``s_q·s_k``."""
    if s_q <= 0 or s_k <= 0:
        return 0.0
    m = min(s_q, s_k)
    pairs = m * (m + 1) // 2 + (s_q - m) * s_k
    return pairs / (s_q * s_k)


def _attention(c: _Call) -> Cost:
    kind, layout, (qi, ki, vi), causal_at, varlen = _ATTN[c.name]
    if varlen is not None and c.has_tensor(varlen):
        raise _Unknown("variable-length attention: the sequences' lengths are in a tensor, not in the trace")
    (q, dt, e), (k, _, _), (v, _, _) = c.tensor(qi), c.tensor(ki), c.tensor(vi)
    if len(q) != 4 or len(k) != 4 or len(v) != 4:
        raise _Unknown(f"query {q}, key {k}, value {v} are not 4-d (variable-length attention is not modelled)")
    if layout == "bshd":
        q, k, v = ([s[0], s[2], s[1], s[3]] for s in (q, k, v))
    b, h_q, s_q, d_q = q
    _, h_kv, s_k, d_k = k
    d_v = v[3]
    if d_q != d_k or k[2] != v[2] or h_kv == 0 or h_q % h_kv or b != k[0] or b != v[0]:
        raise _Unknown(f"query {q}, key {k}, value {v} do not make an attention")
    if isinstance(causal_at, str):  # the efficient kernels' custom mask type: 0 none, 1 and 2 causal
        causal = c.int(int(causal_at.split(":")[1]), default=0) in (1, 2)
    else:
        causal = c.bool(causal_at)
    pairs = b * h_q * s_q * s_k
    if kind == "fwd":
        fl = 2 * pairs * (d_q + d_v)
        out = b * h_q * s_q * d_v * e + b * h_q * s_q * 4  # the output and its log-sum-exp (fp32)
    else:
        fl = 2 * pairs * (3 * d_q + 2 * d_v)
        out = _numel(q) * e + _numel(k) * e + _numel(v) * e  # dq, dk, dv
    ex = round(fl * causal_fraction(s_q, s_k)) if causal else fl
    return Cost("attention", fl, ex, _input_bytes(c) + out, dt)


# -- memory-bound classes ------------------------------------------------------------------

_UNARY = (
    "neg abs exp exp2 expm1 log log2 log10 log1p sqrt rsqrt reciprocal sin cos tan sinh cosh tanh asin acos atan sigmoid "
    "relu gelu silu mish elu selu celu leaky_relu hardtanh hardswish hardsigmoid softplus softshrink hardshrink erf erfc "
    "erfinv sign sgn floor ceil round trunc frac nan_to_num logit clamp clamp_min clamp_max square bitwise_not "
    "logical_not isnan isinf isfinite positive threshold glu prelu _prelu_kernel relu6 log_sigmoid_forward"
).split()
_BINARY = (
    "add sub mul div rsub maximum minimum fmax fmin pow eq ne lt gt le ge fmod remainder floor_divide bitwise_and "
    "bitwise_or bitwise_xor logical_and logical_or logical_xor copysign hypot atan2 xlogy where masked_fill lerp addcmul "
    "addcdiv threshold_backward gelu_backward silu_backward sigmoid_backward tanh_backward elu_backward "
    "hardtanh_backward leaky_relu_backward mish_backward softplus_backward hardswish_backward hardsigmoid_backward "
    "native_dropout native_dropout_backward _masked_scale mse_loss_backward smooth_l1_loss_backward "
    "log_sigmoid_backward _prelu_kernel_backward glu_backward"
).split()
_ELEMENTWISE = {f"aten::{n}{s}" for n in _UNARY + _BINARY for s in ("", "_")}
_NORM = {f"aten::{n}" for n in (
    "native_layer_norm native_layer_norm_backward layer_norm native_batch_norm native_batch_norm_backward batch_norm "
    "_native_batch_norm_legit _native_batch_norm_legit_no_training cudnn_batch_norm cudnn_batch_norm_backward "
    "miopen_batch_norm miopen_batch_norm_backward native_group_norm native_group_norm_backward group_norm rms_norm "
    "_fused_rms_norm _fused_rms_norm_backward instance_norm batch_norm_backward"
).split()}
_SOFTMAX = {f"aten::{n}" for n in (
    "softmax _softmax log_softmax _log_softmax _softmax_backward_data _log_softmax_backward_data _safe_softmax"
).split()}
# reductions: where their ``dim`` argument is
_REDUCTION_DIM = {
    "aten::sum": 1, "aten::mean": 1, "aten::amax": 1, "aten::amin": 1, "aten::max": 1, "aten::min": 1, "aten::prod": 1,
    "aten::argmax": 1, "aten::argmin": 1, "aten::logsumexp": 1, "aten::var": 1, "aten::std": 1, "aten::var_mean": 1,
    "aten::std_mean": 1, "aten::any": 1, "aten::all": 1, "aten::norm": 2, "aten::linalg_vector_norm": 2,
    "aten::cumsum": None, "aten::cumprod": None, "aten::nll_loss_forward": "nll", "aten::nll_loss2d_forward": "nll",
    "aten::nll_loss_backward": "nll_backward", "aten::nll_loss2d_backward": "nll_backward", "aten::mse_loss": -1,
    "aten::binary_cross_entropy_with_logits": -1, "aten::max_pool2d_with_indices": "pool",
    "aten::max_pool3d_with_indices": "pool", "aten::max_pool2d_with_indices_backward": "pool_backward",
    "aten::max_pool3d_with_indices_backward": "pool_backward", "aten::avg_pool2d": "pool", "aten::avg_pool3d": "pool",
    "aten::avg_pool2d_backward": "pool_backward", "aten::avg_pool3d_backward": "pool_backward",
    "aten::_adaptive_avg_pool2d": "pool", "aten::_adaptive_avg_pool2d_backward": "pool_backward",
    "aten::adaptive_avg_pool2d": "pool",
}  # fmt: skip
_COPY = {f"aten::{n}" for n in (
    "copy_ _to_copy clone contiguous fill_ zero_ index_select gather index scatter scatter_add scatter_add_ "
    "index_put_ _index_put_impl_ masked_select flip roll repeat cat stack _foreach_copy_ constant_pad_nd"
).split()}
_EMBEDDING = {"aten::embedding", "aten::embedding_backward", "aten::embedding_dense_backward", "aten::_embedding_bag",
              "aten::embedding_renorm_"}
_GEMM: dict[str, Callable[[_Call], Cost]] = {
    "aten::mm": lambda c: _mm(c, 0, 1),
    "aten::_scaled_mm": lambda c: _mm(c, 0, 1, out_dtype=6),
    "aten::addmm": lambda c: _mm(c, 1, 2),
    "aten::_addmm_activation": lambda c: _mm(c, 1, 2),
    "aten::bmm": lambda c: _bmm(c, 0, 1),
    "aten::baddbmm": lambda c: _bmm(c, 1, 2),
    "aten::addbmm": lambda c: _bmm(c, 1, 2, reduce_batch=True),
    "aten::mv": lambda c: _mv(c, 0, 1),
    "aten::addmv": lambda c: _mv(c, 1, 2),
    "aten::dot": _dot,
    "aten::vdot": _dot,
}
# FLOPs per element of the memory-bound classes: rough counts (a normalisation's mean,
# variance, scale and shift), for HFU; these operators are bound by memory
_PER_ELEMENT = {"norm": 7, "norm_backward": 10, "softmax": 5, "softmax_backward": 4}


def op_class(name: str) -> str | None:
    """The operator class a name belongs to (``CLASSES``), or None when the model does not know it."""
    if name in _GEMM:
        return "gemm"
    if name in _CONV_ARGS or name == "aten::convolution_backward":
        return "conv"
    if name in _ATTN:
        return "attention"
    if name in _NORM:
        return "norm"
    if name in _SOFTMAX:
        return "softmax"
    if name in _EMBEDDING:
        return "embedding"
    if name in _REDUCTION_DIM:
        return "reduction"
    if name in _ELEMENTWISE:
        return "elementwise"
    if name in _COPY:
        return "copy"
    return None


def _main_dtype(c: _Call) -> tuple[str, int]:
    if not c.tensors:
        raise _Unknown("no tensor input with a recorded shape")
    _, _, dt, e = c.tensors[0]
    return dt, e


def _elementwise(c: _Call) -> Cost:
    if not c.tensors:
        raise _Unknown("no tensor input with a recorded shape")
    out = _broadcast([d for _, d, _, _ in c.tensors])
    dt, e = _main_dtype(c)
    n = _numel(out)
    per = 2 if any(w in c.name for w in ("addcmul", "addcdiv", "lerp")) else 1
    extra = n if c.name.startswith("aten::native_dropout") and not c.name.endswith("backward") else 0  # the mask
    return Cost("elementwise", per * n, per * n, _input_bytes(c) + n * e + extra, dt)


def _largest(c: _Call) -> tuple[list[int], str, int]:
    if not c.tensors:
        raise _Unknown("no tensor input with a recorded shape")
    _, d, dt, e = max(c.tensors, key=lambda t: _numel(t[1]))
    return d, dt, e


def _norm(c: _Call) -> Cost:
    """Forward: the input read, the output written; backward: the gradient and the input
    read, the input's gradient written (the small statistics and affine tensors: read,
    and written as their gradients' size)."""
    d, dt, e = _largest(c)
    n = _numel(d)
    back = "backward" in c.name
    per = _PER_ELEMENT["norm_backward" if back else "norm"] * n
    if c.name == "aten::_fused_rms_norm" or c.name == "aten::rms_norm":
        per = 4 * n if not back else 7 * n
    return Cost("norm", per, per, _input_bytes(c) + n * e, dt)


def _softmax(c: _Call) -> Cost:
    d, dt, e = _largest(c)
    n = _numel(d)
    back = "backward" in c.name
    out = c.scalar_type(3) if back else (c.scalar_type(2) if c.name in ("aten::softmax", "aten::log_softmax") else None)
    per = _PER_ELEMENT["softmax_backward" if back else "softmax"] * n
    return Cost("softmax", per, per, _input_bytes(c) + n * (out[1] if out else e), dt)


def _reduction(c: _Call) -> Cost:
    where = _REDUCTION_DIM[c.name]
    x, dt, e = c.tensor(0) if c.has_tensor(0) else _largest(c)
    n = _numel(x)
    if where == "nll":  # (input [N, C], target [N]): a gather of the target's class per row
        t, _, te = c.tensor(1)
        rows = _numel(t)
        return Cost("reduction", rows, rows, rows * (te + e) + e, dt)
    if where == "nll_backward":  # (grad, input [N, C], target [N], ...): the input's gradient written
        x, dt, e = c.tensor(1)
        t, _, te = c.tensor(2)
        return Cost("reduction", _numel(t), _numel(t), _numel(x) * e + _numel(t) * te, dt)
    if where == "pool":  # windows over the input; the output is smaller by the windows' stride
        return Cost("reduction", n, n, _input_bytes(c), dt)  # (its output, a fraction of the input, left out)
    if where == "pool_backward":  # (grad_output, input, ...): the input's gradient written
        d, dt, e = _largest(c)
        return Cost("reduction", _numel(d), _numel(d), _input_bytes(c) + _numel(d) * e, dt)
    if where is None:  # scans: output as large as the input
        return Cost("reduction", n, n, 2 * n * e, dt)
    if where == -1:  # losses reduced to a scalar (or, reduction='none', their elements)
        return Cost("reduction", n, n, _input_bytes(c) + e, dt)
    out = 1
    try:
        dims = c.ints(where) if c.concrete is not None and where < len(c.concrete) and c.concrete[where] not in ("", "None") else []
    except _Unknown:
        dims = []  # a scalar dim argument written otherwise: reduced over everything
    if dims and x:
        keep = [s for i, s in enumerate(x) if i not in {d % len(x) for d in dims}]
        out = _numel(keep)
    od = c.scalar_type(len(c.concrete) - 1) if c.concrete and c.name in ("aten::sum", "aten::mean") else None
    return Cost("reduction", n, n, _input_bytes(c) + out * (od[1] if od else e), dt)


def _embedding(c: _Call) -> Cost:
    if c.name in ("aten::embedding", "aten::_embedding_bag"):
        (w, dt, e), (idx, _, ie) = c.tensor(0), c.tensor(1)
        rows = _numel(idx) * w[-1]
        return Cost("embedding", 0, 0, _numel(idx) * ie + 2 * rows * e, dt)  # rows gathered and written
    if c.name == "aten::embedding_renorm_":
        (w, dt, e), (idx, _, ie) = c.tensor(0), c.tensor(1)
        rows = _numel(idx) * w[-1]
        return Cost("embedding", 3 * rows, 3 * rows, _numel(idx) * ie + 2 * rows * e, dt)
    (g, dt, e), (idx, _, ie) = c.tensor(0), c.tensor(1)  # (grad [.., D], indices, num_weights, ...)
    vocab = c.int(2)
    return Cost("embedding", _numel(g), _numel(g), _input_bytes(c) + vocab * g[-1] * e, dt)


def _copy(c: _Call) -> Cost:
    if c.name in ("aten::fill_", "aten::zero_"):
        d, dt, e = c.tensor(0)
        return Cost("copy", 0, 0, _numel(d) * e, dt)
    if c.name == "aten::copy_":  # (self, src): src read, self written
        (d, dt, e), (s, sdt, se) = c.tensor(0), c.tensor(1)
        return Cost("copy", 0, 0, _numel(s) * se + _numel(d) * e, sdt)
    if c.name == "aten::_to_copy":
        d, dt, e = c.tensor(0)
        out = c.scalar_type(1)
        return Cost("copy", 0, 0, _numel(d) * (e + (out[1] if out else e)), dt)
    if c.name in ("aten::index_select", "aten::gather"):
        (x, dt, e), (idx, _, ie) = c.tensor(0), c.tensor(2)
        dim = c.int(1) % max(1, len(x))
        rows = _numel(idx) if c.name == "aten::gather" else (_numel(x) // max(1, x[dim])) * _numel(idx)
        return Cost("copy", 0, 0, _numel(idx) * ie + 2 * rows * e, dt)
    if c.name in ("aten::clone", "aten::contiguous", "aten::flip", "aten::roll", "aten::constant_pad_nd"):
        d, dt, e = c.tensor(0)
        return Cost("copy", 0, 0, 2 * _numel(d) * e, dt)
    raise _Unknown("tensor-list inputs carry no shapes" if c.name in ("aten::cat", "aten::stack", "aten::_foreach_copy_", "aten::index")
                   else "no formula for this operator's arguments")


def cost(name: str, types: str | None, dims: str | None, concrete: str | None) -> Cost | str:
    """The cost of one call of ``name`` with these inputs (the trace's ``input_types``,
    ``input_dims`` and ``input_concrete``), or why it cannot be given."""
    cls = op_class(name)
    if cls is None:
        return "not in the model"
    try:
        c = _Call(name, types, dims, concrete)
        if cls == "gemm":
            return _GEMM[name](c)
        if cls == "conv":
            return _conv_backward(c) if name == "aten::convolution_backward" else _conv(c)
        if cls == "attention":
            return _attention(c)
        if cls == "norm":
            return _norm(c)
        if cls == "softmax":
            return _softmax(c)
        if cls == "reduction":
            return _reduction(c)
        if cls == "embedding":
            return _embedding(c)
        if cls == "copy":
            return _copy(c)
        return _elementwise(c)
    except _Unknown as e:
        return str(e)
    except (TypeError, ValueError, IndexError, ZeroDivisionError) as e:  # a damaged shape list
        return f"shapes not understood ({type(e).__name__})"
