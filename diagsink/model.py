"""The paper's "T&S" model: temporal attention then a graph convolution, stacked.

Input ``x`` ``[batch, time, nodes, 2]`` holds the scaled speed (channel 0) and the time of
day in ``[0, 1)`` (channel 1) of ``T_in = 12`` steps; the output ``[batch, T_out, nodes]`` is
the predicted speed (unscaled, mph) for the next ``T_out = 12`` steps. One block::

    h  = x + tod_emb                                    time of day, added as a bias in every block
    h  = LayerNorm(h + TemporalAttention(h))            per sensor, over time (post-norm; variant (a)
                                                        drops this residual)
    x' = LayerNorm(h + DiffusionGraphConv(h))           per time step, over sensors

That is the paper's order, ``block_order="ts"`` (temporal, then spatial). ``block_order="st"``
swaps the two sublayers (graph convolution first, then temporal attention) with the same
modules and parameters, so the two orders can be compared weight for weight; the book's
chapter "Heatmaps on METR-LA" (``book/heatmaps.ipynb``) trains both (``diagsink sweep order``).

The speed enters through ``Linear(1 -> C)`` plus a tAPE positional table (added once);
the time of day through ``Linear(1 -> C)``. The head concatenates the last block's output
with the raw time of day, maps it per step with ``Linear(C + 1 -> 1)``, then mixes the 12
input steps into the 12 output steps with ``Linear(T_in -> T_out)``: a direct
(non-autoregressive) multi-step forecast in which each future step is a learned
combination of the per-step read-outs. This follows the released model's head; it is
cheap and lets every horizon see every input step.

The five variants of the paper (:data:`diagsink.variants.VARIANTS`) differ only in the arguments of
:class:`diagsink.TemporalAttention`. Explained in the chapter "The T&S model and its
training loop" (``book/model.ipynb``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from ._checks import is_int
from .attention import TemporalAttention
from .errors import ConfigError
from .graphconv import DiffusionGraphConv
from .positional import PositionalEncoding
from .released import ReleasedGCN
from .variants import attention_kwargs

__all__ = [
    "BLOCK_ORDERS",
    "GRAPH_LAYERS",
    "check_block_order",
    "check_graph_layer",
    "TSBlock",
    "TSModel",
]

#: The sublayer orders of a block, ``"ts"`` = temporal attention then graph conv (the paper's
#: T&S, the default) and ``"st"`` = graph conv then temporal attention.
BLOCK_ORDERS: tuple[str, ...] = ("ts", "st")


def check_block_order(order: Any) -> str:
    """Return ``order`` if it is one of :data:`BLOCK_ORDERS`, else raise :class:`ConfigError`."""
    if not isinstance(order, str) or order not in BLOCK_ORDERS:
        raise ConfigError(
            f"model.block_order = {order!r} is not known; allowed: 'ts' (temporal attention then graph conv, the "
            "paper's T&S, the default) or 'st' (graph conv then temporal attention). Set model.block_order to one of "
            "them in the protocol YAML (or leave it out for 'ts')."
        )
    return order


#: The choices of ``model.graph_layer``: ``"diffusion"`` (this book's layer: road-graph diffusion
#: plus a learned adjacency, :class:`DiffusionGraphConv`) or ``"released"`` (the paper's released
#: layer, which reads only the diagonals of two learned supports and so mixes no sensors,
#: :class:`diagsink.released.ReleasedGCN`).
GRAPH_LAYERS: tuple[str, ...] = ("diffusion", "released")


def check_graph_layer(layer: Any) -> str:
    """Return ``layer`` if it is one of :data:`GRAPH_LAYERS`, else raise :class:`ConfigError`."""
    if not isinstance(layer, str) or layer not in GRAPH_LAYERS:
        raise ConfigError(
            f"model.graph_layer = {layer!r} is not known; choose one of {', '.join(GRAPH_LAYERS)}."
        )
    return layer


class TSBlock(nn.Module):
    """One T&S block: temporal attention (+ residual, LayerNorm), then graph conv (+ residual, LayerNorm).

    With ``block_order="st"`` the graph conv sublayer (+ residual, LayerNorm) comes first and
    the temporal attention sublayer second; the time-of-day bias is added at the block input
    in both orders, and the modules (``attn``, ``gconv``, ``norm``) are the same, so a state
    dict of one order loads into the other.

    Args:
        d_model, n_heads, dropout: of the attention layer (``dropout`` = attention dropout,
            also used after the graph convolution).
        supports, order, adaptive, n_nodes, embed_dim: of :class:`DiffusionGraphConv`.
        attention_kwargs: the variant's arguments (:func:`diagsink.variants.attention_kwargs`).
        block_order: ``"ts"`` (default, the paper's) or ``"st"`` (:data:`BLOCK_ORDERS`).
        graph_layer: ``"diffusion"`` (this book's :class:`DiffusionGraphConv`, default) or
            ``"released"`` (the paper's released layer, :class:`diagsink.released.ReleasedGCN`:
            two learned supports of which only the diagonals are read, so no sensor mixing).

    Shapes:
        ``x``, ``tod``: ``[B, T, N, C]`` -> ``[B, T, N, C]``; attention ``[B, N, H, T, T]``.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        supports: Sequence[torch.Tensor],
        *,
        order: int = 2,
        adaptive: bool = True,
        n_nodes: int | None = None,
        embed_dim: int = 10,
        dropout: float = 0.0,
        attention_kwargs: dict[str, Any] | None = None,
        block_order: str = "ts",
        graph_layer: str = "diffusion",
    ) -> None:
        super().__init__()
        self.block_order = check_block_order(block_order)
        self.attn = TemporalAttention(
            d_model, n_heads, dropout=dropout, norm="post", **(attention_kwargs or {})
        )
        if check_graph_layer(graph_layer) == "released":  # the paper's layer: no sensor mixing
            self.gconv = ReleasedGCN(
                d_model, supports[0].shape[0], order=order, embed_dim=embed_dim, dropout=dropout
            )
        else:
            self.gconv = DiffusionGraphConv(
                d_model,
                supports,
                order=order,
                adaptive=adaptive,
                n_nodes=n_nodes,
                embed_dim=embed_dim,
                dropout=dropout,
            )
        self.norm = nn.LayerNorm(d_model)

    def forward(
        self, x: torch.Tensor, tod: torch.Tensor, return_attention: bool = False
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        h = x + tod  # [B, T, N, C]
        if self.block_order == "st":
            h = self.norm(h + self.gconv(h))  # spatial first: per time step, over sensors
        h = h.transpose(1, 2)  # [B, N, T, C]: each sensor's sequence, time second-to-last
        if return_attention:
            h, attn = self.attn(h, return_attention=True)
        else:
            h, attn = self.attn(h), None
        h = h.transpose(1, 2)  # back to [B, T, N, C]
        if self.block_order == "ts":
            h = self.norm(h + self.gconv(h))  # spatial second (the paper's T&S)
        return (h, attn) if return_attention else h


class TSModel(nn.Module):
    """The stacked T&S forecaster.

    Args:
        n_nodes: sensors ``N``.
        supports: fixed ``[N, N]`` diffusion supports (forward and backward random walks).
        variant: one of :data:`diagsink.variants.VARIANTS`.
        d_model, n_heads, depth, dropout: width, heads, number of blocks, dropout.
        pos_encoding: added once to the speed embedding (``"tape"`` in the paper).
        order, adaptive, embed_dim: graph convolution settings.
        t_in, t_out: input and output steps.
        diag_p, diag_penalty: the regularizers' constants.
        block_order: ``"ts"`` (temporal attention then graph conv in every block, the paper's)
            or ``"st"`` (graph conv then temporal attention); config key ``model.block_order``.
        graph_layer: ``"diffusion"`` or ``"released"`` (:class:`TSBlock`); config key
            ``model.graph_layer``.
        speed_mean, speed_std: the scaler; the output is ``head * std + mean`` (mph).
        checkpoint_blocks: activation checkpointing in training: each block's activations are
            recomputed in the backward pass instead of stored (about one extra forward pass of
            compute; the same numbers, dropout draws included). Cuts the paper model's peak
            memory at batch 32 on a CPU several-fold (``benchmarks/training.py``).

    Shapes:
        ``x``: ``[B, T_in, N, 2]`` (scaled speed, time of day) -> ``[B, T_out, N]`` (mph).
    """

    def __init__(
        self,
        n_nodes: int,
        supports: Sequence[torch.Tensor],
        *,
        variant: str = "none",
        d_model: int = 72,
        n_heads: int = 8,
        depth: int = 12,
        dropout: float = 0.1,
        pos_encoding: str | None = "tape",
        order: int = 2,
        adaptive: bool = True,
        embed_dim: int = 10,
        t_in: int = 12,
        t_out: int = 12,
        diag_p: float = 0.2,
        diag_penalty: float = -0.1,
        speed_mean: float = 0.0,
        speed_std: float = 1.0,
        checkpoint_blocks: bool = False,
        block_order: str = "ts",
        graph_layer: str = "diffusion",
    ) -> None:
        super().__init__()
        self.checkpoint_blocks = checkpoint_blocks
        self.block_order = check_block_order(block_order)
        kwargs = attention_kwargs(variant, diag_p=diag_p, diag_penalty=diag_penalty)
        for name, value in (
            ("n_nodes", n_nodes),
            ("depth", depth),
            ("t_in", t_in),
            ("t_out", t_out),
        ):
            if not is_int(value) or value < 1:
                where = "the number of sensors" if name == "n_nodes" else f"config key model.{name}"
                raise ConfigError(f"TSModel {name}={value!r} must be a positive integer ({where}).")
        self.variant = variant
        self.n_nodes, self.t_in, self.t_out = n_nodes, t_in, t_out
        self.speed_embed = nn.Linear(1, d_model)
        self.tod_embed = nn.Linear(1, d_model)
        self.pos = PositionalEncoding(pos_encoding, d_model, max_len=max(t_in, 16))
        self.blocks = nn.ModuleList(
            TSBlock(
                d_model,
                n_heads,
                supports,
                order=order,
                adaptive=adaptive,
                n_nodes=n_nodes,
                embed_dim=embed_dim,
                dropout=dropout,
                attention_kwargs=kwargs,
                block_order=block_order,
                graph_layer=graph_layer,
            )
            for _ in range(depth)
        )
        self.readout = nn.Linear(d_model + 1, 1)  # per step: [h, time of day] -> one number
        self.time_mix = nn.Linear(t_in, t_out)  # 12 input steps -> 12 forecast steps
        self.register_buffer("speed_mean", torch.tensor(float(speed_mean)))
        self.register_buffer("speed_std", torch.tensor(float(speed_std)))

    def forward(
        self, x: torch.Tensor, return_attention: bool = False
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Forecast; with ``return_attention`` also the last block's attention ``[B, N, H, T, T]``."""
        if x.dim() != 4 or x.shape[1] != self.t_in or x.shape[2] != self.n_nodes or x.shape[3] != 2:
            raise ValueError(
                f"x has shape {tuple(x.shape)}; TSModel expects [batch, T_in={self.t_in}, nodes={self.n_nodes}, 2] "
                "holding (scaled speed, time of day)."
            )
        if x.dtype != self.speed_embed.weight.dtype:
            raise ValueError(
                f"x has dtype {x.dtype} but the model's parameters are {self.speed_embed.weight.dtype}; "
                f"pass x.to({self.speed_embed.weight.dtype}) (or convert the model with model.to(x.dtype))."
            )
        speed, tod_raw = x[..., :1], x[..., 1:]
        # tAPE is a [T, C] table over time: apply it with time on the second-to-last axis.
        h = self.pos(self.speed_embed(speed).transpose(1, 2)).transpose(1, 2)  # [B, T, N, C]
        tod = self.tod_embed(tod_raw)  # [B, T, N, C]
        attn = None
        for i, block in enumerate(self.blocks):
            if return_attention and i == len(self.blocks) - 1:
                h, attn = block(h, tod, return_attention=True)
            elif self.checkpoint_blocks and self.training and torch.is_grad_enabled():
                h = checkpoint(block, h, tod, use_reentrant=False)
            else:
                h = block(h, tod)
        z = self.readout(torch.cat([h, tod_raw], dim=-1)).squeeze(-1)  # [B, T_in, N]
        z = self.time_mix(z.transpose(1, 2)).transpose(1, 2)  # [B, T_out, N]
        y = z * self.speed_std + self.speed_mean
        return (y, attn) if return_attention else y
