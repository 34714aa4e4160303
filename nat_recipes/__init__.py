"""The repository's experiment catalogue, beside the package and not installed with it: the Multi30k quickstart's
systems, presets, training budgets, benchmark rows, quality targets and the numbers the README claims
(:mod:`.catalogue`), the quickstart's report (:mod:`.run_report`) and the training-speed comparison of its recipes
(:mod:`.train_speed`). The run scripts read it from the repository root (run_scripts/common.sh puts the root on
PYTHONPATH):

    python -m nat_recipes.catalogue steps|speed-steps|rows|options|budget --preset P ...
    python -m nat_recipes.run_report WORK --preset P
"""
