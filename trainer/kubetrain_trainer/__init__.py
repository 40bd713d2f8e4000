"""kubetrain's trainer: the program each worker pod runs.

Importing this package (and its `config`, `contract`, `exit_codes` and `termination` modules) must not
import torch: the operator imports them to validate TrainingJob specs, to build worker environments and
to read the exit code a worker recorded.
"""
