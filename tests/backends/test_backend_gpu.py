"""CUDA paths of the backend (copy stream and events, pinned RAM-tier rows and staging, device
pools); skipped without a GPU. `bench/gpu_check.sh` runs these and the large-expert checks of
`bench/gpu_check.py` on one or two GPUs."""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

from support.backend_models import plain_batched, tiny  # noqa: E402

from casmoe.backends.hostcache import HostCache  # noqa: E402
from casmoe.backends.runtime import OffloadedModel, Prompt  # noqa: E402
from casmoe.policies import get_policy  # noqa: E402
from casmoe.replay import replay  # noqa: E402

PROMPTS = [Prompt([1, 5, 9, 3, 7, 2]), Prompt([4, 4, 8, 1]), Prompt([9, 2, 2, 6, 30])]


def _model(layers: int = 3):
    """bf16, the dtype GPU kernels (grouped_mm) are built for."""
    return tiny("mixtral", layers=layers).to(torch.bfloat16)


def _plain_cuda(model, steps, batch=1):
    return plain_batched(copy.deepcopy(model).to("cuda"), [p.ids for p in PROMPTS], steps, batch, device="cuda")


def _equal(run, want) -> bool:
    return all(torch.equal(a.to(b.device), b) for ra, rb in zip(run.logits, want) for a, b in zip(ra, rb))


@pytest.mark.parametrize("ram", [False, True])
@pytest.mark.parametrize("slots", [2, 3])
@pytest.mark.parametrize("policy", ["lru", "semoe", "belady"])
def test_cuda_load_mode_matches_the_model_on_the_gpu(policy, slots, ram):
    model = _model()
    want = _plain_cuda(model, 5)
    om = OffloadedModel(copy.deepcopy(model), devices=["cuda:0"])
    host = HostCache(8, get_policy("lru")) if ram else None
    run = om.run(PROMPTS, get_policy(policy), slots, max_new_tokens=5, keep_logits=True, host=host)
    assert _equal(run, want)
    cache = get_policy(policy).create(run.trace.geometry, slots, trace=run.trace)
    ref = replay(run.trace, cache).stats
    assert (run.stats.hits + run.stats.late_hits, run.stats.misses, run.stats.loads) == (ref.hits, ref.misses, ref.loads)


def test_cuda_batched_decode_matches():
    model = _model()
    want = _plain_cuda(model, 4, batch=3)
    run = OffloadedModel(copy.deepcopy(model), devices=["cuda:0"]).run(
        PROMPTS, get_policy("lru"), 2, max_new_tokens=4, keep_logits=True, batch=3)
    assert _equal(run, want)


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
def test_two_gpus_split_layers_exactly():
    model = _model(4)
    want = _plain_cuda(model, 4)
    om = OffloadedModel(copy.deepcopy(model), devices=["cuda:0", "cuda:1"])
    run = om.run(PROMPTS, get_policy("lru"), 2, max_new_tokens=4, keep_logits=True)
    assert _equal(run, want)
