"""Inventory plugin: a fleet of GPU hosts from a `*.fleet.yml` file (modelfleet's Python inventory driver)."""

from __future__ import annotations

DOCUMENTATION = r"""
name: fleet
short_description: modelfleet fleet files (*.fleet.yml) - GPU hosts, groups, profiles and rollout waves
description:
  - Reads a fleet file describing host groups (connection, GPU kind/count/memory, interconnect, models root,
    the profile each group serves, per-host overrides) and rollout waves (canary first).
  - Adds the declared groups and derived ones - gpu_<kind>, interconnect_<kind>, profile_<name>,
    wave_<name> and canary - and per-host variables modelfleet_gpu_kind, modelfleet_gpu_count,
    modelfleet_gpu_memory_gib, modelfleet_interconnect, modelfleet_models_root, modelfleet_profile,
    modelfleet_wave, modelfleet_wave_index, modelfleet_canary, plus the group's and host's vars.
  - The rollout (waves, max_fail_percentage) is the variable modelfleet_rollout on every host.
  - Validation errors name the file, line, host or group, and field - unknown keys, a profile that does not
    exist, a GPU count that is not a positive integer, duplicate hosts, a host in two waves.
  - Supports compose, keyed_groups and conditional groups (conditional_groups), and the inventory cache.
options:
  plugin: {description: This plugin's name., required: true, choices: [modelfleet.fleet.fleet, fleet]}
  profiles_dir:
    description: Where profiles live (profile names are file names without .yml); default the checkout's profiles/.
    type: path
  models_root: {description: Fleet-wide models root., type: str}
  connection: {description: Fleet-wide connection variables., type: dict}
  vars: {description: Variables for every host., type: dict}
  gpu: {description: "Fleet-wide GPU defaults (kind, count, memory_gib, interconnect).", type: dict}
  profile: {description: Fleet-wide profile., type: str}
  groups: {description: 'Host groups (required) - profile, gpu, models_root, connection, vars, hosts.', type: dict}
  rollout:
    description: Rollout waves [{name, hosts, canary, serial, max_fail_percentage}] and the default max_fail_percentage.
    type: dict
  conditional_groups: {description: Groups by Jinja2 conditionals (the constructable groups option)., type: dict, default: {}}
extends_documentation_fragment:
  - constructed
  - inventory_cache
"""

EXAMPLES = r"""
# inventory/seed/rtx-pro-6000.fleet.yml
plugin: modelfleet.fleet.fleet
groups:
  rtx_pro_6000:
    profile: kimi-k2.5-int4
    gpu: {kind: rtx-pro-6000-blackwell, count: 8, memory_gib: 96, interconnect: pcie}
    hosts:
      gpu-01: {address: 10.0.0.11}
"""

import os
from pathlib import Path

from ansible.errors import AnsibleParserError
from ansible.plugins.inventory import BaseInventoryPlugin, Cacheable, Constructable


def _fleet():
    from ansible_collections.modelfleet.fleet.plugins.plugin_utils import fleet

    return fleet


class InventoryModule(BaseInventoryPlugin, Constructable, Cacheable):
    NAME = "modelfleet.fleet.fleet"

    def verify_file(self, path):
        return super().verify_file(path) and path.endswith((".fleet.yml", ".fleet.yaml"))

    def _profiles(self, path):
        d = self.get_option("profiles_dir") or str(Path(__file__).resolve().parents[2] / "profiles")
        if not os.path.isdir(d):
            raise AnsibleParserError(f"{path}: profiles_dir {d} does not exist")
        return {p.stem for p in Path(d).glob("*.yml")}

    def parse(self, inventory, loader, path, cache=True):
        super().parse(inventory, loader, path, cache)
        fleet = _fleet()
        try:
            text = Path(path).read_text()
        except OSError as e:
            raise AnsibleParserError(f"{path}: cannot read the fleet file ({e})") from e
        try:
            self._read_config_data(path)
        except Exception as e:  # noqa: BLE001 - the fleet validator names the line and field; prefer its message
            try:
                fleet.parse(text, source=path, profiles=self._profiles(path))
            except fleet.FleetError as fe:
                raise AnsibleParserError(str(fe)) from fe
            raise AnsibleParserError(f"{path}: {e}") from e
        # the cache key includes the file's mtime: an edited fleet file is always parsed again
        cache_key = self.get_cache_key(path) + str(os.stat(path).st_mtime_ns)
        parsed = None
        if cache and self.get_option("cache"):
            try:
                parsed = self._cache[cache_key]
            except KeyError:
                parsed = None
        if parsed is None:
            try:
                parsed = fleet.parse(text, source=path, profiles=self._profiles(path))
            except fleet.FleetError as e:
                raise AnsibleParserError(str(e)) from e
            if self.get_option("cache"):
                self._cache[cache_key] = parsed
        self._populate(parsed)

    def _populate(self, parsed):
        inv = self.inventory
        try:  # ansible-core >= 2.19: inventory file content is trusted, like the yaml plugin's
            from ansible.template import trust_as_template
        except ImportError:  # pragma: no cover - older cores
            def trust_as_template(v):
                return v

        def trusted(v):
            if isinstance(v, str):
                return trust_as_template(v)
            if isinstance(v, dict):
                return {k: trusted(x) for k, x in v.items()}
            if isinstance(v, list):
                return [trusted(x) for x in v]
            return v

        strict = self.get_option("strict")
        for g, gd in parsed["groups"].items():
            inv.add_group(g)
            for h in gd["hosts"]:
                inv.add_host(h, group=g)
        for h, hv in parsed["hosts"].items():
            for k, v in hv.items():
                inv.set_variable(h, k, trusted(v))
            inv.set_variable(h, "modelfleet_rollout", trusted(parsed["rollout"]))
            allvars = inv.get_host(h).get_vars()
            self._set_composite_vars(self.get_option("compose"), allvars, h, strict=strict)
            self._add_host_to_composed_groups(self.get_option("conditional_groups"), allvars, h, strict=strict)
            self._add_host_to_keyed_groups(self.get_option("keyed_groups"), allvars, h, strict=strict)
