"""The deploy record: what a successful deploy left serving on a host, so that an unchanged re-run can
prove, in one look, that nothing needs doing.

A record is written on the host (root only) at the end of a successful deploy. It holds

- the digest of the deploy's *inputs* (the effective profile, the resolved commit, the TP/EP plan, the
  driver, a digest of the controller's roles/plugins/playbooks, and every modelfleet role variable the
  host sees), computed on the controller - never the inputs themselves, which may hold a token or an API
  key (nor are they sent to the host: a no_log module option would mask every value they share with the
  record, the served name and URL among them);
- the sha256 of the installed unit file and of its environment file, and a digest of the venv's installed
  distributions, as they were when the deploy had proven the server ready;
- the model directory, the unit, the URL and the served name;
- the outcome the deploy published (fetch, environment, unit, benchmark), replayed on the fast path.

A host is *current* only when every one of these holds now: same input digest, same unit and env file
bytes, same venv, the model's completion marker present with the same commit in its lock, the unit
active, no other modelfleet vLLM unit active, and the server ready (health, model listed, one real
completion). Anything else is a reason, and the deploy takes its full path."""

from __future__ import annotations

import glob
import hashlib
import json
import os
import re
import subprocess
import tempfile

from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.errors import ModelfleetError
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.fetch import MARKER_DIR
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.systemd import list_units
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.vllm_unit import UNIT_GLOB

RECORD_VERSION = 1


class RecordError(ModelfleetError):
    """A record that cannot be read or written."""


# the role variables that are a deploy's inputs: every variable of these roles and of modelfleet itself ...
INPUT_PREFIXES = ("modelfleet_", "hf_fetch_", "nvidia_env_", "vllm_service_", "benchmark_", "storage_cleanup_")
# ... less what a run publishes and what only shapes the rollout or the endpoints (the profile's content is an
# input itself; its name, the wave, the group and the pace are not)
NOT_INPUTS = re.compile(
    r"^(.*_outcome"
    r"|modelfleet_(canary_passed|targets|serial|max_fail_percentage|benchmark|fast_path)"
    r"|modelfleet_(profile|profile_name|profiles_dir|rollout|rollout_plan|wave|wave_index|canary|group)"
    # the endpoints a host runs for its groups (the fleet_endpoint role's input, not this host's deploy's)
    r"|modelfleet_endpoints?|vllm_service_endpoint"
    # the deploy steps' own inputs (role modelfleet_deploy): the profile and commit, counted above themselves
    r"|modelfleet_deploy_.*)\Z")


def input_variables(variables: dict) -> dict:
    """The variables among `variables` that are a deploy's inputs (INPUT_PREFIXES less NOT_INPUTS)."""
    return {k: v for k, v in variables.items()
            if isinstance(k, str) and k.startswith(INPUT_PREFIXES) and not NOT_INPUTS.match(k)}


def inputs_digest(*, profile: dict, revision: str, plan: dict | None, driver: str | None, code: str,
                  variables: dict) -> str:
    """sha256 (hex) of everything a deploy asks of a host: the effective profile, the commit, the TP/EP plan, the
    driver version, the controller code's digest and the input variables (input_variables). Only the digest
    is stored on the host; the values may hold the hub token or the API key."""
    doc = {"profile": profile, "revision": revision, "plan": plan or {}, "driver": driver or "", "code": code,
           "variables": input_variables(variables)}
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()


def valid_digest(digest: str) -> str:
    if not re.fullmatch(r"[0-9a-f]{64}", digest or ""):
        raise RecordError(f"deploy_record: inputs_digest must be a hex sha256, got {digest!r}; pass "
                          "\"{{ inputs | to_json(sort_keys=true) | hash('sha256') }}\"")
    return digest


def file_sha256(path: str) -> str | None:
    try:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        return h.hexdigest()
    except OSError:
        return None


def venv_digest(venv: str) -> str | None:
    """A digest of the venv's installed distributions (their dist-info names, which carry the versions);
    None when the venv has no python."""
    if not os.path.exists(os.path.join(venv, "bin", "python")):
        return None
    pattern = os.path.join(venv, "lib", "python*", "site-packages", "*.dist-info")
    names = sorted(os.path.basename(p) for p in glob.glob(pattern))
    return hashlib.sha256("\n".join(names).encode()).hexdigest()


def model_state(model_dir: str) -> dict:
    """The completion marker, the commit in the model's lock file, and the files of the lock that are
    missing or not of the locked size (a stat each; hashing is hf_fetch's job)."""
    marker = os.path.join(model_dir, MARKER_DIR)
    try:
        with open(os.path.join(marker, "lock.json")) as f:
            lock = json.load(f)
    except (OSError, ValueError):
        lock = {}
    wrong = []
    for e in lock.get("files") or []:
        p = os.path.join(model_dir, e.get("name", ""))
        if not os.path.isfile(p) or os.path.getsize(p) != e.get("size"):
            wrong.append(e.get("name"))
    return {"complete": os.path.exists(os.path.join(marker, "complete")), "revision": lock.get("revision"),
            "wrong_files": wrong}


def build_record(*, inputs_digest: str, summary: dict, unit: str, unit_path: str, env_file: str, model_dir: str,
                 venv: str, url: str, served_name: str, outcome: dict) -> dict:
    """The record of what serves now, with the file digests measured at this moment."""
    missing = [p for p in (unit_path, env_file, model_dir) if not os.path.exists(p)]
    if missing:
        raise RecordError(f"deploy_record: nothing to record - {', '.join(missing)} missing; the deploy that "
                          "writes the record must have installed the unit and the model first")
    return {"version": RECORD_VERSION, "inputs_digest": valid_digest(inputs_digest), "summary": summary, "unit": unit,
            "unit_path": unit_path, "unit_sha256": file_sha256(unit_path), "env_file": env_file,
            "env_sha256": file_sha256(env_file), "model_dir": model_dir,
            "model_revision": model_state(model_dir)["revision"], "venv": venv, "venv_digest": venv_digest(venv),
            "url": url, "served_name": served_name, "outcome": outcome}


def read_record(path: str) -> dict | None:
    """The record at `path`, or None when there is none or it is not one this version wrote."""
    try:
        with open(path) as f:
            rec = json.load(f)
    except (OSError, ValueError):
        return None
    return rec if isinstance(rec, dict) and rec.get("version") == RECORD_VERSION else None


def write_record(path: str, record: dict, check_mode: bool = False) -> bool:
    """Write the record atomically (root only, 0600 in a 0700 folder); True when its content changed."""
    text = json.dumps(record, sort_keys=True, indent=1) + "\n"
    try:
        with open(path) as f:
            if f.read() == text:
                return False
    except OSError:
        pass
    if check_mode:
        return True
    folder = os.path.dirname(path)
    os.makedirs(folder, mode=0o700, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".record-")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return True


def env_value(env_file: str, name: str) -> str | None:
    try:
        with open(env_file) as f:
            for line in f:
                k, sep, v = line.rstrip("\n").partition("=")
                if sep and k.strip() == name:
                    return v
    except OSError:
        return None
    return None


def active_units(run=subprocess.run) -> list[str]:
    """The modelfleet vLLM units that are active (raises SystemdError when systemd cannot be read)."""
    return sorted({u["unit"] for u in list_units([UNIT_GLOB], state="active", run=run)})


def observe(record: dict, run=subprocess.run) -> dict:
    """What the host shows now of what the record names (files, venv, model, units); no network."""
    return {"unit_sha256": file_sha256(record["unit_path"]), "env_sha256": file_sha256(record["env_file"]),
            "venv_digest": venv_digest(record["venv"]), "model": model_state(record["model_dir"]),
            "active_units": active_units(run)}


def drift(record: dict | None, inputs_digest: str, observed: dict | None) -> list[str]:
    """Why the host is not current (empty: it is), from the record, this run's inputs and what was observed.
    Pure: no I/O."""
    if record is None:
        return ["no deploy record on this host (never deployed by modelfleet, or by another version)"]
    if record.get("inputs_digest") != inputs_digest:
        return ["the deploy asks for something else than what was deployed (profile, revision, plan, code or a "
                "role variable differs)"]
    if observed is None:
        return ["not observed"]
    why = []
    if observed.get("unit_sha256") is None:
        why.append(f"the unit file {record['unit_path']} is gone")
    elif observed["unit_sha256"] != record.get("unit_sha256"):
        why.append(f"the unit file {record['unit_path']} was changed since the deploy")
    if observed.get("env_sha256") != record.get("env_sha256"):
        why.append(f"the environment file {record['env_file']} was changed or removed since the deploy")
    if observed.get("venv_digest") is None:
        why.append(f"the venv {record['venv']} has no python")
    elif observed["venv_digest"] != record.get("venv_digest"):
        why.append(f"the packages in {record['venv']} changed since the deploy")
    model = observed.get("model") or {}
    if not model.get("complete"):
        why.append(f"{record['model_dir']} has no completion marker")
    elif model.get("revision") != record.get("model_revision"):
        why.append(f"{record['model_dir']} holds commit {model.get('revision')}, not {record.get('model_revision')}")
    elif model.get("wrong_files"):
        why.append(f"{record['model_dir']}: missing or wrong size: {', '.join(model['wrong_files'][:5])}")
    active = observed.get("active_units") or []
    if record["unit"] not in active:
        why.append(f"{record['unit']} is not active")
    others = [u for u in active if u != record["unit"]]
    if others:
        why.append(f"other model units are active: {', '.join(others)}")
    return why


def check(path: str, inputs_digest: str, run=subprocess.run, probe=None) -> dict:
    """The whole check: record, inputs, host, then (only when all that holds) one readiness look."""
    digest = valid_digest(inputs_digest)
    record = read_record(path)
    observed = observe(record, run) if record is not None and record.get("inputs_digest") == digest else None
    why = drift(record, digest, observed)
    readiness = {}
    if not why and probe is not None:
        key = env_value(record["env_file"], "VLLM_API_KEY") or None
        stage, detail, _dummy = probe(record["url"], record["served_name"], key)
        readiness = {"stage": stage, "detail": detail}
        if stage != "ready":
            why.append(f"{record['url']} is not ready: {detail}")
    return {"current": not why, "reasons": why, "readiness": readiness,
            "record": ({k: record[k] for k in ("summary", "unit", "url", "served_name", "model_dir", "outcome")}
                       if record is not None else {})}
