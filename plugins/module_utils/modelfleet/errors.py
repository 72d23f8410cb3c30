"""Typed errors shared by modelfleet's pure logic. Each carries a one-line message that names the
thing at fault and, where there is one, the fix. Module shells turn them into fail_json; the CLI
prints them on one line and exits 2."""


class ModelfleetError(Exception):
    """Base class: str(err) is the whole user-facing message."""


class CheckpointError(ModelfleetError):
    """A checkpoint (config, index or shard) is malformed or incomplete."""


class ProfileError(ModelfleetError):
    """A model profile does not match the schema."""


class PlanError(ModelfleetError):
    """The planner got inputs it cannot plan from."""


class DiskPlanError(ModelfleetError):
    """Bad inputs to the disk planner (nothing is ever deleted when this is raised)."""


class GpuFactsError(ModelfleetError):
    """nvidia-smi / NVML output could not be read."""
