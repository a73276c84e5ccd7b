"""CUDA paths of the backend (pinned store, copy stream and events, device pools); skipped
without a GPU. `bench/gpu_check.sh` runs these plus the bench on one GPU."""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

from backend_models import tiny  # noqa: E402

from casmoe.backends.runtime import OffloadedModel, Prompt  # noqa: E402
from casmoe.policies import get_policy  # noqa: E402
from casmoe.replay import replay  # noqa: E402

PROMPTS = [Prompt([1]), Prompt([4]), Prompt([9])]


def _model(layers: int = 3):
    """bf16, the dtype GPU kernels (grouped_mm) are built for."""
    return tiny("mixtral", layers=layers).to(torch.bfloat16)


def _plain_cuda(model, prompts, steps):
    from transformers import DynamicCache

    model = copy.deepcopy(model).to("cuda")
    out = []
    with torch.inference_mode():
        for p in prompts:
            past = DynamicCache(config=model.config)
            x = torch.tensor([p.ids], device="cuda")
            row = []
            for _ in range(steps):
                o = model(input_ids=x, cache=past, use_cache=True)
                row.append(o.logits[0, -1].clone())
                x = o.logits[0, -1].argmax().view(1, 1)
            out.append(row)
    return out


@pytest.mark.parametrize("policy", ["lru", "semoe", "belady"])
def test_cuda_load_mode_matches_the_model_on_the_gpu(policy):
    model = _model()
    want = _plain_cuda(model, PROMPTS, 5)
    om = OffloadedModel(copy.deepcopy(model), devices=["cuda:0"])
    assert all(t.is_pinned() for row in om.store.layers for t in row.values())
    run = om.run(PROMPTS, get_policy(policy), 3, max_new_tokens=5, keep_logits=True)
    for ra, rb in zip(run.logits, want):
        for a, b in zip(ra, rb):
            assert torch.equal(a, b)
    cache = get_policy(policy).create(run.trace.geometry, 3, trace=run.trace)
    ref = replay(run.trace, cache).stats
    assert (run.stats.hits + run.stats.late_hits, run.stats.misses, run.stats.loads) == (ref.hits, ref.misses, ref.loads)


def test_cuda_pool_is_the_only_expert_memory_on_the_device():
    model = _model(4)
    expert_bytes = sum(p.numel() * p.element_size() for n, p in model.named_parameters() if ".experts." in n)
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    om = OffloadedModel(model, devices=["cuda:0"])
    dense = torch.cuda.memory_allocated() - before
    seen = []

    def check(om_, layer):
        seen.append(torch.cuda.memory_allocated())
        om_.check_residency()

    om.on_layer = check
    om.run(PROMPTS, get_policy("lru"), 2, max_new_tokens=4)
    pool = 2 * om.geometry.layers * om.geometry.layer_expert_bytes[0]
    assert dense < expert_bytes  # the experts stayed on the host
    assert max(seen) - before - dense < pool + 4 * 2**20  # pool + activations, nothing like all experts


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_two_gpus_split_layers():
    model = _model(4)
    want = _plain_cuda(model, PROMPTS, 4)
    om = OffloadedModel(copy.deepcopy(model), devices=["cuda:0", "cuda:1"])
    run = om.run(PROMPTS, get_policy("lru"), 3, max_new_tokens=4, keep_logits=True)
    for ra, rb in zip(run.logits, want):
        for a, b in zip(ra, rb):
            torch.testing.assert_close(a.to("cuda:0"), b)
