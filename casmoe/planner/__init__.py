"""The CasMoE planner: prompt-level prediction of every layer's experts."""
