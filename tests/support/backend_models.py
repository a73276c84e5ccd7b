"""Random-init tiny transformers MoE models for the backend tests (2-4 layers, hidden 32)."""

from __future__ import annotations

import pytest
import torch

KINDS = ("mixtral", "olmoe", "qwen2_moe", "qwen3_moe", "deepseek_v2", "deepseek_v3")
COMMON = dict(vocab_size=64, hidden_size=32, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)


def tiny(kind: str = "mixtral", layers: int = 3, seed: int = 0):
    """A seeded random-init model of `kind` (one of KINDS), in eval mode. Qwen2-MoE's layer 1 and
    DeepSeek's layer 0 are dense MLPs; Qwen2-MoE and DeepSeek carry shared experts."""
    import transformers as tf

    torch.manual_seed(seed)
    if kind == "mixtral":
        cfg = tf.MixtralConfig(**COMMON, intermediate_size=48, num_hidden_layers=layers, num_local_experts=8,
                               num_experts_per_tok=2)
        cls = tf.MixtralForCausalLM
    elif kind == "olmoe":
        cfg = tf.OlmoeConfig(**COMMON, intermediate_size=24, num_hidden_layers=layers, num_experts=16,
                             num_experts_per_tok=4)
        cls = tf.OlmoeForCausalLM
    elif kind == "qwen2_moe":
        cfg = tf.Qwen2MoeConfig(**COMMON, intermediate_size=48, moe_intermediate_size=16,
                                shared_expert_intermediate_size=32, num_hidden_layers=layers, num_experts=8,
                                num_experts_per_tok=2, mlp_only_layers=[1])
        cls = tf.Qwen2MoeForCausalLM
    elif kind in ("deepseek_v2", "deepseek_v3"):
        mla = dict(num_key_value_heads=4, kv_lora_rank=16, qk_rope_head_dim=4, v_head_dim=8,  # MLA: kv heads = heads
                   qk_nope_head_dim=4, n_group=4, topk_group=2,
                   moe_intermediate_size=16, n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1,
                   first_k_dense_replace=1)
        if kind == "deepseek_v2":
            cfg = tf.DeepseekV2Config(**{**COMMON, **mla, "topk_group": 1}, intermediate_size=48,  # both from one group
                                      num_hidden_layers=layers, q_lora_rank=None, topk_method="group_limited_greedy")
            cls = tf.DeepseekV2ForCausalLM
        else:
            cfg = tf.DeepseekV3Config(**{**COMMON, **mla}, intermediate_size=48, num_hidden_layers=layers,
                                      q_lora_rank=24)
            cls = tf.DeepseekV3ForCausalLM
    elif kind == "qwen3_moe":
        cfg = tf.Qwen3MoeConfig(**COMMON, intermediate_size=48, moe_intermediate_size=16, num_hidden_layers=layers,
                                num_experts=8, num_experts_per_tok=2, head_dim=8)
        cls = tf.Qwen3MoeForCausalLM
    else:
        raise ValueError(kind)
    model = cls(cfg).eval()
    if kind in ("olmoe", "deepseek_v2", "deepseek_v3"):  # routers start at zeros: every token would tie
        for name, p in model.named_parameters():
            if name.endswith("gate.weight"):
                torch.nn.init.normal_(p, std=0.5)
    return model


def plain_greedy(model, ids: list[int], steps: int) -> list[torch.Tensor]:
    """The un-offloaded transformers model, generating greedily: each step's last logits."""
    from transformers import DynamicCache

    out = []
    past = DynamicCache(config=model.config)
    x = torch.tensor([ids])
    with torch.inference_mode():
        for _ in range(steps):
            o = model(input_ids=x, cache=past, use_cache=True)
            out.append(o.logits[0, -1].clone())
            x = torch.tensor([[int(o.logits[0, -1].argmax())]])
    return out


def plain_batched(model, prompts: list[list[int]], steps: int, batch: int, device: str = "cpu"
                  ) -> list[list[torch.Tensor]]:
    """The un-offloaded model through the backend's decode loop with `batch` requests decoding
    together: each request's last logits at every step."""
    from casmoe.backends.generate import step_logits

    return step_logits(model, prompts, steps, batch=batch, device=device)


def save_checkpoint(model, path, shard: str = "40KB") -> None:
    """`model` as a sharded safetensors checkpoint in the hub layout (one tensor per expert)."""
    model.save_pretrained(path, max_shard_size=shard)


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny matrices: torch's intra-op thread pool only adds spin-wait on a shared machine.
    Importing this fixture into a test module applies it to that module."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
