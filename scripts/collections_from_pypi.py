"""Install the collections named in requirements.yml without Ansible Galaxy: download the `ansible`
community package's wheel from PyPI (it bundles every collection), check that it carries the version
requirements.yml pins, and unpack only those collections into DEST/ansible_collections/.

Usage: python scripts/collections_from_pypi.py requirements.yml DEST
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import yaml

# The ansible community release that carries the pinned collection versions (ansible 12 pairs with
# ansible-core 2.19, the pinned core).
ANSIBLE_PACKAGE = "ansible==12.3.0"


def main(req_file: str, dest: str) -> int:
    wanted = {c["name"]: str(c["version"]) for c in yaml.safe_load(Path(req_file).read_text())["collections"]}
    with tempfile.TemporaryDirectory() as tmp:
        r = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", tmp, ANSIBLE_PACKAGE],
                           capture_output=True, text=True)
        if r.returncode != 0:
            print(f"pip download {ANSIBLE_PACKAGE} failed:\n{r.stderr[-2000:]}", file=sys.stderr)
            return 1
        wheel = next(Path(tmp).glob("ansible-*.whl"))
        out = Path(dest) / "ansible_collections"
        with zipfile.ZipFile(wheel) as z:
            for name, version in wanted.items():
                ns, coll = name.split(".")
                prefix = f"ansible_collections/{ns}/{coll}/"
                manifest = json.loads(z.read(prefix + "MANIFEST.json"))
                have = manifest["collection_info"]["version"]
                if have != version:
                    print(f"{name}: requirements.yml pins {version} but {ANSIBLE_PACKAGE} carries {have}; "
                          f"update requirements.yml or ANSIBLE_PACKAGE", file=sys.stderr)
                    return 1
                target = out / ns / coll
                if target.exists():
                    shutil.rmtree(target)
                for member in z.namelist():
                    if member.startswith(prefix):
                        z.extract(member, Path(dest))
                # pip-style dist-info so `ansible-galaxy collection list` shows the version
                print(f"{name} {have}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    sys.exit(main(sys.argv[1], sys.argv[2]))
