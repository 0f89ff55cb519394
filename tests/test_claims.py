"""The claims ledger (diagsink/claims.py, book/claims.md): valid statuses, anchors that exist on
their pages, the paper's claims covered, and a committed page equal to what the registry renders."""

from __future__ import annotations

import pytest

from diagsink import claims
from diagsink.course import toc_entries

from conftest import ROOT

PAGES = {entry.removeprefix("book/").rsplit(".", 1)[0] for entry in toc_entries(ROOT)}


@pytest.mark.parametrize("claim", claims.CLAIMS, ids=lambda c: f"{c.page}:{c.anchor}"[:60])
def test_claim_is_valid_and_its_anchor_exists(claim: claims.Claim):
    assert claim.status in claims.STATUSES, (
        f"{claim.text!r}: status {claim.status!r} is not one of {claims.STATUSES}"
    )
    assert claim.page in PAGES, f"{claim.text!r}: page {claim.page!r} is not in _toc.yml"
    kind = claims.anchor_kind(claims.page_source(ROOT, claim.page), claim.anchor)
    assert kind is not None, (
        f"{claim.text!r}: book/{claim.page} has no label or heading {claim.anchor!r} "
        "(the cell that checks the claim moved: point the claim at its new label)"
    )
    assert claim.text.strip().endswith("."), (
        f"{claim.text!r}: one sentence, ending with a full stop"
    )


def test_committed_page_is_the_rendered_registry():
    page = (ROOT / "book" / "claims.md").read_text(encoding="utf-8")
    assert page == claims.render(ROOT), "book/claims.md is stale: run `python -m diagsink.claims`"
    assert "book/claims" in toc_entries(ROOT), "book/claims is not in _toc.yml"


def test_every_status_is_used_and_the_papers_claims_are_covered():
    """Each status appears; the paper's claims listed in the book (its mechanism, the mask's
    failure, the 2.5 % gain, the results table, Figure 1) each have a row."""
    used = {c.status for c in claims.CLAIMS}
    assert used == set(claims.STATUSES), f"statuses never used: {set(claims.STATUSES) - used}"
    papers = " ".join(c.text for c in claims.CLAIMS if c.papers).lower()
    for key in (
        "1/t",
        "sinks exist",
        "query part",
        "column stripes",
        "2.5 %",
        "results table",
        "figure 1",
    ):
        assert key in papers, f"no row for the paper's claim about {key!r}"


def test_anchor_kinds_and_a_missing_anchor(tmp_path):
    source = "(sec-a)=\n## Section A\n\n```{prf:theorem} T\n:label: thm-b\n```\n### Heading C\n"
    assert claims.anchor_kind(source, "sec-a") == "target"
    assert claims.anchor_kind(source, "thm-b") == "directive"
    assert claims.anchor_kind(source, "Heading C") == "heading"
    assert claims.anchor_kind(source, "Section") is None  # a prefix of a heading is not a heading
    assert claims.anchor_kind(source, "thm") is None
    (tmp_path / "book").mkdir()
    (tmp_path / "book" / "p.md").write_text(source)
    assert claims.anchor_kind(claims.page_source(tmp_path, "p"), "sec-a") == "target"
    with pytest.raises(FileNotFoundError, match="no page"):
        claims.page_source(tmp_path, "missing")


def test_render_refuses_a_claim_whose_anchor_is_gone(monkeypatch):
    gone = claims.Claim("A claim.", claims.MEASURED, "parroting", "no-such-label")
    monkeypatch.setattr(claims, "CLAIMS", (*claims.CLAIMS, gone))
    with pytest.raises(ValueError, match="no-such-label"):
        claims.render(ROOT)
