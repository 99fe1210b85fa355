"""PPO agents for LLMSched-v1: training, evaluation against the baselines, imitation warm start."""
