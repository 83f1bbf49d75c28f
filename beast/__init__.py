"""beast: a PyTorch engine for scalable deep reinforcement learning."""

__version__ = "0.1.0"
