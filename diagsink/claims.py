"""The claims ledger: every claim of the paper and of this book, its status, and where it is checked.

The registry :data:`CLAIMS` is the one source of the page ``book/claims.md``:
``python -m diagsink.claims`` writes that page from it, and ``tests/test_claims.py`` fails when
the committed page differs from :func:`render`, when a status is not one of :data:`STATUSES`, or
when a claim's anchor is missing from its page. An anchor is a MyST target ``(label)=``, a
directive's ``:label:`` (a theorem, a proposition) or the text of a heading of the page; the
ledger links a row to the cell or section that proves, measures or quotes the claim.
Explained on the page "Claims ledger" (``book/claims.md``).
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

PROVED = "proved here"
MEASURED = "measured here"
CONFIRMED = "the paper's, confirmed"
NOT_CONFIRMED = "the paper's, not confirmed"
UNCHECKABLE = "cannot be checked here"
#: the five statuses a claim can have, in the order the page explains them
STATUSES = (PROVED, MEASURED, CONFIRMED, NOT_CONFIRMED, UNCHECKABLE)


@dataclass(frozen=True)
class Claim:
    """One row of the ledger: ``text`` (one sentence), ``status`` (one of :data:`STATUSES`),
    ``page`` (a page of the book, its file name without the suffix) and ``anchor`` (a label or
    a heading on that page)."""

    text: str
    status: str
    page: str
    anchor: str

    @property
    def papers(self) -> bool:
        """Whether the claim is the paper's (its status starts with "the paper's" or cannot be checked)."""
        return self.status in (CONFIRMED, NOT_CONFIRMED, UNCHECKABLE)


CLAIMS: tuple[Claim, ...] = (
    # -- the paper's claims --------------------------------------------------------------------
    Claim(
        "Averaged over the keys, the off-diagonal Jacobian blocks of an attention layer fall like 1/T, while the diagonal block stays of order one.",
        CONFIRMED,
        "bounds",
        "bnd-thm-offdiag-average",
    ),
    Claim(
        "These bounds prove that diagonal attention sinks exist, induced by the residual connection and the query weights.",
        NOT_CONFIRMED,
        "bounds",
        "bnd-thm-aggregate",
    ),
    Claim(
        "Temporal attention drifts into parroting as the input window grows.",
        NOT_CONFIRMED,
        "parroting",
        "parroting-control",
    ),
    Claim(
        "The sink is induced by the residual connection and the query path.",
        CONFIRMED,
        "parroting",
        "parroting-paths",
    ),
    Claim(
        "A full diagonal mask suppresses the query part of the softmax attention.",
        NOT_CONFIRMED,
        "parroting",
        "parroting-regularizers",
    ),
    Claim(
        "With a full mask, attention emphasises specific keys for the whole sequence (column stripes).",
        NOT_CONFIRMED,
        "designs",
        "designs-treatments",
    ),
    Claim(
        "Partial control of the diagonal (dropout, penalty) helps more than the full mask.",
        NOT_CONFIRMED,
        "designs",
        "designs-treatments",
    ),
    Claim(
        "Diagonal dropout and the penalty reduce the errors by about 2.5 %.",
        NOT_CONFIRMED,
        "results",
        "The paper's table beside it",
    ),
    Claim(
        "The T&S model's graph convolution mixes information between sensors over the road graph.",
        NOT_CONFIRMED,
        "model",
        "The released graph layer keeps only the diagonal of a learned graph",
    ),
    Claim(
        "The results table on METR-LA: five variants at the released model size and schedule.",
        UNCHECKABLE,
        "results",
        "The paper's table beside it",
    ),
    Claim(
        "Figure 1: the last block's attention maps of the five variants.",
        UNCHECKABLE,
        "heatmaps",
        "Why the panels differ from the paper's",
    ),
    # -- this book's claims --------------------------------------------------------------------
    Claim(
        "The Jacobian of an attention layer is the sum of four paths: residual, value, key and query.",
        PROVED,
        "jacobian",
        "jac-thm-paths",
    ),
    Claim(
        "Each off-diagonal block is bounded by a constant over T.",
        PROVED,
        "bounds",
        "bnd-thm-offdiag",
    ),
    Claim(
        "In aggregate the other steps keep an influence of order one on a step's output.",
        PROVED,
        "bounds",
        "bnd-thm-aggregate",
    ),
    Claim(
        "The diagonal's share of a step's sensitivity tends to 1/(1+ν); a sink needs α_ii → 1 or ν → 0.",
        PROVED,
        "bounds",
        "bnd-cor-share",
    ),
    Claim(
        "The query path is at most half the value norm times the a-priori logit spread.",
        PROVED,
        "bounds",
        "bnd-prop-coupling",
    ),
    Claim(
        "For a stack of post-norm blocks every off-diagonal block stays O(1/T) at fixed depth.",
        PROVED,
        "depth",
        "dep-cor-fixed-depth",
    ),
    Claim(
        "A residual connection alone does not prevent rank collapse: the averaging stack with LayerNorm collapses.",
        MEASURED,
        "depth",
        "Depth at initialisation",
    ),
    Claim(
        "With the same training budget at every length, long windows parrot on the lag task.",
        MEASURED,
        "parroting",
        "parroting-window",
    ),
    Claim(
        "With a budget that grows like T, no length stays on the parrot's plateau.",
        MEASURED,
        "parroting",
        "parroting-control",
    ),
    Claim(
        "Mask, dropout and penalty at the paper's strengths do not cure the parrot of the lag task.",
        MEASURED,
        "parroting",
        "parroting-regularizers",
    ),
    Claim(
        "Features that let a step recognise its own value give a comb of attention stripes, not a diagonal collapse.",
        MEASURED,
        "designs",
        "parroting-second",
    ),
    Claim(
        "Without a residual connection, a budget that grows like T leaves a large gap to the short window.",
        MEASURED,
        "designs",
        "parroting-second-control",
    ),
    Claim(
        "With vector-valued steps attention collapses onto the diagonal at the same budget, not with a budget that grows like T.",
        MEASURED,
        "designs",
        "parroting-third-control",
    ),
    Claim(
        "Where attention has collapsed onto the diagonal, the full mask helps most and a strong penalty helps; the paper's strengths do not.",
        MEASURED,
        "designs",
        "designs-treatments",
    ),
    Claim(
        "No trained block of the committed METR-LA runs sits in a diagonal sink.",
        MEASURED,
        "trained_theory",
        "Does any trained model sit in a sink?",
    ),
    Claim(
        "On four months of traffic (29 sensors) no treatment moves the test MAE by 1 % against the untreated model.",
        MEASURED,
        "results",
        "Paired differences against (b)",
    ),
    Claim(
        "On four months of traffic the model beats every baseline at 15 minutes and loses to a time-of-week average at 60.",
        MEASURED,
        "results",
        "The runs against baselines",
    ),
    Claim(
        "A training run killed with kill -9 resumes and ends bit-identically to an uninterrupted run.",
        MEASURED,
        "reproducing",
        "reproducing-resume",
    ),
)


PAGE_HEAD = """# Claims ledger

<!-- Generated by `python -m diagsink.claims` from diagsink/claims.py: edit the registry, not this page. -->

Every claim of the paper and every main claim of this book, with its status and the place that
checks it. The page is generated from a registry that the tests validate: every status is one
of the five below and every link points to a label or a section that exists on its page, so a
claim cannot lose the cell that checks it without the tests failing.

* **proved here**: a theorem of this book, with its proof and a numerical check;
* **measured here**: an experiment of this book, asserted in the cell that computes it;
* **the paper's, confirmed**: the paper's claim, and this book's proof or measurement agrees;
* **the paper's, not confirmed**: the paper's claim, and this book's proof, measurement or reading
  of the released code disagrees, or shows something narrower;
* **cannot be checked here**: the paper's claim needs runs this book has not made (the paper's
  model size and schedule), or material it does not have; the linked section says what is missing.
"""


def page_source(root: Path, page: str) -> str:
    """The markdown of ``book/<page>`` (``.ipynb``: its markdown cells; ``.md``: the file)."""
    nb, md = root / "book" / f"{page}.ipynb", root / "book" / f"{page}.md"
    if nb.exists():
        cells = json.loads(nb.read_text(encoding="utf-8"))["cells"]
        return "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    if md.exists():
        return md.read_text(encoding="utf-8")
    raise FileNotFoundError(f"no page book/{page}.ipynb or book/{page}.md; fix the claim's page")


def anchor_kind(source: str, anchor: str) -> str | None:
    """``"target"`` for ``(anchor)=``, ``"directive"`` for ``:label: anchor``, ``"heading"`` for a
    heading with that text, ``None`` when the page has no such anchor."""
    if re.search(rf"^\({re.escape(anchor)}\)=\s*$", source, re.M):
        return "target"
    if re.search(rf"^:label:\s*{re.escape(anchor)}\s*$", source, re.M):
        return "directive"
    if re.search(rf"^#{{1,6}}\s+{re.escape(anchor)}\s*$", source, re.M):
        return "heading"
    return None


def _link(claim: Claim, kind: str) -> str:
    if kind == "target":
        return f"{{ref}}`{claim.anchor}`"
    if kind == "directive":
        return f"{{prf:ref}}`{claim.anchor}`"
    return f"{{doc}}`{claim.page}`, section “{claim.anchor}”"


def render(root: Path) -> str:
    """The page ``book/claims.md``, generated from :data:`CLAIMS` (the anchors are read from the book)."""
    parts = [PAGE_HEAD.rstrip() + "\n"]
    for title, papers in (("The paper's claims", True), ("This book's claims", False)):
        rows = [c for c in CLAIMS if c.papers == papers]
        parts.append(f"\n## {title}\n\n| claim | status | checked in |\n|---|---|---|\n")
        for c in rows:
            kind = anchor_kind(page_source(root, c.page), c.anchor)
            if kind is None:
                raise ValueError(
                    f"book/{c.page} has no anchor {c.anchor!r}; fix the claim or the page"
                )
            parts.append(f"| {c.text} | {c.status} | {_link(c, kind)} |\n")
    return "".join(parts)


def main(argv: list[str] | None = None) -> int:
    """Write ``book/claims.md`` from the registry (``--check``: exit 1 when it is stale)."""
    root = Path(__file__).resolve().parents[1]
    text, path = render(root), root / "book" / "claims.md"
    if "--check" in (argv if argv is not None else sys.argv[1:]):
        stale = not path.exists() or path.read_text(encoding="utf-8") != text
        print("book/claims.md is stale: run `python -m diagsink.claims`" if stale else "up to date")
        return int(stale)
    path.write_text(text, encoding="utf-8")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
