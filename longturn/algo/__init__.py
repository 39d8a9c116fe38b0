"""RL algorithms: dual-discount GAE, PPO losses, the DeepSpeed trainer."""
