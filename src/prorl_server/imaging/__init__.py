"""Task images: Apptainer images built from definition templates or Dockerfiles, and per-instance images.

- `ImageBuilder` (images.py) renders a template of templates/ (`python`, `swe`, or a `.def.j2` path) and
  runs `apptainer build --fakeroot`, reusing a cached .sif by its cache mode (`CACHE_MODES`).
- `convert()` and `build_dockerfile()` (dockerfile.py) turn a Dockerfile into a definition and build it.
- `InstanceImages` (instance_images.py) builds a dataset instance's image on its repository's base, through
  a `BuildQueue` (build_queue.py: bounded, single-flight) into an `ImageCache` (image_cache.py: a size budget,
  leases on the images in use).
- podman_images.py builds the podman runtime's images in podman's local storage; its names are imported from
  that module (its `build_dockerfile` is podman's, not the one here).

This package sits above sandbox/: it builds with the runtimes' pieces (apptainer's binary and cache, podman's
command, the execution server's packages), and no runtime imports it. docs/sandboxes.md has the details.
"""

from prorl_server.imaging.build_queue import BuildQueue
from prorl_server.imaging.dockerfile import (
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

__all__ = [
    "CACHE_MODES",
    "DEFAULTS",
    "IMAGE_CACHE_DIR",
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
    "convert",
    "explain_dockerfile",
    "parse_mapping",
]
