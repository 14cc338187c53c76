"""Regenerate the checked-in gRPC stubs from ``api/world_manager.proto``.

Run from the repository root after editing the .proto:  ``python -m api.generate``
(needs grpcio-tools). The stubs are checked in so an install needs no code generation.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO = "api/world_manager.proto"


def main() -> int:
    from grpc_tools import protoc

    args = ["protoc", f"-I{ROOT}", f"--python_out={ROOT}", f"--pyi_out={ROOT}", f"--grpc_python_out={ROOT}", PROTO]
    code = protoc.main(args)
    if code:
        print(f"protoc failed ({code})", file=sys.stderr)
    return int(code)


if __name__ == "__main__":
    sys.exit(main())
