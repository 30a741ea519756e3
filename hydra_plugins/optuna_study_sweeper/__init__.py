"""A Hydra sweeper that runs an Optuna study kept in a database: `hydra/sweeper=optuna_study`.

Run the same command again after a kill and the study goes on to `n_trials` trials in total.
Hydra finds it by scanning the `hydra_plugins` namespace package (no __init__.py above this one).
"""
