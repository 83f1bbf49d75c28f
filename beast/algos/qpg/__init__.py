"""Q-function policy gradients for continuous actions: DDPG, TD3 and SAC (rlpyt's third
family), plug-ins on the shared engine and its transition replay.

    functions.py   the targets, losses and the tanh-Gaussian, from the papers' equations
    networks.py    the built-in actor and twin critics, and what a user's network provides
    algorithms.py  the plug-ins (--algo ddpg, td3, sac) and their learner updates
"""
