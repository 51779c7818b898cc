"""Run machinery, the top layer: the recipe and its validation (`recipe`), the base model
(`models`), preflight checks, the runner and its run folder, the steps (`steps/`), the baselines
the evaluate step adds, the report and the command line (`cli`). Nothing below imports it.
"""
