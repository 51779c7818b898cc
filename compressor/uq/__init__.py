"""Uncertainty: reading any model's output as member logits and an ensemble prediction
(`outputs`, `inference`), the uncertainty scores and metrics (`scores`, `metrics`), temperature
scaling and the OOD threshold (`calibration`), side-by-side evaluation (`evaluate`) and plots.

Above the data and model-family layers; below surgery, training, deployment and the run machinery.
"""
