"""Model surgery on head masks: checks that masks fit a model (`mask_checks`), MLP-unit importance
and selection (`mlp_units`), FLOPs/parameter budgets (`budget`) and physical removal of heads and
MLP units through torch-pruning (`physical`). Knows no merger: Hydra lives in `mergers/hydra`.
"""
