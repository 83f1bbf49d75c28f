"""A trained policy: --mode test (play), the policy as one function, export."""
