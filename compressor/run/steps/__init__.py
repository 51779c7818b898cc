"""The built-in recipe steps, registered by name: prune, finetune, merge, calibrate, evaluate, export."""

# isort: off
from compressor.run.steps import prune, finetune, merge, calibrate, evaluate, export  # noqa: F401  (registers them, in recipe order)

# isort: on
from compressor.core.schema import Field
from compressor.run.steps.base import Step, register_step

__all__ = ["Field", "Step", "register_step"]
