"""Task images: Apptainer images built from definition templates or Dockerfiles, and per-instance images.

- `ImageBuilder` (images.py) renders a template of templates/ (`python`, `swe`, or a `.def.j2` path) and
  runs `apptainer build --fakeroot`, reusing a cached .sif by its cache mode (`CACHE_MODES`).
- `convert()` and `build_dockerfile()` (dockerfile.py) turn a Dockerfile into a definition and build it.
- `InstanceImages` (instance_images.py) builds a dataset instance's image on its repository's base, through
  a `BuildQueue` (build_queue.py: bounded, single-flight) into an `ImageCache` (image_cache.py: a size budget,
  leases on the images in use).
- `build_podman_image()` and `import_podman_rootfs()` (podman_images.py) build the podman runtime's images in
  podman's local storage (from a Dockerfile, or a root directory).

This package sits above sandbox/: it builds with the runtimes' pieces (apptainer's binary and cache, podman's
command, the execution server's packages), and no runtime imports it. docs/sandboxes.md has the details.
"""

from prorl_server.imaging.build_queue import BuildQueue
from prorl_server.imaging.dockerfile import (
    STEP,
    Conversion,
    DockerfileError,
    build_dockerfile,
    convert,
    explain_dockerfile,
    parse_mapping,
)
from prorl_server.imaging.image_cache import ImageCache, ImageLease
from prorl_server.imaging.images import (
    CACHE_MODES,
    DEFAULTS,
    IMAGE_CACHE_DIR,
    TEMPLATES,
    BuiltImage,
    CacheMode,
    ImageBuilder,
    ImageBuildError,
)
from prorl_server.imaging.instance_images import ImageSpec, ImageSpecError, InstanceImage, InstanceImages
from prorl_server.imaging.podman_images import build_dockerfile as build_podman_image
from prorl_server.imaging.podman_images import import_rootfs as import_podman_rootfs

__all__ = [
    "CACHE_MODES",
    "DEFAULTS",
    "IMAGE_CACHE_DIR",
    "STEP",
    "TEMPLATES",
    "BuildQueue",
    "BuiltImage",
    "CacheMode",
    "Conversion",
    "DockerfileError",
    "ImageBuildError",
    "ImageBuilder",
    "ImageCache",
    "ImageLease",
    "ImageSpec",
    "ImageSpecError",
    "InstanceImage",
    "InstanceImages",
    "build_dockerfile",
    "build_podman_image",
    "convert",
    "explain_dockerfile",
    "import_podman_rootfs",
    "parse_mapping",
]
