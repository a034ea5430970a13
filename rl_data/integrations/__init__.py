"""Integrations with the training frameworks users run, one module per framework (optional extras):

* :mod:`rl_data.integrations.ray_train` — Ray Train's ``TorchTrainer`` (``pip install rl_data[train]``);
* :mod:`rl_data.integrations.trl` — TRL's ``GRPOTrainer`` (``pip install rl_data[trl]``).

Importing this package imports neither framework.
"""
