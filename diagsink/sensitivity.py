"""A trained T&S model's sensitivity to each input step, its per-block paths, and its maps.

Used by the heatmaps and results chapters (``book/heatmaps.ipynb``, ``book/results.ipynb``) on
the committed runs, computed from their saved weights. Two views of the same model:

* the **input-step profile** ``S_j``: how strongly the forecast (all 12 horizons, all sensors)
  moves with the speed readings at input step ``j``,

  ``S_j^2 = (1 / (B N)) Σ_b ‖∂ŷ_b / ∂x_{b,j}‖_F^2``,  ``ŷ_b`` ``[T_out, N]`` (mph),
  ``x_{b,j}`` the scaled speeds ``[N]`` of window ``b`` at step ``j``;

  computed by the toolkit's :func:`diagsink.probe.sensitivity_profile`, exactly (autograd,
  small models) or with Hutchinson's estimator, the measure of the paper's released code: ``‖J‖_F^2 = E_u ‖u^T J‖^2`` for Rademacher ``u`` on the outputs, so
  one backward pass per probe gives all ``T_in`` steps at once; its standard error is reported;
* the **map statistics** of the last block per sequence and of the averaged map
  (:func:`diagsink.stats.map_statistics`);
* the **per-block path norms** (:func:`block_paths`): for every temporal-attention block, the
  closed-form Jacobian of its attention sublayer (residual included, post-LayerNorm left out)
  at the block's actual input, split into the residual, value, key and query paths of
  "The Jacobian of a temporal-attention layer" (``book/jacobian.ipynb``), summarised by the
  mean norm of its diagonal and off-diagonal ``C x C`` blocks and the diagonal share.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from . import jacobian as J
from ._checks import is_int
from .depth import post_norm_entries
from .engine.artifacts import PATH_PARTS
from .engine.prepare import batch
from .errors import ConfigError
from .probe import Profile, sensitivity_profile
from .stats import map_statistics, self_share

__all__ = [
    "Profile",
    "input_step_profile",
    "profile_json",
    "PATH_PARTS",
    "attention_inputs",
    "sequence_block_norms",
    "block_paths",
    "run_sensitivity",
    "SINK_THRESHOLD",
    "path_rows",
    "sink_verdicts",
    "describe_verdict",
]


def _speed_forward(model: torch.nn.Module, x: torch.Tensor):
    """``f(speed) -> forecast`` with the other input channels of ``x`` held fixed."""
    rest = x[..., 1:]

    def f(speed: torch.Tensor) -> torch.Tensor:
        return model(torch.cat([speed.unsqueeze(-1), rest], dim=-1))

    return f


def input_step_profile(
    model: torch.nn.Module,
    x: torch.Tensor,
    method: str = "hutchinson",
    probes: int = 16,
    seed: int = 0,
) -> Profile:
    """``S_j`` over the windows ``x`` ``[B, T_in, N, C]`` (see the module docstring).

    :func:`diagsink.probe.sensitivity_profile` of ``speed -> forecast`` (time axis 1, windows
    on axis 0), divided by ``sqrt(N)``: the toolkit's one implementation, in eval mode.
    ``method="hutchinson"`` (``probes`` Rademacher probes, each over every window at once)
    reports the standard error of ``S_j`` over the ``probes x B`` samples (delta method,
    ``se(S) = se(S^2) / 2S``); ``"exact"`` forms the whole Jacobian (small models only).
    """
    if method == "hutchinson" and (not is_int(probes) or probes < 2):
        raise ValueError(
            f"probes = {probes!r}: Hutchinson needs a whole number >= 2 for its error."
        )
    model.eval()
    speed = x[..., 0]  # [B, T_in, N]
    kw = {"method": method, "n_samples": probes, "batch_dim": 0, "seed": seed}
    prof = sensitivity_profile(_speed_forward(model, x), speed, 1, **kw)
    scale = 1.0 / math.sqrt(x.shape[2])  # per sensor: the mean over N, not the sum
    se = None if prof.se is None else (prof.se * scale).detach()
    return prof._replace(values=(prof.values * scale).detach(), se=se)


def profile_json(profile: Profile, windows: int) -> dict:
    """A profile as the artifacts store it: lists of floats, the method, windows and probes."""
    return {
        "S": [float(v) for v in profile.values],
        "se": None if profile.se is None else [float(v) for v in profile.se],
        "method": profile.method,
        "windows": windows,
        "probes": profile.n_samples,
    }


# ----------------------------------------------------------------------------------------
# per-block path norms on the blocks' real inputs
# ----------------------------------------------------------------------------------------
@torch.no_grad()
def attention_inputs(
    model: nn.Module, x: torch.Tensor
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """What each block's temporal attention sees and returns when ``model`` runs on ``x``.

    Args:
        model: a :class:`~diagsink.model.TSModel` (put in eval mode here).
        x: input windows ``[B, T_in, N, 2]`` (scaled speed, time of day).

    Returns:
        ``(inputs, outputs)``: one ``[B, N, T, C]`` tensor per block each, captured by forward
        hooks on ``block.attn``: the sequence of every window and sensor exactly as the attention
        gets it (for ``block_order="ts"`` the block input plus the time-of-day embedding,
        ``h = x + tod``; for ``"st"`` after the graph convolution) and the attention's output
        (residual and post-LayerNorm included, as the layer computes it).
    """
    blocks = getattr(model, "blocks", None)
    if blocks is None or not all(hasattr(b, "attn") for b in blocks):
        raise ConfigError(
            f"expected a ds.TSModel (blocks with a temporal attention .attn), got {type(model).__name__}."
        )
    model.eval()
    inputs: list[torch.Tensor] = []
    outputs: list[torch.Tensor] = []

    def keep(_module: nn.Module, args: tuple, out: torch.Tensor) -> None:
        inputs.append(args[0].detach().clone())
        outputs.append(out.detach().clone())

    hooks = [b.attn.register_forward_hook(keep) for b in blocks]
    try:
        model(x)
    finally:
        for h in hooks:
            h.remove()
    return inputs, outputs


@torch.no_grad()
def sequence_block_norms(
    layer: nn.Module, x: torch.Tensor, norm: str = "fro"
) -> dict[str, torch.Tensor]:
    """Norms of the ``C x C`` blocks of each path at one sequence ``x`` ``[T, C]``.

    ``layer``: a :class:`~diagsink.attention.TemporalAttention` with ``norm=None`` in float64 and
    eval mode (:func:`diagsink.depth.post_norm_entries` makes one from a block's ``attn``);
    ``norm``: ``"fro"`` (Frobenius) or ``"spectral"``. Returns :data:`PATH_PARTS` -> ``[T, T]``;
    entry ``[i, j]`` is the norm of ``∂y_i/∂x_j`` of that part, from the closed form
    :func:`diagsink.jacobian.decompose`.
    """
    if norm not in ("fro", "spectral"):
        raise ConfigError(f"norm={norm!r} is not known; use 'fro' (Frobenius) or 'spectral'.")
    paths = J.decompose(layer, x)
    attention = paths["value"] + paths["key"] + paths["query"]
    parts = {**paths, "attention": attention, "total": attention + paths["residual"]}
    # the norm of every C x C block [i, :, j, :], as jacobian.block_norms takes it
    return {k: J._matrix_norm(parts[k].permute(0, 2, 1, 3), norm) for k in PATH_PARTS}


def _spread(count: int, n: int, what: str) -> list[int]:
    """``count`` indices evenly spaced over ``0 .. n-1`` (first and last included)."""
    if not is_int(count) or not 1 <= count <= n:
        raise ConfigError(f"{what}={count!r} must be a whole number in [1, {n}].")
    if count == 1:
        return [0]
    return sorted({round(k * (n - 1) / (count - 1)) for k in range(count)})


@torch.no_grad()
def block_paths(
    model: nn.Module, x: torch.Tensor, windows: int = 4, nodes: int = 8, norm: str = "fro"
) -> dict:
    """The Jacobian paths of every temporal-attention block of a trained T&S model, on real inputs.

    For each block the attention sublayer ``u -> u + attn(u)`` (its residual included; the
    post-LayerNorm that follows, block diagonal in time, left out) is differentiated in closed
    form (:func:`diagsink.jacobian.decompose`, float64, eval mode) at the input that block's
    attention actually gets (:func:`attention_inputs`). The subset is fixed: ``windows`` windows
    evenly spaced over the ``B`` windows of ``x`` (first and last included) times ``nodes``
    sensors evenly spaced over the ``N``; every such sequence ``[T, C]`` is one Jacobian
    ``[T, C, T, C]``.

    Args:
        model: a :class:`~diagsink.model.TSModel`.
        x: input windows ``[B, T_in, N, 2]`` (scaled speed, time of day).
        windows, nodes: the size of the subset (at most ``B`` and ``N``).
        norm: of the ``C x C`` blocks, ``"fro"`` (Frobenius, the default, as
            :func:`diagsink.jacobian.path_norms`; the residual's block ``I`` has norm
            ``sqrt(C)``) or ``"spectral"`` (about 30 times slower: one SVD per block).

    Returns:
        a dict with the keys ``windows`` and ``nodes`` (the indices used), ``norm``,
        ``uniform_share`` (``1/T``) and ``blocks``, one entry per block that maps every ``part``
        of :data:`PATH_PARTS` to ``{"diagonal": ..., "off_diagonal": ...}`` and
        ``diagonal_share`` to ``{"total": ..., "attention": ...}``: the mean norm of the
        diagonal blocks ``‖∂y_i/∂u_i‖`` and of the off-diagonal ones (``j ≠ i``) over all
        sequences, and the mean over sequences and rows of ``‖J_ii‖ / Σ_j ‖J_ij‖``
        (:func:`diagsink.stats.self_share`; ``1/T`` = spread evenly, 1 = only the diagonal) of
        the total and of the attention part (value + key + query, without the residual's ``I``).

    Used by the chapters "Heatmaps on METR-LA" (``book/heatmaps.ipynb``) and "Results: every
    variant" (``book/results.ipynb``) through the artifacts' ``sensitivity.paths``.
    """
    if x.dim() != 4 or x.shape[-1] != 2:
        raise ConfigError(
            f"x has shape {tuple(x.shape)}; pass input windows [batch, T_in, nodes, 2]."
        )
    win = _spread(windows, x.shape[0], "windows")
    nod = _spread(nodes, x.shape[2], "nodes")
    inputs, _ = attention_inputs(model, x[win])
    out = []
    for block, h in zip(model.blocks, inputs):
        layer = post_norm_entries(block.attn)[0]  # float64 copy, eval mode, norm=None
        seqs = h[:, nod].double().flatten(0, 1)  # [windows x nodes, T, C]
        norms = [sequence_block_norms(layer, s, norm) for s in seqs]
        stacked = {k: torch.stack([n[k] for n in norms]) for k in PATH_PARTS}  # [S, T, T]
        T = seqs.shape[1]
        off = ~torch.eye(T, dtype=torch.bool)
        entry = {
            k: {
                "diagonal": float(v.diagonal(dim1=-2, dim2=-1).mean()),
                "off_diagonal": float(v[:, off].mean()) if T > 1 else 0.0,
            }
            for k, v in stacked.items()
        }
        entry["diagonal_share"] = {k: self_share(stacked[k]) for k in ("total", "attention")}
        out.append(entry)
    return {
        "windows": win,
        "nodes": nod,
        "norm": norm,
        "uniform_share": 1.0 / x.shape[1],
        "blocks": out,
    }


def run_sensitivity(
    run,
    windows: int = 32,
    probes: int = 16,
    seed: int = 0,
    path_windows: int = 4,
    path_nodes: int = 8,
) -> dict:
    """Profile, last-block map statistics and per-block paths of a committed run.

    Args:
        run: a :class:`diagsink.engine.reload.LoadedRun`.
        windows: how many test windows (the first ones, in time order).
        probes, seed: of the Hutchinson estimator (:func:`input_step_profile`).
        path_windows, path_nodes: the subset of those windows and of the sensors that
            :func:`block_paths` differentiates (evenly spaced).
    """
    m = run.cfg["model"]
    x, _ = batch(run.prepared, run.prepared.test[:windows], m["t_in"], m["t_out"])
    profile = input_step_profile(run.model, x, "hutchinson", probes, seed)
    with torch.no_grad():
        _, attn = run.model(x, return_attention=True)  # [B, N, H, T, T], eval mode
    paths = block_paths(run.model, x, path_windows, path_nodes)
    return {
        "profile": profile_json(profile, x.shape[0]),
        "maps": map_statistics(attn),
        "paths": paths,
        "how": (
            f"first {x.shape[0]} test windows, eval mode, last block; Hutchinson with {probes} "
            f"probes per window; paths: every block's attention sublayer (with residual, before "
            f"its LayerNorm) in closed form, float64, at windows {paths['windows']} x sensors "
            f"{paths['nodes']}, Frobenius norms of the C x C blocks"
        ),
    }


# ----------------------------------------------------------------------------------------
# reading the stored field: per-block rows and the weights-or-paths verdict
# ----------------------------------------------------------------------------------------
#: ``T`` x a diagonal share (1 = uniform) from which a diagonal *stands out*: half again the
#: uniform share, the criterion of the chapters "Heatmaps on METR-LA" (``book/heatmaps.ipynb``)
#: and "A task where parroting fails" (``book/parroting.ipynb``) for "a brighter diagonal". Far
#: weaker than a diagonal sink in the glossary's sense (the share tending to one, corollary
#: ``bnd-cor-share``): a diagonal at the threshold holds only ``1.5 / T`` of the total.
SINK_THRESHOLD: float = 1.5


def _stored_paths(art: dict) -> dict:
    paths = art.get("sensitivity", {}).get("paths")
    if paths is None:
        raise ConfigError(
            f"artifact {art.get('variant')!r} seed {art.get('seed')!r} has no sensitivity.paths; "
            "run `diagsink sensitivity <artifact>` on it."
        )
    return paths


def path_rows(artifacts: list[dict]) -> list[dict]:
    """One row per run and block of the stored ``sensitivity.paths`` (JSON artifacts).

    Keys: ``variant``, ``seed``, ``block`` (1 = first), ``T x share (attention)`` and
    ``T x share (total)`` (``T`` x the diagonal shares, 1 = uniform), and ``{part} diag`` /
    ``{part} off`` for the four paths: the mean diagonal / off-diagonal block norms. For the
    tables of "Heatmaps on METR-LA" and "Results: every variant".
    """
    rows = []
    for art in artifacts:
        paths = _stored_paths(art)
        t = 1.0 / paths["uniform_share"]
        for b, block in enumerate(paths["blocks"]):
            row = {"variant": art["variant"], "seed": art["seed"], "block": b + 1}
            row["T x share (attention)"] = t * block["diagonal_share"]["attention"]
            row["T x share (total)"] = t * block["diagonal_share"]["total"]
            for part in J.PATHS:
                row[f"{part} diag"] = block[part]["diagonal"]
                row[f"{part} off"] = block[part]["off_diagonal"]
            rows.append(row)
    return rows


_CATEGORY = {(True, True): "both", (True, False): "weights", (False, True): "paths"}


def _call(passed: list[bool]) -> str:
    return "yes" if all(passed) else "no" if not any(passed) else "mixed"


def sink_verdicts(artifacts: list[dict], threshold: float = SINK_THRESHOLD) -> dict[str, dict]:
    """Per variant: does the last block's diagonal stand out in the weights, the paths, both or neither?

    Both criteria on the last block (whose maps the artifacts store), per seed, one threshold
    (:data:`SINK_THRESHOLD`: the diagonal *stands out*, far short of a diagonal sink, whose share
    tends to one):

    * **weights**: ``T`` x mean ``α_ii`` of the last block's maps, per sequence
      (``sensitivity.maps.diagonal_ratio.mean``) is at least ``threshold``;
    * **paths**: ``T`` x the diagonal share of the last block's attention part (value + key +
      query, without the residual's identity, which is diagonal by construction) is at least
      ``threshold``.

    Returns ``{variant: {"seeds", "weights", "paths" (the two numbers per seed), "in_weights",
    "in_paths" ("yes" when every seed passes, "no" when none does, else "mixed"), "by_seed"
    ({seed: "both" | "weights" | "paths" | "neither"}), "verdict"}}``: the seeds' common
    category, or ``"mixed"`` when they differ. Used by "Heatmaps on METR-LA" and "Results: every
    variant".
    """
    out: dict[str, dict] = {}
    for art in sorted(artifacts, key=lambda a: a["seed"]):
        paths = _stored_paths(art)
        t = 1.0 / paths["uniform_share"]
        entry = out.setdefault(art["variant"], {"seeds": [], "weights": [], "paths": []})
        entry["seeds"].append(art["seed"])
        entry["weights"].append(art["sensitivity"]["maps"]["diagonal_ratio"]["mean"])
        entry["paths"].append(t * paths["blocks"][-1]["diagonal_share"]["attention"])
    for entry in out.values():
        w = [v >= threshold for v in entry["weights"]]
        p = [v >= threshold for v in entry["paths"]]
        entry["in_weights"], entry["in_paths"] = _call(w), _call(p)
        entry["by_seed"] = {
            s: _CATEGORY.get((a, b), "neither")
            for s, a, b in zip(entry["seeds"], w, p, strict=True)
        }
        kinds = set(entry["by_seed"].values())
        entry["verdict"] = kinds.pop() if len(kinds) == 1 else "mixed"
    return out


def describe_verdict(entry: dict) -> str:
    """One variant's :func:`sink_verdicts` entry in words, e.g. ``"paths: seeds 0, 2, 3; neither: seed 1"``."""
    if entry["verdict"] != "mixed":
        return f"{entry['verdict']}, every seed"
    groups: dict[str, list[str]] = {}
    for seed, kind in entry["by_seed"].items():
        groups.setdefault(kind, []).append(str(seed))
    return "; ".join(
        f"{kind}: seed{'s' if len(v) > 1 else ''} {', '.join(v)}" for kind, v in groups.items()
    )
