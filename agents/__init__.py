"""PPO agents for LLMSched-v0: training, evaluation against the baselines, imitation warm start."""
