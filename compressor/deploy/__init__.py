"""Deployment: verified exports and their reload without pickle (`export`), ONNX export
(`onnx_export`) and per-sample predictions with uncertainty and an OOD flag (`predict`).
"""
