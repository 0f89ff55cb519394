"""Checks for the exercises of ``book/jacobian.ipynb`` ("The Jacobian of a temporal-attention layer").

* ``ex-jacobian-softmax``: ``softmax_jacobian(alpha)`` -> ``[T, T]``, entry ``[m, l]`` is
  ``∂α_m/∂s_l = α_m (δ_ml − α_l)`` for one row of attention weights ``alpha`` ``[T]``.
* ``ex-jacobian-query``: ``query_blocks(x, W_Q, W_K, W_V)`` -> ``[T, C, C]``, the diagonal
  blocks of the query path of a one-head layer without biases or output projection.
* ``ex-jacobian-key``: ``key_path(x, W_Q, W_K, W_V)`` -> ``[T, C, T, C]``, the key path of
  the same layer.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..attention import TemporalAttention
from ..jacobian import decompose
from . import compare_tensors, fresh_generator, register


def one_head_layer(W_Q: torch.Tensor, W_K: torch.Tensor, W_V: torch.Tensor) -> TemporalAttention:
    """A one-head residual layer without biases or output projection, holding the given weights
    ``[C, C]`` (``q_i = W_Q x_i`` etc.), in eval mode and in the weights' dtype."""
    layer = TemporalAttention(W_Q.shape[0], 1, bias=False, out_proj=False).to(W_Q.dtype).eval()
    with torch.no_grad():
        layer.q_proj.weight.copy_(W_Q)
        layer.k_proj.weight.copy_(W_K)
        layer.v_proj.weight.copy_(W_V)
    return layer


def _problem(gen: torch.Generator):
    T = int(torch.randint(3, 7, (1,), generator=gen))
    C = int(torch.randint(2, 5, (1,), generator=gen))
    x = torch.randn(T, C, generator=gen, dtype=torch.float64)
    W_Q, W_K, W_V = (torch.randn(C, C, generator=gen, dtype=torch.float64) for _ in range(3))
    return x, W_Q, W_K, W_V


@register("ex-jacobian-softmax")
def check_softmax_jacobian(softmax_jacobian: Callable[[torch.Tensor], torch.Tensor]) -> str | None:
    """Fresh rows of attention weights; compare with jacrev of the softmax."""
    gen = fresh_generator()
    T = int(torch.randint(3, 8, (1,), generator=gen))
    s = torch.randn(T, generator=gen, dtype=torch.float64)
    alpha = torch.softmax(s, dim=-1)
    expected = torch.func.jacrev(lambda v: torch.softmax(v, dim=-1))(s)
    got = softmax_jacobian(alpha.clone())
    if isinstance(got, torch.Tensor) and got.shape == expected.shape:
        got = got.to(expected.dtype)
        if torch.allclose(got, torch.diag(alpha), atol=1e-8):
            return "you return diag(α): the term −α_m α_l (every weight depends on every logit) is missing."
        if torch.allclose(got, -torch.outer(alpha, alpha), atol=1e-8):
            return "you return −α αᵀ only: the diagonal term α_m δ_ml is missing."
        if not torch.allclose(got.sum(0), torch.zeros(T, dtype=got.dtype), atol=1e-8):
            return "the columns of the softmax Jacobian must sum to 0 (the weights always sum to 1); yours do not."
    return compare_tensors(got, expected, name="the softmax Jacobian", atol=1e-8, rtol=1e-6)


@register("ex-jacobian-query")
def check_query_blocks(query_blocks: Callable[..., torch.Tensor]) -> str | None:
    """Fresh one-head layers; compare with the diagonal blocks of the package's query path."""
    gen = fresh_generator()
    x, W_Q, W_K, W_V = _problem(gen)
    T = x.shape[0]
    paths = decompose(one_head_layer(W_Q, W_K, W_V), x)
    idx = torch.arange(T)
    expected = paths["query"][idx, :, idx, :]
    got = query_blocks(x.clone(), W_Q.clone(), W_K.clone(), W_V.clone())
    if isinstance(got, torch.Tensor) and got.dim() == 4:
        return (
            f"return only the diagonal blocks, shape [T, C, C] = {[T, x.shape[1], x.shape[1]]}: "
            "the query path is zero off the diagonal."
        )
    if isinstance(got, torch.Tensor) and got.shape == expected.shape:
        got64 = got.detach().to(torch.float64)
        # forgot to centre the keys: Σ_m α_im W_V x_m k_mᵀ W_Q / sqrt(d)
        q = x @ W_Q.T
        k = x @ W_K.T
        alpha = torch.softmax(q @ k.T / x.shape[1] ** 0.5, dim=-1)
        z = x @ W_V.T
        uncentred = torch.einsum("im,ma,mc,cb->iab", alpha, z, k, W_Q) / x.shape[1] ** 0.5
        if torch.allclose(got64, uncentred, atol=1e-8):
            return "centre the keys: use k_m − k̄_i (k̄_i = Σ_m α_im k_m), which the softmax derivative produces."
        wrong_side = (
            torch.einsum("im,ma,mc,cb->iab", alpha, z, k - alpha @ k, W_K) / x.shape[1] ** 0.5
        )
        if torch.allclose(got64, wrong_side, atol=1e-8):
            return "the query path ends with W_Q (the derivative of q_i = W_Q x_i), not W_K."
    return compare_tensors(got, expected, name="the query blocks", atol=1e-8, rtol=1e-6)


@register("ex-jacobian-key")
def check_key_path(key_path: Callable[..., torch.Tensor]) -> str | None:
    """Fresh one-head layers; compare with the package's key path."""
    gen = fresh_generator()
    x, W_Q, W_K, W_V = _problem(gen)
    T, C = x.shape
    paths = decompose(one_head_layer(W_Q, W_K, W_V), x)
    expected = paths["key"]
    got = key_path(x.clone(), W_Q.clone(), W_K.clone(), W_V.clone())
    if isinstance(got, torch.Tensor) and got.shape == expected.shape:
        got64 = got.detach().to(torch.float64)
        if torch.allclose(got64, expected + paths["value"], atol=1e-8):
            return (
                "you return value + key: the value path α_ij W_V is a separate path, leave it out."
            )
        q = x @ W_Q.T
        k = x @ W_K.T
        alpha = torch.softmax(q @ k.T / C**0.5, dim=-1)
        z = x @ W_V.T
        uncentred = torch.einsum("ij,ja,ic,cb->iajb", alpha, z, q, W_K) / C**0.5
        if torch.allclose(got64, uncentred, atol=1e-8):
            return "centre the values: use W_V (x_j − x̄_i) with x̄_i = Σ_m α_im x_m, not W_V x_j."
        if torch.allclose(got64.permute(2, 1, 0, 3), expected, atol=1e-8):
            return "rows and columns are swapped: entry [i, :, j, :] must be ∂y_i/∂x_j (i = query, j = key)."
    return compare_tensors(got, expected, name="the key path", atol=1e-8, rtol=1e-6)
