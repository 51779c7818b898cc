"""The built-in recipe steps, registered by name: prune, finetune, merge, calibrate, evaluate, export."""

# isort: off
from compressor.steps import prune, finetune, merge, calibrate, evaluate, export  # noqa: F401  (registers them, in recipe order)

# isort: on
from compressor.schema import Field
from compressor.steps.base import Step, register_step

__all__ = ["Field", "Step", "register_step"]
