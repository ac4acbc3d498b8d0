"""A PPO/GRPO trainer for causal LMs on Ray that emits the rlpulse metric catalog.

``python -m rlpulse.trainer --config trainer/configs/reverse.yaml``; see trainer/README.md.
"""
