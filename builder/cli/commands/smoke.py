"""`builder smoke IMAGE [--gpus all] [--json FILE]`: run the in-image checks, in the Docker daemon when
it holds IMAGE, else through podman's API over buildah's storage (an image `builder build` wrote is
copied there from the builder's layout first)."""

from __future__ import annotations

from builder.engine import image_reference, storage_engine
from builder.runtime.smoke.program import CHECKS
from builder.smoke import smoke_gate, smoke_host


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "smoke", help="run the ABI/import/GPU smoke checks inside an image",
        description="Run the smoke checks (python -m builder.runtime.smoke) inside IMAGE and report each check.")
    parser.add_argument("image", metavar="IMAGE", help="image reference (tag or digest)")
    parser.add_argument("--gpus", metavar="all|N",
                        help="pass GPUs into the container, like docker run --gpus")
    parser.add_argument("--json", dest="json_path", metavar="FILE",
                        help="also write the report as JSON to FILE")
    parser.add_argument("--only", nargs="+", choices=sorted(CHECKS), metavar="CHECK",
                        help=f"run only these checks ({', '.join(CHECKS)})")
    parser.set_defaults(func=run)


def run(args) -> int:
    image = image_reference.check_reference(args.image)
    with smoke_host.client_for(image, storage_engine()) as client:
        return smoke_gate.smoke(image, args.gpus, args.json_path, args.only, client)
