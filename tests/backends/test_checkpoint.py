"""Experts read by offset from sharded safetensors checkpoints: the dense skeleton, both expert
layouts, dtype conversion, a RAM tier smaller than the experts, and broken files."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from support.backend_models import KINDS, one_thread, plain_greedy, save_checkpoint, tiny  # noqa: E402,F401  (one_thread: autouse)

from casmoe.backends.checkpoint import Checkpoint, CheckpointError  # noqa: E402
from casmoe.backends.hostcache import HostCache  # noqa: E402
from casmoe.backends.models import open_files, open_model  # noqa: E402
from casmoe.backends.runtime import OffloadedModel, Prompt  # noqa: E402
from casmoe.backends.store import CheckpointStore  # noqa: E402
from casmoe.policies import get_policy  # noqa: E402

STEPS = 4
PROMPTS = [Prompt([1, 5, 9, 3, 7, 2]), Prompt([4, 4, 8, 1])]


def _reference(path, dtype=None):
    import transformers

    return transformers.AutoModelForCausalLM.from_pretrained(path, dtype=dtype or "auto").eval()


def _same(a, b) -> bool:
    return all(torch.equal(x, y) for ra, rb in zip(a, b, strict=True) for x, y in zip(ra, rb, strict=True))


@pytest.mark.parametrize("kind", KINDS)
def test_sharded_bf16_checkpoint_runs_exactly_from_disk(kind, tmp_path):
    """The skeleton's dense tensors are from_pretrained's; offloaded logits (streamed prefill,
    with and without a RAM tier smaller than the experts) equal the loaded model's."""
    save_checkpoint(tiny(kind).to(torch.bfloat16), tmp_path)
    assert len(list(tmp_path.glob("*.safetensors"))) > 1
    ref = _reference(tmp_path)
    want = [plain_greedy(ref, p.ids, STEPS) for p in PROMPTS]
    files = open_files(tmp_path)
    assert files.dtype == torch.bfloat16
    model, store = open_model(files)
    params = dict(ref.named_parameters())
    loaded = [(n, p) for n, p in model.named_parameters() if p.device.type != "meta"]
    assert loaded and all(torch.equal(p, params[n]) for n, p in loaded)
    assert all(".experts." in n for n, p in model.named_parameters() if p.device.type == "meta")
    om = OffloadedModel(model, store=store)
    assert _same(om.reference(PROMPTS, STEPS, keep_logits=True).logits, want)  # routed rows only, layer by layer
    k = om.geometry.top_k
    total = om.geometry.layers * om.geometry.experts
    for host in (None, HostCache(total // 2, get_policy("lru"))):
        run = om.run(PROMPTS, get_policy("lru"), k, max_new_tokens=STEPS, keep_logits=True, host=host)
        assert _same(run.logits, want), host
        assert run.read_s > 0
        if host is not None:
            ram = run.host_stats
            assert ram.accesses == run.stats.loads and ram.misses > 0 and ram.hits > 0


def test_fused_layout_and_dtype_conversion(tmp_path):
    """A checkpoint holding transformers' fused [E, ...] expert tensors reads the same; a bf16
    checkpoint run in float32 equals from_pretrained(dtype=float32)."""
    from safetensors.torch import save_file

    model = tiny("qwen3_moe").to(torch.bfloat16)
    save_checkpoint(model, tmp_path / "hub")
    model.config.save_pretrained(tmp_path / "fused")
    save_file({n: t.contiguous() for n, t in model.state_dict().items()}, str(tmp_path / "fused" / "model.safetensors"))
    want = [plain_greedy(_reference(tmp_path / "hub"), p.ids, STEPS) for p in PROMPTS]
    for folder in ("hub", "fused"):
        model, store = open_model(open_files(tmp_path / folder))
        om = OffloadedModel(model, store=store)
        run = om.run(PROMPTS, get_policy("lru"), 2, max_new_tokens=STEPS, keep_logits=True)
        assert _same(run.logits, want), folder
    want32 = [plain_greedy(_reference(tmp_path / "hub", torch.float32), p.ids, STEPS) for p in PROMPTS]
    model, store = open_model(open_files(tmp_path / "hub", "float32"))
    om = OffloadedModel(model, store=store)
    run = om.run(PROMPTS, get_policy("lru"), 2, max_new_tokens=STEPS, keep_logits=True)
    assert _same(run.logits, want32)


def test_tied_embeddings_are_tied(tmp_path):
    import transformers

    torch.manual_seed(0)
    cfg = transformers.MixtralConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                     num_attention_heads=4, num_key_value_heads=2, num_local_experts=4,
                                     num_experts_per_tok=2, tie_word_embeddings=True)
    save_checkpoint(transformers.MixtralForCausalLM(cfg).eval(), tmp_path)
    model, _ = open_model(open_files(tmp_path))
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert torch.equal(model.lm_head.weight, _reference(tmp_path).lm_head.weight)


def test_broken_checkpoints_are_one_line(tmp_path):
    save_checkpoint(tiny("mixtral", layers=2), tmp_path, shard="10MB")
    (f,) = tmp_path.glob("*.safetensors")
    files = open_files(tmp_path)
    model, store = open_model(files)
    ckpt = Checkpoint(tmp_path)
    info = ckpt.tensors["model.layers.1.block_sparse_moe.experts.3.w2.weight"]
    with open(f, "r+b") as fh:
        fh.truncate(info.offset + 1)
    with pytest.raises(CheckpointError, match="short read"):
        store.read(1, 7, store.empty_rows())
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "config.json").write_text((tmp_path / "config.json").read_text())
    from casmoe.backends.models import ModelError

    with pytest.raises(ModelError, match="no .safetensors weights"):
        open_files(empty)


def test_a_missing_expert_tensor_is_named(tmp_path):
    from safetensors.torch import load_file, save_file

    save_checkpoint(tiny("olmoe", layers=2), tmp_path, shard="10MB")
    (f,) = tmp_path.glob("*.safetensors")
    tensors = load_file(f)
    del tensors["model.layers.1.mlp.experts.5.up_proj.weight"]
    save_file(tensors, f, metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match=r"experts\.5\.up_proj\.weight is missing"):
        open_model(open_files(tmp_path))


def test_store_reads_rows_into_caller_memory(tmp_path):
    model = tiny("deepseek_v2")
    save_checkpoint(model, tmp_path)
    _, store = open_model(open_files(tmp_path))
    assert isinstance(store, CheckpointStore)
    experts = model.model.layers[2].mlp.experts  # MoE layer 1 (decoder layer 0 is dense)
    rows = store.empty_rows()
    before = {n: t.data_ptr() for n, t in rows.items()}
    store.read(1, 6, rows)
    assert {n: t.data_ptr() for n, t in rows.items()} == before
    assert torch.equal(rows["gate_up_proj"], experts.gate_up_proj[6])
    assert torch.equal(rows["down_proj"], experts.down_proj[6])
    assert store.nbytes == sum(p.numel() * p.element_size() for n, p in model.named_parameters()
                               if ".experts." in n and "shared" not in n)


def test_direct_io_reads_the_same_bytes(tmp_path):
    model = tiny("mixtral", layers=2)
    save_checkpoint(model, tmp_path)
    buffered = open_model(open_files(tmp_path))[1]
    try:
        direct = open_model(open_files(tmp_path, direct=True))[1]
        rows = direct.empty_rows()
        direct.read(1, 5, rows)
    except OSError as exc:  # a filesystem without O_DIRECT (tmpfs)
        pytest.skip(f"no O_DIRECT here: {exc}")
    want = buffered.empty_rows()
    buffered.read(1, 5, want)
    assert all(torch.equal(rows[n], want[n]) for n in want)
    assert torch.equal(want["down_proj"], model.model.layers[1].mlp.experts.down_proj[5])
