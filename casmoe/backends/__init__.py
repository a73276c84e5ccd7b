"""casmoe.backends: a real torch runtime that runs transformers MoE models with offloaded experts."""
