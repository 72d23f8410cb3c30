"""modelfleet: deploy and benchmark 1T-parameter LLM checkpoints on GPU hosts with vLLM."""

__version__ = "0.1.0"
