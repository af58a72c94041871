"""TorchRL's contract, run on TorchRL's class and on the torchrl_ext class that replaces it.

Each test builds the same scenario twice (parametrized), once with TorchRL's class and once
with torchrl_ext's, and checks the observable results agree: stored rows, lengths, cursors,
samples, errors, checkpoints, losses. Where torchrl_ext differs on purpose, the test pins the
difference and names the docs/migrating.md entry that documents it. It runs in the stable and the
nightly CI jobs, so an upstream change to the contract shows here first.
"""
