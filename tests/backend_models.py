"""Random-init tiny transformers MoE models for the backend tests (2-4 layers, hidden 32)."""

from __future__ import annotations

import pytest
import torch

COMMON = dict(vocab_size=64, hidden_size=32, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)


def tiny(kind: str = "mixtral", layers: int = 3, seed: int = 0):
    """A seeded random-init model of `kind` (mixtral, olmoe, qwen2_moe, qwen3_moe), in eval mode."""
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
    elif kind == "qwen3_moe":
        cfg = tf.Qwen3MoeConfig(**COMMON, intermediate_size=48, moe_intermediate_size=16, num_hidden_layers=layers,
                                num_experts=8, num_experts_per_tok=2, head_dim=8)
        cls = tf.Qwen3MoeForCausalLM
    else:
        raise ValueError(kind)
    model = cls(cfg).eval()
    if kind == "olmoe":  # OLMoE initialises its router to zeros: every token would tie
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


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny matrices: torch's intra-op thread pool only adds spin-wait on a shared machine.
    Importing this fixture into a test module applies it to that module."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
