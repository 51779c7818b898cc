"""Core: what every other layer may use and nothing here imports from above.

The error tree (`errors`), atomic file writes and hashes (`io`), named-component registries
(`registry`), the one schema idiom for options (`schema`), torch.distributed helpers
(`distributed`), device and precision (`device`), train/eval mode helpers (`modes`), head masks
as data (`masks`) and safe weight loading (`weights`).
"""
