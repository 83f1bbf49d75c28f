"""polybeast: any algorithm across machines on Ray, with one or more learners.

    config.py       PolyConfig: monobeast's flags plus the cluster's
    cluster.py      start a private Ray instance on loopback, or join a cluster
    env_server.py   EnvServer: K envs in a loop, a local CPU policy or central steps
    rollouts.py     rollouts staged outside shared memory, committed to slots whole
    feeders.py      env servers' placement and restarts; the threads that fill slots
    distributed.py  several learners: torch.distributed gradient reduction
    trainer.py      LearnerNode (slots + beast.learning.learner.Learner + servers), train()

Ray is imported only when a run starts, so `import beast.poly` works without it.
"""
