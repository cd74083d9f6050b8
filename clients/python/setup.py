"""Build hook: compile the wire API's .proto into the package while it is built.

The proto lives at the repository's `proto/` (two levels up), the single source of truth
for every language; nothing generated is committed. `pip install ./clients/python`
builds in-tree (pip >= 21.3), so the relative path resolves; an sdist carries a copy
(`proto/` inside it), so a wheel builds from the sdist anywhere; `EVENTBUS_PROTO_DIR`
overrides both (e.g. when building from a copy of this directory).

The proto is compiled from a staging copy placed at `socle_eventbus/_pb/eventbus.proto`,
so the generated modules import each other as `socle_eventbus._pb...` (protoc derives
Python imports from file paths) and the descriptor's file name cannot clash with another
package compiling the same proto. The protobuf package stays `eventbus.v1`.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

HERE = Path(__file__).resolve().parent
PROTO_REL = Path("eventbus") / "v1" / "eventbus.proto"


def proto_root() -> Path:
    """EVENTBUS_PROTO_DIR, else the copy an sdist carries, else the repository's proto/."""
    if "EVENTBUS_PROTO_DIR" in os.environ:
        return Path(os.environ["EVENTBUS_PROTO_DIR"])
    if (HERE / "proto" / PROTO_REL).is_file():
        return HERE / "proto"
    return HERE.parent.parent / "proto"


def proto_file() -> Path:
    path = proto_root() / PROTO_REL
    if not path.is_file():
        raise SystemExit(
            f"socle-eventbus: cannot find {path}; build from the repository checkout "
            "(pip install ./clients/python) or set EVENTBUS_PROTO_DIR to its proto/ directory"
        )
    return path


def generate(out_root: Path) -> None:
    """Writes socle_eventbus/_pb/{__init__,eventbus_pb2,eventbus_pb2_grpc}.py(+.pyi) under out_root."""
    import grpc_tools
    from grpc_tools import protoc

    with tempfile.TemporaryDirectory() as staging:
        stage = Path(staging) / "socle_eventbus" / "_pb"
        stage.mkdir(parents=True)
        shutil.copyfile(proto_file(), stage / "eventbus.proto")
        out = out_root / "socle_eventbus" / "_pb"
        out.mkdir(parents=True, exist_ok=True)
        well_known = Path(grpc_tools.__file__).parent / "_proto"
        args = [
            "grpc_tools.protoc",
            f"-I{staging}",
            f"-I{well_known}",
            f"--python_out={out_root}",
            f"--pyi_out={out_root}",
            f"--grpc_python_out={out_root}",
            "socle_eventbus/_pb/eventbus.proto",
        ]
        if protoc.main(args) != 0:
            raise SystemExit("socle-eventbus: protoc failed on " + str(proto_file()))
        (out / "__init__.py").write_text('"""Generated from proto/eventbus/v1/eventbus.proto at build time."""\n')


class SdistWithProto(sdist):
    """The sdist carries the proto (proto/eventbus/v1/eventbus.proto inside it): a wheel
    then builds from the sdist alone, away from the repository."""

    def make_release_tree(self, base_dir: str, files: list[str]) -> None:
        super().make_release_tree(base_dir, files)
        target = Path(base_dir) / "proto" / PROTO_REL
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(proto_file(), target)


class BuildPyWithProto(build_py):
    def run(self) -> None:
        super().run()
        generate(Path(self.build_lib))

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:  # type: ignore[override]
        outputs = super().get_outputs(include_bytecode)
        pb = Path(self.build_lib) / "socle_eventbus" / "_pb"
        names = ["__init__.py", "eventbus_pb2.py", "eventbus_pb2.pyi", "eventbus_pb2_grpc.py"]
        return outputs + [str(pb / n) for n in names]


def runtime_requirements() -> list[str]:
    """Generated code checks at import that the runtime is at least as new as the
    generator (grpcio >= grpcio-tools, protobuf >= the bundled protoc's version): require
    the versions this build used, so an older grpcio/protobuf already installed is upgraded
    instead of failing at import."""
    from importlib.metadata import version

    import google.protobuf

    tools = version("grpcio-tools")
    proto = ".".join(google.protobuf.__version__.split(".")[:2])
    return [f"grpcio>={tools}", f"protobuf>={proto}", "prometheus_client>=0.17", "opentelemetry-api>=1.20"]


setup(cmdclass={"build_py": BuildPyWithProto, "sdist": SdistWithProto}, install_requires=runtime_requirements())
