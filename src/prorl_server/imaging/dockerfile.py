"""Dockerfiles to Apptainer images: spython parses each instruction, this module checks what it made of it.

`convert()` reads the Dockerfile into instructions (with their line numbers), feeds them one at a time to
spython's `DockerParser` and compares what each added to spython's recipe with the instruction itself: an
instruction spython drops, mangles or crashes on, and one Apptainer cannot honour (multi-stage builds,
`COPY --from`, `ADD <url>`, `ADD` of a tar archive, `SHELL`, `ONBUILD`, heredocs, BuildKit flags, a `RUN`
after `USER` someone else), is a `DockerfileError` naming the file and line (one slip is allowed for:
spython keeps MAINTAINER's keyword in its label). spython's own Singularity writer is not used: it puts
every COPY before every RUN, leaves ENV unexported during the build and turns USER into `su -`; the
definition is written by the `dockerfile.def.j2` template beside this module instead, with the steps in the
Dockerfile's order (each RUN its own `/bin/sh -c`, in the WORKDIR of that point, with the ENV and ARG values
of that point exported).

`FROM` maps to a base buildable here: an image the caller maps to a local .sif or root directory
(`base_map`), else `debian:<suite>` (also `-slim`, or the version number) to a debootstrap of that suite from
Debian's mirror, else a registry pull (`Bootstrap: docker`, which needs the registry to be reachable).
`build_dockerfile()` builds the result with `ImageBuilder`, whose cache key covers the converted definition,
the Dockerfile's bytes and the content of every file COPY and ADD read.
"""

from __future__ import annotations

import copy
import glob
import hashlib
import json
import re
import shlex
import tarfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from spython.logger import bot
from spython.logger.message import QUIET
from spython.main.parse.parsers import DockerParser

from prorl_server.imaging.images import DEFAULTS, BuiltImage, CacheMode, ImageBuilder, ImageBuildError

TEMPLATE = Path(__file__).resolve().parent / "dockerfile.def.j2"
BUILD_DIR = "/opt/prorl/build"  # where the template's %setup puts the staged COPY sources for %post
STEP = "#prorl-step"  # `echo`ed before each RUN, WORKDIR, COPY and ADD: a failed build's log names the last
STEP_LINE = re.compile(rf"^{STEP} (?P<line>\d+|end) ?(?P<keyword>\w*)$", re.MULTILINE)
DEBIAN_VERSIONS = {"10": "buster", "11": "bullseye", "12": "bookworm", "13": "trixie", "14": "forky"}
DEBIAN_TAG = re.compile(r"(?P<suite>[a-z]+|\d+)(-\d{8})?(-slim)?")
NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
REFERENCE = re.compile(r"\\\$|\$\{(?P<braced>[^}]*)\}|\$(?P<plain>[A-Za-z_][A-Za-z0-9_]*)")
BRACED = re.compile(r"(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?::(?P<op>[-+])(?P<word>.*))?")
HEREDOC = re.compile(r"<<-?\s*[\"']?[A-Za-z_]")
GLOB = re.compile(r"[*?\[]")
IGNORED = {
    "EXPOSE": "a sandbox publishes no ports (its network is SandboxSpec.network)",
    "VOLUME": "the directory stays part of the image; bind host directories with SandboxSpec.binds",
    "HEALTHCHECK": "nothing runs the image as a service to check",
    "STOPSIGNAL": "a sandbox is stopped with SIGTERM, then SIGKILL",
}
REFUSED = {
    "SHELL": "Apptainer builds run each RUN with /bin/sh -c; write the shell into the RUN (bash -c '...')",
    "ONBUILD": "there are no child builds to trigger",
}
ROOT_USERS = ("root", "0", "root:root", "0:0")


class DockerfileError(ImageBuildError):
    """A Dockerfile the conversion cannot honour; the message names the file and line."""


@dataclass(frozen=True)
class Instruction:
    """One Dockerfile instruction: its keyword (upper case), its arguments with continuations joined."""

    line: int
    keyword: str
    value: str


@dataclass
class Conversion:
    """A converted Dockerfile: what the template needs, the base it builds on, and what it recorded."""

    dockerfile: Path
    dockerfile_sha256: str  # of the bytes converted
    image: str  # FROM's image name, ARGs substituted
    base: Path | None  # a local .sif or root directory FROM maps to
    docker: str | None  # else a registry image to pull
    suite: str | None  # else a Debian suite to debootstrap
    steps: list[str] = field(default_factory=list)
    environment: list[str] = field(default_factory=list)
    labels: list[tuple[str, str]] = field(default_factory=list)
    stage: dict[str, Path] = field(default_factory=dict)  # build-context name -> file or directory COPY reads
    workdir: str = "/"
    user: str | None = None
    entrypoint: list[str] | str | None = None
    cmd: list[str] | str | None = None
    notes: list[str] = field(default_factory=list)  # instructions ignored, and why

    def variables(self, mirror: str = DEFAULTS["mirror"]) -> dict[str, Any]:
        """The template's variables (the dockerfile's hash among them, so it is part of the cache key)."""
        recorded = [("org.prorl.docker.from", self.image), ("org.prorl.docker.workdir", self.workdir)]
        for name, value in (("user", self.user), ("entrypoint", self.entrypoint), ("cmd", self.cmd)):
            if value is not None:
                recorded.append((f"org.prorl.docker.{name}", value if isinstance(value, str) else json.dumps(value)))
        return {
            "docker": self.docker,
            "suite": self.suite or DEFAULTS["suite"],
            "mirror": mirror,
            "steps": self.steps,
            "environment": self.environment,
            "labels": [*self.labels, *recorded],
            "copies": bool(self.stage),
            "dockerfile_sha256": self.dockerfile_sha256,
        }


def read_instructions(path: Path, text: str) -> list[Instruction]:
    """The instructions of a Dockerfile's `text`: comments and blank lines dropped, `\\` continuations joined."""
    lines = text.splitlines()
    instructions: list[Instruction] = []
    pending: list[str] = []
    start = 0
    directives = True
    for number, raw in enumerate(lines, 1):
        stripped = raw.strip()
        if directives and (match := re.fullmatch(r"#\s*(\w+)\s*=\s*(\S*)", stripped)):
            if match[1].lower() == "escape" and match[2] != "\\":
                raise DockerfileError(f"{path}:{number}: only the default escape character \\ is supported")
            continue
        directives = False
        if stripped.startswith("#") or not stripped:  # also inside a continuation, as Docker does
            continue
        if not pending:
            start = number
        if stripped.endswith("\\"):
            pending.append(raw.rstrip()[:-1])
            continue
        pending.append(raw)
        instructions.append(_instruction(path, start, "".join(pending)))
        pending = []
    if pending:
        instructions.append(_instruction(path, start, "".join(pending)))
    return instructions


def _instruction(path: Path, line: int, text: str) -> Instruction:
    """An instruction from its joined text."""
    keyword, *value = text.split(maxsplit=1)
    if not value:
        raise DockerfileError(f"{path}:{line}: {keyword.upper()} needs arguments")
    return Instruction(line, keyword.upper(), value[0].strip())


@contextmanager
def _quiet_spython() -> Iterator[None]:
    """spython's warnings on stderr silenced (each case it warns about is an error or a note here)."""
    level, bot.level = bot.level, QUIET
    try:
        yield
    finally:
        bot.level = level


def debian_suite(image: str) -> str | None:
    """The Debian suite of `debian:<suite>[-slim]` (or of its version number), else None."""
    name, _, tag = _normalized(image).partition(":")
    match = DEBIAN_TAG.fullmatch(tag)
    if name != "debian" or match is None or tag == "latest":
        return None
    return DEBIAN_VERSIONS.get(match["suite"], match["suite"]) if match["suite"].isdigit() else match["suite"]


def _normalized(image: str) -> str:
    """An image name without Docker Hub's implicit prefixes, with its tag (`latest` if none)."""
    for prefix in ("docker.io/library/", "docker.io/", "library/"):
        image = image.removeprefix(prefix)
    if "@" not in image and ":" not in image.rsplit("/", 1)[-1]:
        image += ":latest"
    return image


def parse_mapping(items: list[str], what: str) -> dict[str, str]:
    """`NAME=VALUE` strings (`--build-arg`, `--base-map`) as a dict."""
    result = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise ImageBuildError(f"{what} {item!r} is not NAME=VALUE")
        result[name] = value
    return result


class _Converter:
    """The conversion's state while it walks the instructions."""

    def __init__(self, dockerfile: Path, sha256: str, context: Path, build_args: Mapping[str, str]) -> None:
        self.dockerfile, self.sha256, self.context, self.build_args = dockerfile, sha256, context.resolve(), build_args
        self.parser = DockerParser(None, load=False)
        self.global_args: dict[str, str | None] = {}  # ARGs before FROM: for FROM only (and ARG NAME after)
        self.args: dict[str, str | None] = {}
        self.env: dict[str, str] = {}
        self.result: Conversion | None = None

    def error(self, instruction: Instruction, message: str) -> DockerfileError:
        """A DockerfileError naming the instruction's file and line."""
        return DockerfileError(f"{self.dockerfile}:{instruction.line}: {instruction.keyword}: {message}")

    def spython(self, instruction: Instruction) -> dict[str, Any]:
        """What spython's parser adds to its recipe for `instruction` (each attribute's new part)."""
        recipe = self.parser.recipe[self.parser.active_layer]
        before = copy.deepcopy(recipe.__dict__)
        self.parser.lines = [f"{instruction.keyword} {instruction.value}"]
        try:
            with _quiet_spython():
                self.parser.parse()
        except Exception as exc:  # spython fails with IndexError and the like on forms it does not know
            raise self.error(instruction, f"spython cannot parse {instruction.value!r} ({exc!r})") from exc
        after = self.parser.recipe[self.parser.active_layer].__dict__
        added: dict[str, Any] = {}
        for name, value in after.items():
            old = before.get(name)
            if isinstance(value, list) and isinstance(old, list) and value[: len(old)] == old:
                if value[len(old) :]:
                    added[name] = value[len(old) :]
            elif value != old:
                added[name] = value
        return added

    def expand(self, instruction: Instruction, text: str) -> str:
        """`$NAME`, `${NAME}`, `${NAME:-word}`, `${NAME:+word}` replaced as Docker does (unset: empty)."""
        values = {**{k: v for k, v in self.args.items() if v is not None}, **self.env}

        def replace(match: re.Match[str]) -> str:
            if match[0] == "\\$":
                return "$"
            if match["plain"]:
                return values.get(match["plain"], "")
            braced = BRACED.fullmatch(match["braced"])
            if braced is None:
                raise self.error(instruction, f"unsupported substitution ${{{match['braced']}}}")
            value = values.get(braced["name"], "")
            if braced["op"] == "-":
                return value or braced["word"]
            if braced["op"] == "+":
                return braced["word"] if value else ""
            return value

        return REFERENCE.sub(replace, text)

    def words(self, instruction: Instruction) -> list[str]:
        """The instruction's arguments split as the shell would (quotes removed)."""
        try:
            return shlex.split(instruction.value)
        except ValueError as exc:
            raise self.error(instruction, f"cannot split {instruction.value!r}: {exc}") from exc

    def step(self, instruction: Instruction, *lines: str) -> None:
        """Add `lines` to %post after the marker that names `instruction` in the build's log."""
        self.image.steps.append(f"echo '{STEP} {instruction.line} {instruction.keyword}'")
        self.image.steps.extend(lines)

    def convert(self, instructions: list[Instruction], base_map: Mapping[str, Path]) -> Conversion:
        """Walk the instructions; the Conversion, or a DockerfileError at the first one that cannot be honoured."""
        handlers = {
            "ARG": self._arg,
            "ENV": self._env,
            "RUN": self._run,
            "WORKDIR": self._workdir,
            "COPY": self._copy,
            "ADD": self._add,
            "LABEL": self._label,
            "MAINTAINER": self._maintainer,
            "USER": self._user,
            "CMD": self._cmd,
            "ENTRYPOINT": self._entrypoint,
        }
        for instruction in instructions:
            keyword = instruction.keyword
            if keyword in REFUSED:
                raise self.error(instruction, f"not supported: {REFUSED[keyword]}")
            if keyword not in handlers and keyword not in IGNORED and keyword != "FROM":
                raise self.error(instruction, "unknown or unsupported instruction")
            if self.result is None and keyword not in ("FROM", "ARG"):
                raise self.error(instruction, "comes before FROM")
            added = self.spython(instruction)
            if keyword in IGNORED:
                self.image.notes.append(f"{self.dockerfile}:{instruction.line}: {keyword} ignored: {IGNORED[keyword]}")
            elif keyword == "FROM":
                self._from(instruction, added, base_map)
            else:
                handlers[keyword](instruction, added)
        if self.result is None:
            raise DockerfileError(f"{self.dockerfile}: no FROM instruction")
        unused = sorted(set(self.build_args) - set(self.args) - set(self.global_args))
        if unused:
            self.result.notes.append(f"{self.dockerfile}: build arguments no ARG declares: {', '.join(unused)}")
        return self.result

    @property
    def image(self) -> Conversion:
        """The conversion so far (after FROM)."""
        assert self.result is not None
        return self.result

    def _from(self, instruction: Instruction, added: dict[str, Any], base_map: Mapping[str, Path]) -> None:
        if self.result is not None:
            raise self.error(instruction, "a second FROM: multi-stage builds are not supported")
        words = instruction.value.split()
        if words[0].startswith("--"):
            raise self.error(instruction, f"flag {words[0]} is not supported")
        if len(words) not in (1, 3) or (len(words) == 3 and words[1].upper() != "AS"):
            raise self.error(instruction, f"expected FROM IMAGE [AS NAME], got {instruction.value!r}")
        self.args = dict(self.global_args)  # FROM sees the ARGs before it
        image = self.expand(instruction, words[0])
        self.args = {}
        if not image:
            raise self.error(instruction, f"{words[0]} is empty: give it with --build-arg or an ARG default")
        if added.get("fromHeader", "").strip() != image:
            raise self.error(instruction, f"spython read the image as {added.get('fromHeader')!r}, not {image!r}")
        if image == "scratch":
            raise self.error(instruction, "scratch is empty: the execution server needs a base with python3")
        mapped = {_normalized(name): path for name, path in base_map.items()}.get(_normalized(image))
        suite = None if mapped else debian_suite(image)
        docker = None if mapped or suite else image
        self.result = Conversion(self.dockerfile, self.sha256, image, mapped, docker, suite)

    def _arg(self, instruction: Instruction, added: dict[str, Any]) -> None:
        words = self.words(instruction)
        if len(words) != 1:
            raise self.error(instruction, "declare one ARG per instruction (ARG NAME or ARG NAME=default)")
        name, sep, default = words[0].partition("=")
        if not NAME.fullmatch(name):
            raise self.error(instruction, f"{name!r} is not a variable name")
        if sep and self.parser.args.get(name) != instruction.value.partition("=")[2].strip():
            raise self.error(instruction, f"spython read the default as {self.parser.args.get(name)!r}")
        if self.result is None:
            self.global_args[name] = self.build_args.get(name, default if sep else None)
            if name in self.build_args:  # spython substitutes its own args into FROM
                self.parser.args[name] = self.build_args[name]
            return
        value = self.build_args.get(name, default if sep else self.global_args.get(name))
        self.args[name] = value
        if value is not None:
            self.image.steps.append(f"export {name}={shlex.quote(value)}")

    def _env(self, instruction: Instruction, added: dict[str, Any]) -> None:
        words = self.words(instruction)
        if "=" not in words[0]:  # the old form: ENV NAME value
            expected = {words[0]: " ".join(words[1:])}
        else:
            expected = dict(word.partition("=")[::2] for word in words)
            if any("=" not in word for word in words):
                raise self.error(instruction, "mixes NAME=value with words without =")
        pairs = added.get("environ", [])
        got = {name: " ".join(shlex.split(text)) for name, _, text in (pair.partition("=") for pair in pairs)}
        if got != {name: " ".join(shlex.split(value)) for name, value in expected.items()}:
            raise self.error(instruction, f"spython read it as {pairs}; write ENV NAME=value (quoted)")
        for name, value in expected.items():
            if not NAME.fullmatch(name):
                raise self.error(instruction, f"{name!r} is not a variable name")
            if "$(" in value or "`" in value:
                raise self.error(instruction, "command substitution in a value would run in the build's shell")
            self.env[name] = self.expand(instruction, value)
        lines = [f"export {pair}" for pair in pairs]  # as written: the shell expands $NAME as Docker does
        self.image.steps.extend(lines)
        self.image.environment.extend(lines)

    def _run(self, instruction: Instruction, added: dict[str, Any]) -> None:
        if instruction.value.startswith("--"):
            raise self.error(instruction, f"flag {instruction.value.split()[0]} (BuildKit) is not supported")
        if HEREDOC.search(instruction.value):
            raise self.error(instruction, "heredocs (<<WORD) are not supported; use printf or a COPY")
        if added.get("install") != [instruction.value]:
            raise self.error(instruction, f"spython read the command as {added.get('install')}")
        if self.image.user not in (None, *ROOT_USERS):
            raise self.error(
                instruction,
                f"runs after USER {self.image.user}: an Apptainer build runs every step as root; "
                "move USER after the last RUN, or run the command with su or runuser",
            )
        argv = _json_list(instruction.value)
        self.step(instruction, shlex.join(argv) if argv is not None else f"/bin/sh -c {shlex.quote(instruction.value)}")

    def _workdir(self, instruction: Instruction, added: dict[str, Any]) -> None:
        if added.get("workdir") != instruction.value:
            raise self.error(instruction, f"spython read the directory as {added.get('workdir')!r}")
        self.image.workdir = str(Path(self.image.workdir, self.expand(instruction, instruction.value)))
        quoted = shlex.quote(self.image.workdir)
        self.step(instruction, f"mkdir -p {quoted} && cd {quoted}")

    def _sources(self, instruction: Instruction) -> tuple[list[str], str]:
        """COPY's or ADD's sources and destination (no flags, no JSON form, no heredoc)."""
        if instruction.value.startswith("--"):
            flag = instruction.value.split()[0]
            why = "multi-stage builds are not supported" if flag.startswith("--from") else "not supported"
            raise self.error(instruction, f"flag {flag}: {why}")
        if HEREDOC.search(instruction.value):
            raise self.error(instruction, "heredocs (<<WORD) are not supported")
        words = instruction.value.split()
        if _json_list(instruction.value) is not None or len(words) < 2:
            raise self.error(instruction, "expected SOURCE... DEST (the JSON form is not supported)")
        return words[:-1], words[-1]

    def _copy(self, instruction: Instruction, added: dict[str, Any]) -> None:
        sources, dest = self._sources(instruction)
        if added.get("files") != [[source, dest] for source in sources]:
            raise self.error(instruction, f"spython read the files as {added.get('files')}")
        self._copy_files(instruction, sources, dest)

    def _add(self, instruction: Instruction, added: dict[str, Any]) -> None:
        sources, dest = self._sources(instruction)
        for source in sources:
            if re.match(r"[a-z][a-z0-9+.-]*://|git@", source):
                raise self.error(instruction, f"{source}: ADD of a URL is not supported; download it in a RUN")
        if len(sources) > 1:
            raise self.error(instruction, "spython adds only the first source of an ADD; use COPY")
        if added.get("install") or added.get("files") != [[sources[0], dest]]:
            got = added.get("install") or added.get("files")
            raise self.error(instruction, f"spython turned it into {got}; use COPY (and RUN tar -x for an archive)")
        self._copy_files(instruction, sources, dest)

    def _copy_files(self, instruction: Instruction, sources: list[str], dest: str) -> None:
        """Stage each source and add the %post lines that put it at `dest` as Docker's COPY would."""
        dest = self.expand(instruction, dest)
        paths = [path for source in sources for path in self.paths(instruction, self.expand(instruction, source))]
        if len(paths) > 1 and not dest.endswith("/"):
            raise self.error(instruction, f"with several sources the destination must end with /, not {dest!r}")
        target = str(Path(self.image.workdir, dest)) + ("/" if dest.endswith("/") else "")
        self.step(instruction)
        for path in paths:
            if instruction.keyword == "ADD" and path.is_file() and tarfile.is_tarfile(path):
                raise self.error(
                    instruction, f"{path.name} is a tar archive, which ADD unpacks; use COPY and RUN tar -x"
                )
            name = f"copy/{len(self.image.stage)}/{path.name}"
            self.image.stage[name] = path
            staged = shlex.quote(f"{BUILD_DIR}/{name.removeprefix('copy/')}")
            if path.is_dir():
                into = shlex.quote(target)
                self.image.steps.append(f"mkdir -p {into} && cp -R --preserve=mode,timestamps {staged}/. {into}")
            else:
                parent = shlex.quote(target if target.endswith("/") else str(Path(target).parent))
                copy_file = f"cp --preserve=mode,timestamps {staged} {shlex.quote(target)}"
                self.image.steps.append(f"mkdir -p {parent} && {copy_file}")

    def paths(self, instruction: Instruction, source: str) -> list[Path]:
        """A COPY source's paths in the build context (checked to exist and not to leave it): itself, or what its
        wildcards match (hidden files too, as Docker's do)."""
        relative = source.lstrip("/")  # as Docker: an absolute source is in the context
        if GLOB.search(relative):
            names = sorted(glob.glob(relative, root_dir=self.context, include_hidden=True))
            if not names:
                raise self.error(instruction, f"{source} matches nothing in the build context {self.context}")
        else:
            names = [relative]
        paths = []
        for name in names:
            path = (self.context / name).resolve()
            if not path.is_relative_to(self.context):
                raise self.error(instruction, f"{source} is outside the build context {self.context}")
            if not path.exists():
                raise self.error(instruction, f"{source} not found in the build context {self.context}")
            paths.append(path)
        return paths

    def _label(self, instruction: Instruction, added: dict[str, Any]) -> None:
        if added.get("labels") != [[instruction.value]]:
            raise self.error(instruction, f"spython read the labels as {added.get('labels')}")
        for word in self.words(instruction):
            name, sep, value = word.partition("=")
            if not sep or not name or any(c.isspace() for c in name):
                raise self.error(instruction, f"{word!r} is not name=value")
            self.image.labels.append((name, self.expand(instruction, value)))

    def _maintainer(self, instruction: Instruction, added: dict[str, Any]) -> None:
        if added.get("labels") != [[f"MAINTAINER {instruction.value}"]]:  # spython keeps the keyword in the label
            raise self.error(instruction, f"spython read the maintainer as {added.get('labels')}")
        self.image.labels.append(("maintainer", instruction.value))

    def _user(self, instruction: Instruction, added: dict[str, Any]) -> None:
        self.image.user = self.expand(instruction, instruction.value)

    def _cmd(self, instruction: Instruction, added: dict[str, Any]) -> None:
        self.image.cmd = self._command(instruction, added.get("cmd"))

    def _entrypoint(self, instruction: Instruction, added: dict[str, Any]) -> None:
        self.image.entrypoint = self._command(instruction, added.get("entrypoint"))

    def _command(self, instruction: Instruction, parsed: Any) -> list[str] | str:
        """CMD's or ENTRYPOINT's value as spython read it: a list (JSON form) or a string (shell form)."""
        expected = _json_list(instruction.value)
        if parsed != (expected if expected is not None else instruction.value):
            raise self.error(instruction, f"spython read it as {parsed!r}")
        return parsed


def _json_list(text: str) -> list[str] | None:
    """The JSON (exec) form of an instruction's arguments: a list of strings, else None."""
    if not text.startswith("["):
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, list) and all(isinstance(v, str) for v in value) else None


def convert(
    dockerfile: Path,
    context: Path | None = None,
    build_args: Mapping[str, str] | None = None,
    base_map: Mapping[str, Path] | None = None,
) -> Conversion:
    """The Conversion of `dockerfile` (COPY sources relative to `context`, default: its directory)."""
    if not dockerfile.is_file():
        raise DockerfileError(f"Dockerfile {dockerfile} does not exist")
    context = dockerfile.parent if context is None else context
    if not context.is_dir():
        raise DockerfileError(f"build context {context} is not a directory")
    if (context / ".dockerignore").exists():
        raise DockerfileError(f"{context / '.dockerignore'}: .dockerignore is not supported; remove it or the files")
    for name, path in (base_map or {}).items():
        if not path.exists():
            raise DockerfileError(f"the base image {path} that {name} maps to does not exist")
    try:
        data = dockerfile.read_bytes()
        text = data.decode()
    except (OSError, UnicodeDecodeError) as exc:
        raise DockerfileError(f"cannot read Dockerfile {dockerfile}: {exc}") from exc
    converter = _Converter(dockerfile, hashlib.sha256(data).hexdigest(), context, build_args or {})
    return converter.convert(read_instructions(dockerfile, text), base_map or {})


def build_dockerfile(
    builder: ImageBuilder,
    conversion: Conversion,
    mode: CacheMode = "versioned",
    out: Path | None = None,
    mirror: str = DEFAULTS["mirror"],
    timeout_s: float | None = None,
) -> BuiltImage:
    """Build (or reuse) the image of a converted Dockerfile; with `out`, also place it there. `timeout_s`:
    seconds the build may take (ImageBuilder.build)."""
    if mode == "lock":
        raise ImageBuildError("cache mode 'lock' is for templates with a lockfile; use versioned or scratch")
    try:
        variables = conversion.variables(mirror)
        return builder.build(
            str(TEMPLATE), mode, conversion.base, out=out, stage=conversion.stage, timeout_s=timeout_s, **variables
        )
    except ImageBuildError as exc:
        log = exc.log.read_text(errors="replace") if exc.log is not None and exc.log.is_file() else ""
        steps = list(STEP_LINE.finditer(log))
        if not steps or steps[-1]["line"] == "end":
            raise
        where = f"{conversion.dockerfile}:{steps[-1]['line']}: {steps[-1]['keyword']}"
        raise DockerfileError(f"{where} failed the build: {exc}", exc.log) from exc


def explain_dockerfile(
    builder: ImageBuilder, conversion: Conversion, mode: CacheMode = "versioned", mirror: str = DEFAULTS["mirror"]
) -> dict[str, Any]:
    """The inputs of the cache key of a converted Dockerfile's image."""
    return builder.explain(str(TEMPLATE), mode, conversion.base, stage=conversion.stage, **conversion.variables(mirror))
