"""The per-architecture adapter table, and DeepSeek's grouped routing as recorded by the backend
against an independent derivation from transformers' `output_router_logits`."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from support.backend_models import KINDS, one_thread, tiny  # noqa: E402,F401  (one_thread: autouse)

from casmoe.backends.adapters import ADAPTERS, UnsupportedModel, adapter_for  # noqa: E402
from casmoe.backends.record import RoutingRecorder, generate_and_record  # noqa: E402
from casmoe.backends.runtime import OffloadedModel, Prompt  # noqa: E402


def test_every_tested_family_has_an_adapter_and_unknown_ones_are_named():
    assert set(KINDS) == set(ADAPTERS)
    for kind in KINDS:
        a = adapter_for(kind)
        assert a.model_class().__name__ == a.class_name
        assert (a.shared is not None) == kind.startswith(("qwen2", "deepseek"))
    with pytest.raises(UnsupportedModel, match=r"^x: model type 'gpt2' is not a supported MoE model \(supported: "):
        adapter_for("gpt2", "x")


def _grouped_topk(model, logits: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """DeepSeek's group-limited routing, written from its paper's description, from raw router
    logits [T, E]: ids sorted per token, and their weights in that order."""
    cfg = model.config
    E, G, k = cfg.n_routed_experts, cfg.n_group, cfg.num_experts_per_tok
    if cfg.model_type == "deepseek_v2":
        scores = torch.softmax(logits, dim=-1)
        group = scores.view(-1, G, E // G).amax(-1)
        choice = scores
    else:
        scores = torch.sigmoid(logits)
        choice = scores + 0.0  # e_score_correction_bias starts at zero
        group = choice.view(-1, G, E // G).topk(2, dim=-1).values.sum(-1)
    keep = torch.zeros_like(group).scatter_(1, group.topk(cfg.topk_group, dim=-1).indices, 1)
    allowed = keep.repeat_interleave(E // G, dim=1).bool()
    idx = choice.masked_fill(~allowed, float("-inf")).topk(k, dim=-1).indices
    idx = idx.sort(dim=-1).values
    w = scores.gather(1, idx)
    if cfg.model_type == "deepseek_v3" and cfg.norm_topk_prob:
        w = w / w.sum(-1, keepdim=True)
    return idx.numpy(), (w * cfg.routed_scaling_factor).numpy()


@pytest.mark.parametrize("kind", ["deepseek_v2", "deepseek_v3"])
def test_deepseek_grouped_routing_is_recorded_as_the_model_routes(kind):
    model = tiny(kind).double()
    model.set_experts_implementation("eager")  # grouped_mm has no float64 kernel
    prompt = [5, 17, 33, 2, 60, 41, 7]
    with torch.no_grad():
        out = model(input_ids=torch.tensor([prompt]), output_router_logits=True)
    want = [_grouped_topk(model, lg.double()) for lg in out.router_logits]  # per MoE layer
    with RoutingRecorder(model) as recorder:
        [(rows, _)] = generate_and_record(model, recorder, [prompt], max_new_tokens=1)
    trace = OffloadedModel(model).reference([Prompt(prompt)], 1).trace
    for topk, weights in ((rows["topk"], rows["weights"]), (trace.requests[0].topk, trace.requests[0].weights)):
        for layer, (ids, w) in enumerate(want):
            order = np.argsort(topk[:, layer], axis=-1)
            np.testing.assert_array_equal(np.take_along_axis(topk[:, layer], order, -1), ids)
            np.testing.assert_allclose(np.take_along_axis(weights[:, layer], order, -1), w, rtol=1e-6)
