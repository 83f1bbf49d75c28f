"""Q-function policy gradients for continuous actions: DDPG, TD3 and SAC (rlpyt's third
family), plug-ins on the shared engine and its transition replay.

    functions.py   the targets, losses and the tanh-Gaussian, from the papers' equations
    networks.py    the built-in actor and twin critics, and what a user's network provides
    updates.py     the learner updates: the actor-critic's common part, the deterministic
                   actor's (DDPG, TD3)
    ddpg.py        --algo ddpg, and the flags and plug-in TD3 and SAC build on
    td3.py         --algo td3
    sac.py         --algo sac, and its update
"""
