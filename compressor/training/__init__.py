"""Short supervised training: the base model, member fine-tunes and the merged fine-tune
(`loop.train` over a `TrainConfig`), with the ensemble levers and the NaN guard."""
