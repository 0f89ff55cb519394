"""``torch.compile`` is an opt-in (config key ``train.compile``) and traces every variant whole.

Dynamo's ``explain`` traces without compiling (no C++ toolchain needed): one graph and no graph
break means the compiled model runs as one graph, the attention's dropout draws included.
Appendix "Making it fast" (``book/fast.ipynb``).
"""

from __future__ import annotations

import pytest
import torch
import torch._dynamo as dynamo

from diagsink.engine.config import config_hash, load_config, override
from diagsink.errors import ConfigError
from diagsink.model import TSModel
from diagsink.variants import VARIANTS


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_variant_traces_as_one_graph_without_breaks(variant):
    torch.manual_seed(0)
    model = TSModel(7, [torch.eye(7)] * 2, variant=variant, d_model=8, n_heads=2, depth=2)
    explained = dynamo.explain(model.train())(torch.randn(2, 12, 7, 2))
    assert explained.graph_count == 1 and explained.graph_break_count == 0, explained.break_reasons


def test_train_compile_is_an_optional_key_that_defaults_to_off():
    cfg = load_config("quick")
    assert cfg["train"].get("compile", False) is False
    on = override(cfg, {"train.compile": True})
    assert on["train"]["compile"] is True
    assert config_hash(override(cfg, {"train.compile": False})) == config_hash(cfg)
    with pytest.raises(ConfigError, match="compile"):
        override(cfg, {"train.compile": "yes"})
