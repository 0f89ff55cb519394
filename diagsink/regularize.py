"""Add the paper's diagonal regularizers to the ``nn.MultiheadAttention`` layers of any model.

:func:`regularize` gives every self-attention ``nn.MultiheadAttention`` of an existing model
the regularizer of :class:`~diagsink.attention.TemporalAttention`: it adds the diagonal logit
bias ``b`` of :func:`~diagsink.attention.diagonal_bias` (``-inf`` for ``"mask"``, ``-inf``
with probability ``p`` in training mode for ``"dropout"``, a constant for ``"penalty"``) to
the attention logits ``q_i · k_j / sqrt(d_h)``, next to the caller's ``attn_mask`` and
``key_padding_mask``. It does so through PyTorch's public interface: a forward pre-hook
(``register_forward_pre_hook(..., with_kwargs=True)``) passes the sum of the caller's mask
and the bias as ``attn_mask``, and the module's own forward runs unchanged. The parameters,
buffers and ``state_dict`` keys stay as they are, so a regularized model loads the original
class's weights and back, and :func:`unregularize` removes the hook.

The regularized layer equals the package's own layer with copied weights
(:func:`as_temporal_attention`): ``TemporalAttention(residual=False, norm=None)``, the
attention core without residual or LayerNorm (an ``nn.MultiheadAttention`` has neither; in
``nn.TransformerEncoderLayer`` they live outside it). The diagonal-dropout pattern is drawn
exactly as there (``torch.rand([T]) < p`` shared, ``torch.rand([N, H, T]) < p`` independent,
before the attention dropout), so the same seed gives the same pattern.

Used in the chapter "Your own model" (``book/own_model.ipynb``, part "Beyond the paper").
"""

from __future__ import annotations

import copy
import inspect
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .attention import TemporalAttention, _check_diag_args, bias_from_diagonal, diagonal_entries

__all__ = [
    "REGULARIZERS",
    "Regularizer",
    "regularize",
    "unregularize",
    "is_regularized",
    "mha_weights",
    "as_temporal_attention",
]

#: The regularizers :func:`regularize` adds (``diag=None`` is :func:`unregularize`).
REGULARIZERS = ("mask", "dropout", "penalty")

_CONFIG = "_diagsink_regularizer"  # attribute holding the Regularizer of a wrapped module
_HOOK = "_diagsink_hook"  # the handle of the pre-hook (its presence also turns off the fused
#: eval-mode path of nn.TransformerEncoderLayer, which would never call the attention module)
_NESTED = "_diagsink_use_nested_tensor"  # an encoder's use_nested_tensor before regularize
#: attribute a recorder (diagsink.probe) sets to a callable that receives the regularized
#: weights ``[N, H, L, S]`` (before attention dropout) of every call.
SINK_ATTR = "_diagsink_sink"


@dataclass(frozen=True)
class Regularizer:
    """The settings :func:`regularize` attached to one ``nn.MultiheadAttention``."""

    diag: str
    p: float = 0.2
    penalty: float = -0.1
    shared: bool = True


def _float_mask(mask: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    """A boolean mask (``True`` = not allowed) as an additive float mask; float masks unchanged."""
    if mask is None or mask.is_floating_point():
        return mask
    if mask.dtype != torch.bool:
        raise ValueError(
            f"a mask of dtype {mask.dtype} is not supported; pass a bool mask (True = not "
            "allowed to attend) or a float mask (added to the logits), as nn.MultiheadAttention."
        )
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(mask, -math.inf)


def _seq_first(mha: nn.MultiheadAttention, *tensors: torch.Tensor) -> list[torch.Tensor]:
    """``[N, T, E] -> [T, N, E]`` for ``batch_first`` modules (as the functional form wants)."""
    if mha.batch_first and tensors[0].dim() == 3:
        return [t.transpose(0, 1) for t in tensors]
    return list(tensors)


def _functional(
    mha: nn.MultiheadAttention,
    qkv: list[torch.Tensor],
    *,
    key_padding_mask: torch.Tensor | None,
    attn_mask: torch.Tensor | None,
    need_weights: bool,
    average: bool,
    dropout_p: float,
    training: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``F.multi_head_attention_forward`` with the module's parameters on sequence-first input."""
    separate = mha.in_proj_weight is None  # separate q, k, v weights (kdim or vdim != embed_dim)
    return F.multi_head_attention_forward(
        *qkv,
        mha.embed_dim,
        mha.num_heads,
        mha.in_proj_weight,
        mha.in_proj_bias,
        mha.bias_k,
        mha.bias_v,
        mha.add_zero_attn,
        dropout_p,
        mha.out_proj.weight,
        mha.out_proj.bias,
        training=training,
        key_padding_mask=key_padding_mask,
        need_weights=need_weights,
        attn_mask=attn_mask,
        use_separate_proj_weight=separate,
        q_proj_weight=mha.q_proj_weight if separate else None,
        k_proj_weight=mha.k_proj_weight if separate else None,
        v_proj_weight=mha.v_proj_weight if separate else None,
        average_attn_weights=average,
    )


def mha_weights(
    mha: nn.MultiheadAttention,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    key_padding_mask: torch.Tensor | None = None,
    attn_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """The per-head attention weights an ``nn.MultiheadAttention`` computes for these inputs.

    Recomputed from the module's own projections without dropout (``[N, H, L, S]`` for
    batched input, ``[H, L, S]`` unbatched; rows sum to 1, fully masked rows are NaN; a nested
    batch is padded, its padded query rows kept, padded keys get weight 0) and
    without gradient; the module is not called, so no hook fires and no random number is
    drawn. ``attn_mask`` may be a causal mask given with ``is_causal=True``: the hint changes
    nothing in the weights. Used by :mod:`diagsink.probe` (chapter "Your own model").
    """
    if query.is_nested:  # nn.TransformerEncoder's fast path: padded [N, T, E] and its mask
        lengths = torch.tensor([t.shape[0] for t in query.unbind()], device=query.device)
        query = key = value = query.to_padded_tensor(0.0)
        steps = torch.arange(query.shape[1], device=query.device)
        key_padding_mask = steps[None, :] >= lengths[:, None]
    with torch.no_grad():
        qkv = _seq_first(mha, query, key, value)
        _, weights = _functional(
            mha,
            qkv,
            key_padding_mask=key_padding_mask,
            attn_mask=attn_mask,
            need_weights=True,
            average=False,
            dropout_p=0.0,
            training=False,
        )
    return weights


def _same_tensor(a: torch.Tensor, b: torch.Tensor) -> bool:
    """``a`` and ``b`` are the same values: one object, or two views of the same memory."""
    if a is b:
        return True
    if a.is_nested or b.is_nested:
        return False
    return (
        a.shape == b.shape
        and a.stride() == b.stride()
        and a.dtype == b.dtype
        and a.device == b.device
        and a.data_ptr() == b.data_ptr()
    )


def _diag_bias(
    mha: nn.MultiheadAttention, cfg: Regularizer, query: torch.Tensor
) -> torch.Tensor | None:
    """The regularizer's bias for this call: ``None``, ``[T, T]`` or ``[N·H, T, T]``."""
    batched = query.dim() == 3
    length = query.shape[1 if mha.batch_first and batched else 0]
    batch = (query.shape[0 if mha.batch_first else 1],) if batched else ()
    entries = diagonal_entries(
        length,
        cfg.diag,
        diag_p=cfg.p,
        diag_penalty=cfg.penalty,
        training=mha.training,
        pattern_shape=() if cfg.shared else (*batch, mha.num_heads),  # as TemporalAttention draws
        dtype=query.dtype,
        device=query.device,
    )
    bias = bias_from_diagonal(entries, length, query.dtype, query.device)
    if bias is not None and bias.dim() > 2:  # [N, H, T, T] or [H, T, T] -> [N·H, T, T]
        bias = bias.reshape(-1, length, length)
    return bias


#: ``nn.MultiheadAttention.forward``'s parameters, to read a call's arguments by name
_MHA_SIGNATURE = inspect.signature(nn.MultiheadAttention.forward)


def _add_regularizer(self: nn.MultiheadAttention, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """Forward pre-hook: the call's ``attn_mask`` plus the diagonal bias; the forward is PyTorch's.

    Shapes as in ``nn.MultiheadAttention``: ``[N, T, E]`` (``batch_first``), ``[T, N, E]``
    or ``[T, E]``. The diagonal pattern is drawn here, before the attention dropout that the
    forward draws, as in ``TemporalAttention``: the same seed gives the same draws. Boolean
    masks become float masks (``True`` = not allowed: ``-inf``), so that the two add up.
    """
    call = _MHA_SIGNATURE.bind(self, *args, **kwargs)
    call.apply_defaults()
    a = call.arguments
    query, key = a["query"], a["key"]
    if query.is_nested:
        raise ValueError(
            "regularize() got a nested tensor (nn.TransformerEncoder's fast path); build the "
            "encoder with enable_nested_tensor=False, or pass the model through regularize() "
            "again after changing it."
        )
    if not _same_tensor(query, key):
        raise ValueError(
            "regularize() acts on self-attention, but this nn.MultiheadAttention got a query "
            "that is not its key (cross-attention: the diagonal i == j means nothing there). "
            "Leave it out with regularize(..., skip=[<its name>])."
        )
    if a["is_causal"] and a["attn_mask"] is None:
        raise ValueError(
            "is_causal=True needs the causal mask as attn_mask (as nn.MultiheadAttention): "
            "pass attn_mask=nn.Transformer.generate_square_subsequent_mask(T)."
        )
    bias = _diag_bias(self, getattr(self, _CONFIG), query)
    mask = _float_mask(a["attn_mask"], query.dtype)
    if bias is not None:
        mask = bias if mask is None else mask + bias
    a["attn_mask"], a["is_causal"] = mask, False  # the sum is no longer a causal mask alone
    a["key_padding_mask"] = _float_mask(a["key_padding_mask"], query.dtype)
    sink = getattr(self, SINK_ATTR, None)
    if sink is not None:  # a recorder wants the weights before attention dropout
        sink(mha_weights(self, query, key, a["value"], a["key_padding_mask"], mask))
    del a["self"]
    return (), a


def is_regularized(module: nn.Module) -> bool:
    """Whether :func:`regularize` has attached its pre-hook to this module."""
    return isinstance(getattr(module, _CONFIG, None), Regularizer)


def _targets(model: nn.Module, skip: tuple[str, ...]) -> list[tuple[str, nn.MultiheadAttention]]:
    """The self-attention modules: every MHA except decoder cross-attention and ``skip``."""
    cross = {
        id(m.multihead_attn) for m in model.modules() if isinstance(m, nn.TransformerDecoderLayer)
    }
    return [
        (name, m)
        for name, m in model.named_modules()
        if isinstance(m, nn.MultiheadAttention) and id(m) not in cross and name not in skip
    ]


def _check_args(model: nn.Module, diag: str, p: float, penalty: float) -> None:
    if not isinstance(model, nn.Module):
        raise ValueError(
            f"model must be a torch.nn.Module, got {type(model).__name__}; pass the model object."
        )
    if diag is None or diag not in REGULARIZERS:
        raise ValueError(
            f"diag={diag!r} is not a regularizer; choose one of {REGULARIZERS} "
            "(to remove a regularizer call diagsink.regularize.unregularize(model))."
        )
    _check_diag_args(diag, p, penalty)  # p in [0, 1), finite penalty (ConfigError)


def regularize(
    model: nn.Module,
    diag: str = "dropout",
    p: float = 0.2,
    penalty: float = -0.1,
    shared: bool = True,
    inplace: bool = False,
    skip: tuple[str, ...] | list[str] = (),
) -> nn.Module:
    """Add a diagonal regularizer to every self-attention ``nn.MultiheadAttention`` of ``model``.

    Args:
        model: any module; itself an ``nn.MultiheadAttention`` or containing some.
        diag: ``"mask"``, ``"dropout"`` or ``"penalty"`` (as ``TemporalAttention(diag=...)``).
        p: drop probability of each diagonal logit for ``"dropout"``, in ``[0, 1)``.
        penalty: finite constant added to the diagonal logits for ``"penalty"``.
        shared: ``"dropout"``: one pattern ``[T]`` per call for every sequence and head (the
            paper's code), or ``False``: one per sequence and head ``[N, H, T]``.
        inplace: change ``model`` itself, or (default) a deep copy of it.
        skip: names (as in ``model.named_modules()``) of attention modules to leave alone.
            The cross-attention ``multihead_attn`` of ``nn.TransformerDecoderLayer`` is always
            left alone.

    Returns:
        the regularized model (``model`` itself when ``inplace``). Its parameters and
        ``state_dict`` are those of the original. In ``nn.TransformerEncoderLayer`` the fused
        eval-mode fast path is turned off (it would bypass the regularizer), and
        ``nn.TransformerEncoder`` no longer converts padded input to nested tensors.

    Raises:
        ValueError: not a module, an unknown ``diag``, ``p`` outside ``[0, 1)``, a
            non-finite penalty, no ``nn.MultiheadAttention`` to regularize, or one that is
            regularized already. At call time: cross-attention (query is not key), nested
            input, and ``"mask"`` on a sequence of length 1.
    """
    _check_args(model, diag, p, penalty)
    targets = _targets(model, tuple(skip))
    if not targets:
        raise ValueError(
            f"{type(model).__name__} has no self-attention nn.MultiheadAttention to regularize "
            "(after skip); for diagsink.TemporalAttention pass diag=... to the layer instead."
        )
    done = [name or "<model>" for name, m in targets if is_regularized(m)]
    if done:
        raise ValueError(
            f"{done} are regularized already; call diagsink.regularize.unregularize(model) first."
        )
    if not inplace:
        model = copy.deepcopy(model)
        targets = _targets(model, tuple(skip))
    cfg = Regularizer(str(diag), float(p), float(penalty), bool(shared))
    for _, mha in targets:
        setattr(mha, _CONFIG, cfg)
        setattr(mha, _HOOK, mha.register_forward_pre_hook(_add_regularizer, with_kwargs=True))
    for m in model.modules():
        if isinstance(m, nn.TransformerEncoder) and getattr(m, "use_nested_tensor", False):
            setattr(m, _NESTED, True)
            m.use_nested_tensor = False
    return model


def unregularize(model: nn.Module) -> nn.Module:
    """Undo :func:`regularize` in place: the original forwards (and fast paths) come back.

    Returns ``model``. Raises ``ValueError`` when nothing in it is regularized.
    """
    found = False
    for m in model.modules():
        if is_regularized(m):
            found = True
            delattr(m, _CONFIG)
            getattr(m, _HOOK).remove()  # the hook's handle
            delattr(m, _HOOK)
        if getattr(m, _NESTED, False):
            m.use_nested_tensor = True
            delattr(m, _NESTED)
    if not found:
        raise ValueError(
            "nothing in this model is regularized; unregularize() undoes regularize(model, ...)."
        )
    return model


def as_temporal_attention(mha: nn.MultiheadAttention, **diag_args: object) -> TemporalAttention:
    """The package's layer computing the same self-attention as ``mha``, weights copied.

    ``TemporalAttention(embed_dim, num_heads, residual=False, norm=None, dropout=mha.dropout)``
    with ``q_proj, k_proj, v_proj, out_proj`` taken from ``mha`` (copies); input ``[..., T, C]``
    (for a sequence-first ``mha`` transpose first). ``diag_args`` (``diag``, ``diag_p``,
    ``diag_penalty``, ``diag_shared``) pass through, so that
    ``regularize(mha, diag, p, penalty, shared)`` and
    ``as_temporal_attention(mha, diag=diag, diag_p=p, ...)`` compute the same function; the
    result is also the layer ``diagsink.jacobian.decompose`` takes.

    Raises:
        ValueError: ``mha`` has ``add_bias_kv``, ``add_zero_attn``, different key/value sizes,
            or biases on only some projections: shapes the package's layer cannot express.
    """
    if not isinstance(mha, nn.MultiheadAttention):
        raise ValueError(f"expected an nn.MultiheadAttention, got {type(mha).__name__}.")
    if mha.bias_k is not None or mha.add_zero_attn or mha.kdim != mha.embed_dim:
        raise ValueError(
            "this nn.MultiheadAttention has add_bias_kv, add_zero_attn or kdim/vdim != embed_dim; "
            "TemporalAttention has no such keys. Build the attention without them."
        )
    if (mha.in_proj_bias is None) != (mha.out_proj.bias is None):
        raise ValueError("in_proj and out_proj must both have biases or neither.")
    has_bias = mha.in_proj_bias is not None
    layer = TemporalAttention(
        mha.embed_dim,
        mha.num_heads,
        residual=False,
        dropout=mha.dropout,
        bias=has_bias,
        **diag_args,
    )
    c = mha.embed_dim
    with torch.no_grad():
        for k, proj in enumerate((layer.q_proj, layer.k_proj, layer.v_proj)):
            if mha.in_proj_weight is not None:  # one packed [3 E, E] in_proj_weight
                proj.weight.copy_(mha.in_proj_weight[k * c : (k + 1) * c])
            else:
                proj.weight.copy_(getattr(mha, f"{'qkv'[k]}_proj_weight"))
            if has_bias:
                proj.bias.copy_(mha.in_proj_bias[k * c : (k + 1) * c])
        layer.out_proj.weight.copy_(mha.out_proj.weight)
        if has_bias:
            layer.out_proj.bias.copy_(mha.out_proj.bias)
    return layer.to(mha.out_proj.weight.device, mha.out_proj.weight.dtype).train(mha.training)
