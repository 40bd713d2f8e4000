"""kubetrain's trainer: the program each worker pod runs.

Importing this package (and its `config`, `contract` and `exit_codes` modules) must not import torch:
the operator imports them to validate TrainingJob specs and to build worker environments.
"""
