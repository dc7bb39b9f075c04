"""Refresh or check the console's third-party browser assets.

The console serves a few files from npm packages (a graph layout library and
Swagger UI for an offline ``/docs``). They are committed under
``static/vendor/`` so that running the server needs no build step and no
network. This script is the one documented way to change them:

    python -m server.console.vendor            # install package-lock.json's exact versions, copy the files
    python -m server.console.vendor --check    # the committed files still match VENDORED.json (offline)

To move to another version, change it in ``package.json``, run
``npm install --package-lock-only --ignore-scripts`` in ``server/console/``,
then run this script and commit the three results. It runs ``npm ci
--ignore-scripts`` (no install scripts of any package run) in a temporary
directory, copies only the files listed in :data:`FILES` with each package's
licence, and records name, version, licence, the lock file's integrity hash
and each file's SHA-256 in ``static/vendor/VENDORED.json``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
VENDOR = HERE / "static" / "vendor"
MANIFEST = VENDOR / "VENDORED.json"

#: npm package -> (directory under static/vendor/, files to copy from the package).
FILES: dict[str, tuple[str, tuple[str, ...]]] = {
    # graph layout for the automaton view: a self-contained ES module (graphlib bundled), 49 KB
    "@dagrejs/dagre": ("dagre", ("dist/dagre.esm.js", "dist/dagre.esm.js.LEGAL.txt", "LICENSE")),
    # Swagger UI for /docs without a CDN
    "swagger-ui-dist": ("swagger-ui", ("swagger-ui-bundle.js", "swagger-ui-bundle.js.LICENSE.txt", "swagger-ui.css",
                                       "favicon-32x32.png", "LICENSE", "NOTICE")),
}


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def refresh(npm: str = "npm") -> dict:
    """Install the locked packages in a scratch directory and copy their files here."""
    lock = json.loads((HERE / "package-lock.json").read_text())["packages"]
    entries = []
    with tempfile.TemporaryDirectory(prefix="cayuga-vendor-") as tmp:
        for name in ("package.json", "package-lock.json"):
            shutil.copy(HERE / name, Path(tmp) / name)
        subprocess.run([npm, "ci", "--ignore-scripts", "--no-audit", "--no-fund", "--loglevel=error"],
                       cwd=tmp, check=True)
        for pkg, (subdir, files) in sorted(FILES.items()):
            src = Path(tmp) / "node_modules" / pkg
            meta = json.loads((src / "package.json").read_text())
            dest = VENDOR / subdir
            if dest.exists():
                shutil.rmtree(dest)
            dest.mkdir(parents=True)
            copied = {}
            for f in files:
                target = dest / Path(f).name
                shutil.copy(src / f, target)
                copied[target.name] = _sha256(target)
            entries.append({"name": pkg, "version": meta["version"], "license": meta.get("license"),
                            "integrity": lock[f"node_modules/{pkg}"].get("integrity"),
                            "directory": subdir, "files": copied})
    manifest = {"refresh": "python -m server.console.vendor", "packages": entries}
    MANIFEST.write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def check() -> list[str]:
    """Problems with the committed files (empty when they match the manifest and the lock)."""
    manifest = json.loads(MANIFEST.read_text())
    lock = json.loads((HERE / "package-lock.json").read_text())["packages"]
    problems = []
    listed = {p["name"] for p in manifest["packages"]}
    if listed != set(FILES):
        problems.append(f"VENDORED.json lists {sorted(listed)}, vendor.py wants {sorted(FILES)}")
    for p in manifest["packages"]:
        locked = lock.get(f"node_modules/{p['name']}", {})
        if locked.get("version") != p["version"] or locked.get("integrity") != p["integrity"]:
            problems.append(f"{p['name']}: vendored {p['version']}, package-lock.json has {locked.get('version')}")
        for fname, digest in p["files"].items():
            path = VENDOR / p["directory"] / fname
            if not path.is_file():
                problems.append(f"{path.relative_to(HERE)} is missing")
            elif _sha256(path) != digest:
                problems.append(f"{path.relative_to(HERE)} differs from what {p['name']}@{p['version']} ships")
    return problems


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m server.console.vendor", description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="verify the committed files (no network)")
    ap.add_argument("--npm", default="npm", help="the npm command (default: npm)")
    args = ap.parse_args(argv)
    if args.check:
        problems = check()
        for p in problems:
            print(p, file=sys.stderr)
        return 1 if problems else 0
    for p in refresh(args.npm)["packages"]:
        files = ", ".join(p["files"])
        print(f"{p['name']}@{p['version']} ({p['license']}): {files} -> static/vendor/{p['directory']}/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
