"""Dockerfiles convert to Apptainer definitions instruction by instruction; what cannot be honoured is an error.

The conversion tests build nothing. The real build (`apptainer build --fakeroot`) of images/example/Dockerfile,
its FROM mapped to the local base of scripts/setup-apptainer.sh, is skipped with the reason when apptainer or
that base is missing.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest
from repo_paths import REPO

from prorl_server import cli
from prorl_server.imaging import (
    Conversion,
    DockerfileError,
    ImageBuilder,
    ImageBuildError,
    build_dockerfile,
    convert,
    explain_dockerfile,
)
from prorl_server.imaging.dockerfile import BUILD_DIR, TEMPLATE, read_instructions
from prorl_server.sandbox import SandboxSpec
from prorl_server.sandbox.apptainer import ApptainerRuntime, find_apptainer
from prorl_server.sandbox.reaper import new_owner_id

EXAMPLE = REPO / "images" / "example" / "Dockerfile"


def step(line: int, keyword: str) -> str:
    """The marker line before an instruction's steps, which names it in a failed build's log."""
    return f"echo '#prorl-step {line} {keyword}'"


def dockerfile(directory: Path, text: str, **files: str) -> Path:
    """A Dockerfile with `text` in `directory`, and context files (name -> content) beside it."""
    for name, content in files.items():
        path = directory / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
    path = directory / "Dockerfile"
    path.write_text(text)
    return path


def converted(tmp_path: Path, text: str, **files: str) -> Conversion:
    """The conversion of a Dockerfile with `text` (FROM debian:bookworm prepended unless it has a FROM)."""
    if "FROM" not in text:
        text = "FROM debian:bookworm\n" + text
    return convert(dockerfile(tmp_path, text, **files))


def refused(tmp_path: Path, text: str, match: str, **files: str) -> str:
    """The message of the DockerfileError the Dockerfile gets; it matches `match`."""
    with pytest.raises(DockerfileError, match=match) as failure:
        converted(tmp_path, text, **files)
    return str(failure.value)


# --- reading -----------------------------------------------------------------------------------------------


def test_instructions_keep_their_first_line_and_join_continuations(tmp_path: Path):
    path = dockerfile(
        tmp_path,
        "# syntax=docker/dockerfile:1\nFROM debian:bookworm\n\n# a comment\nrun apt-get update && \\\n"
        "    # a comment inside\n\n    apt-get install -y jq\nENV\tA=1\nRUN echo a\\\nb\n",
    )
    instructions = read_instructions(path, path.read_text())
    assert [(i.line, i.keyword) for i in instructions] == [(2, "FROM"), (5, "RUN"), (9, "ENV"), (10, "RUN")]
    assert instructions[1].value == "apt-get update &&     apt-get install -y jq"
    assert (instructions[2].value, instructions[3].value) == ("A=1", "echo ab")


# --- each instruction --------------------------------------------------------------------------------------


def test_from_maps_to_a_local_base_a_debootstrap_or_a_registry(tmp_path: Path):
    base = tmp_path / "base.sif"
    base.write_bytes(b"sif")
    path = dockerfile(tmp_path, "FROM library/ubuntu:24.04 AS main\n")
    mapped = convert(path, base_map={"docker.io/library/ubuntu:24.04": base})
    assert (mapped.image, mapped.base, mapped.docker, mapped.suite) == ("library/ubuntu:24.04", base, None, None)
    pulled = convert(path)
    assert (pulled.base, pulled.docker, pulled.suite) == (None, "library/ubuntu:24.04", None)
    for image, suite in (("debian:bookworm-slim", "bookworm"), ("debian:12", "bookworm"), ("debian:trixie", "trixie")):
        conversion = convert(dockerfile(tmp_path, f"FROM {image}\n"))
        assert (conversion.suite, conversion.docker, conversion.base) == (suite, None, None)
        assert conversion.variables()["suite"] == suite
    assert convert(dockerfile(tmp_path, "FROM debian\n")).docker == "debian"


def test_arg_before_from_names_the_base_and_build_args_override_it(tmp_path: Path):
    path = dockerfile(tmp_path, "ARG BASE=debian:bookworm\nFROM ${BASE}\nARG BASE\nRUN echo $BASE\n")
    assert convert(path).suite == "bookworm"
    overridden = convert(path, build_args={"BASE": "debian:trixie"})
    assert overridden.suite == "trixie" and "export BASE=debian:trixie" in overridden.steps


def test_run_is_its_own_shell_in_order_and_the_exec_form_runs_without_one(tmp_path: Path):
    conversion = converted(tmp_path, 'RUN cd /tmp && echo \'a b\' > x\nRUN ["touch", "/my file"]\n')
    assert conversion.steps == [
        step(2, "RUN"),
        "/bin/sh -c 'cd /tmp && echo '\"'\"'a b'\"'\"' > x'",
        step(3, "RUN"),
        "touch '/my file'",
    ]


def test_env_is_exported_for_later_steps_and_at_run_time(tmp_path: Path):
    conversion = converted(tmp_path, 'ENV A=1 B="two words"\nENV PATH=/opt/bin:$PATH\nENV OLD form\n')
    lines = ["export A=1", 'export B="two words"', "export PATH=/opt/bin:$PATH", "export OLD=form"]
    assert conversion.steps == lines and conversion.environment == lines


def test_arg_defaults_build_args_and_unset_args(tmp_path: Path):
    path = dockerfile(tmp_path, 'FROM debian:bookworm\nARG A=1\nARG B="x y"\nARG C\nRUN echo $A $B $C\n')
    assert convert(path).steps[:2] == ["export A=1", "export B='x y'"]
    given = convert(path, build_args={"A": "2", "C": "it's", "D": "unused"})
    assert given.steps[:3] == ["export A=2", "export B='x y'", "export C='it'\"'\"'s'"]
    assert given.notes == [f"{path}: build arguments no ARG declares: D"]
    assert not any(line.startswith("export D") for line in given.steps)


def test_workdir_is_made_entered_and_recorded(tmp_path: Path):
    conversion = converted(tmp_path, "ENV HOME_DIR=/srv\nWORKDIR $HOME_DIR/app\nWORKDIR sub\nRUN pwd\n")
    assert conversion.steps[1:] == [
        step(3, "WORKDIR"),
        "mkdir -p /srv/app && cd /srv/app",
        step(4, "WORKDIR"),
        "mkdir -p /srv/app/sub && cd /srv/app/sub",
        step(5, "RUN"),
        "/bin/sh -c pwd",
    ]
    assert conversion.workdir == "/srv/app/sub"
    assert ("org.prorl.docker.workdir", "/srv/app/sub") in conversion.variables()["labels"]


def test_copy_stages_the_sources_and_copies_in_order_as_docker_does(tmp_path: Path):
    text = (
        "WORKDIR /app\nRUN mkdir -p conf\nCOPY a.txt ./\nCOPY data /srv/data\nCOPY a.txt conf/renamed\n"
        "ADD b.txt c.txt.gz /x/\n"
    )
    with pytest.raises(DockerfileError, match="only the first source"):
        converted(tmp_path, text, **{"a.txt": "a", "data/d.txt": "d", "b.txt": "b", "c.txt.gz": "c"})
    conversion = converted(
        tmp_path, text.replace("ADD b.txt c.txt.gz /x/", "ADD b.txt /x/"), **{"a.txt": "a", "data/d.txt": "d"}
    )
    assert conversion.stage == {
        "copy/0/a.txt": tmp_path / "a.txt",
        "copy/1/data": tmp_path / "data",
        "copy/2/a.txt": tmp_path / "a.txt",
        "copy/3/b.txt": tmp_path / "b.txt",
    }
    preserve = "--preserve=mode,timestamps"
    assert conversion.steps[4:] == [
        step(4, "COPY"),
        f"mkdir -p /app/ && cp {preserve} {BUILD_DIR}/0/a.txt /app/",
        step(5, "COPY"),
        f"mkdir -p /srv/data && cp -R {preserve} {BUILD_DIR}/1/data/. /srv/data",
        step(6, "COPY"),
        f"mkdir -p /app/conf && cp {preserve} {BUILD_DIR}/2/a.txt /app/conf/renamed",
        step(7, "ADD"),
        f"mkdir -p /x/ && cp {preserve} {BUILD_DIR}/3/b.txt /x/",
    ]
    assert conversion.variables()["copies"] is True


def test_wildcards_in_sources_match_as_docker_does(tmp_path: Path):
    files = {"a.txt": "a", ".hidden.txt": "h", "b.log": "b", "sub/c.txt": "c"}
    conversion = converted(tmp_path, "COPY *.txt su? /x/\n", **files)
    assert list(conversion.stage) == ["copy/0/.hidden.txt", "copy/1/a.txt", "copy/2/sub"]
    assert conversion.steps[-1].startswith("mkdir -p /x/ && cp -R")


def test_labels_user_cmd_and_entrypoint_are_recorded(tmp_path: Path):
    conversion = converted(
        tmp_path,
        'RUN true\nLABEL a=1 b="two words"\nMAINTAINER me@example.org\nUSER nobody\n'
        'ENTRYPOINT ["python3"]\nCMD -m http.server\n',
    )
    labels = conversion.variables()["labels"]
    assert labels[:3] == [("a", "1"), ("b", "two words"), ("maintainer", "me@example.org")]
    assert ("org.prorl.docker.user", "nobody") in labels and ("org.prorl.docker.cmd", "-m http.server") in labels
    assert ("org.prorl.docker.entrypoint", '["python3"]') in labels and conversion.user == "nobody"


def test_expose_volume_healthcheck_and_stopsignal_are_ignored_with_a_note(tmp_path: Path):
    conversion = converted(tmp_path, "EXPOSE 80\nVOLUME /data\nHEALTHCHECK CMD true\nSTOPSIGNAL SIGINT\nRUN true\n")
    assert [note.split(": ")[1] for note in conversion.notes] == [
        f"{keyword} ignored" for keyword in ("EXPOSE", "VOLUME", "HEALTHCHECK", "STOPSIGNAL")
    ]
    assert conversion.notes[0].startswith(f"{tmp_path / 'Dockerfile'}:2: ")
    assert conversion.steps == [step(6, "RUN"), "/bin/sh -c true"]


def test_the_template_puts_it_together(tmp_path: Path):
    conversion = converted(tmp_path, "ENV A=1\nCOPY a.txt /a\nRUN cat /a\n", **{"a.txt": "a"})
    text = ImageBuilder(cache_dir=tmp_path / "cache").render(
        str(TEMPLATE), **conversion.variables(), base="/b.sif", context="/ctx"
    )
    assert text.startswith("Bootstrap: localimage\nFrom: /b.sif\n")
    assert (
        '    cp -a /ctx/copy "$APPTAINER_ROOTFS/opt/prorl/build"\n' in text
        and "    /ctx/prorl_server /opt/prorl/lib/prorl_server\n" in text
    )
    post = text[text.index("%post") : text.index("%environment")]
    assert (
        post.index("export A=1")
        < post.index("cp --preserve")
        < post.index("cat /a")
        < post.index("rm -rf /opt/prorl/build")
    )
    assert "prorl.pth" in post and "%environment\n    export A=1\n" in text
    assert "    org.prorl.docker.from debian:bookworm\n" in text


# --- errors ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "line", "match"),
    [
        ("FROM debian:bookworm AS build\nRUN true\nFROM debian:bookworm\n", 3, "multi-stage"),
        ("FROM scratch\n", 1, "scratch is empty"),
        ("ARG BASE\nFROM $BASE\n", 2, r"\$BASE is empty: give it with --build-arg"),
        ("RUN true\nCOPY --from=build /a /b\n", 3, "--from=build: multi-stage"),
        ("COPY --chown=1:1 a /b\n", 2, "--chown=1:1: not supported"),
        ("ADD https://example.org/x.tgz /x\n", 2, "ADD of a URL"),
        ("ONBUILD RUN true\n", 2, "ONBUILD: not supported"),
        ('SHELL ["/bin/bash", "-c"]\n', 2, "SHELL: not supported"),
        ("FETCH x\n", 2, "unknown or unsupported instruction"),
        ("RUN --mount=type=cache,target=/c true\n", 2, "BuildKit"),
        ("RUN cat <<EOF\n", 2, "heredocs"),
        ("USER app\nRUN whoami\n", 3, "runs after USER app"),
        ("ENV A hello world\n", 2, "spython cannot parse"),
        ("ARG A=1 B=2\n", 2, "one ARG per instruction"),
        ("COPY missing.txt /x\n", 2, "missing.txt not found in the build context"),
        ("COPY ../outside /x\n", 2, "outside the build context"),
        ("COPY /a.txt /nothing.txt /x/\n", 2, "nothing.txt not found in the build context"),
        ("COPY *.md /x/\n", 2, r"\*\.md matches nothing in the build context"),
        ("COPY * /x\n", 2, "must end with /"),
        ('COPY ["a b", "/x"]\n', 2, "JSON form"),
        ("COPY a.txt a.txt /x\n", 2, "must end with /"),
        ("ENV A=$(whoami)\n", 2, "command substitution"),
        ("WORKDIR ${A/b/c}\n", 2, "unsupported substitution"),
    ],
)
def test_what_cannot_be_honoured_is_an_error_naming_file_and_line(tmp_path: Path, text: str, line: int, match: str):
    (tmp_path / "ctx").mkdir()
    path = dockerfile(tmp_path / "ctx", "FROM debian:bookworm\n" + text if "FROM" not in text else text)
    (tmp_path / "ctx" / "a.txt").write_text("a")
    (tmp_path / "outside").write_text("o")
    with pytest.raises(DockerfileError, match=match) as failure:
        convert(path)
    assert str(failure.value).startswith(f"{path}:{line}: ")


def test_add_of_a_tar_archive_is_refused_since_docker_would_unpack_it(tmp_path: Path):
    (tmp_path / "f").write_text("f")
    with tarfile.open(tmp_path / "files.tar", "w") as archive:
        archive.add(tmp_path / "f", "f")
    assert refused(tmp_path, "ADD files.tar /opt/\n", "tar archive").endswith("use COPY and RUN tar -x")


def test_bad_files_and_contexts_are_explained(tmp_path: Path):
    with pytest.raises(DockerfileError, match="does not exist"):
        convert(tmp_path / "Dockerfile")
    (tmp_path / "Dockerfile").write_bytes(b"FROM \xff\n")
    with pytest.raises(DockerfileError, match="cannot read Dockerfile"):
        convert(tmp_path / "Dockerfile")
    with pytest.raises(DockerfileError, match=":1: RUN: comes before FROM"):
        convert(dockerfile(tmp_path, "RUN true\nFROM debian:bookworm\n"))
    with pytest.raises(DockerfileError, match="no FROM instruction"):
        convert(dockerfile(tmp_path, "ARG A=1\n"))
    path = dockerfile(tmp_path, "FROM debian:bookworm\n")
    with pytest.raises(DockerfileError, match="is not a directory"):
        convert(path, tmp_path / "nowhere")
    with pytest.raises(DockerfileError, match="maps to does not exist"):
        convert(path, base_map={"debian:bookworm": tmp_path / "nothing.sif"})
    (tmp_path / ".dockerignore").write_text("*.log\n")
    with pytest.raises(DockerfileError, match=r"\.dockerignore is not supported"):
        convert(path)


# --- the cache key -----------------------------------------------------------------------------------------


def test_the_key_follows_the_dockerfile_and_the_files_copy_reads(tmp_path: Path):
    builder = ImageBuilder(cache_dir=tmp_path / "cache")
    base = tmp_path / "base.sif"
    base.write_bytes(b"sif")
    path = dockerfile(tmp_path, "FROM debian:bookworm\nCOPY data /data\n", **{"data/a": "1", "other": "x"})

    def key() -> str:
        return builder.key(explain_dockerfile(builder, convert(path, base_map={"debian:bookworm": base})))

    first = key()
    (tmp_path / "other").write_text("not read by COPY")
    assert key() == first
    (tmp_path / "data" / "a").write_text("2")
    changed = key()
    assert changed != first
    path.write_text(path.read_text() + "# a comment changes the Dockerfile's bytes\n")
    assert key() not in (first, changed)
    with pytest.raises(ImageBuildError, match="'lock' is for templates"):
        build_dockerfile(builder, convert(path), "lock")


class FailingBuilder:
    """A builder whose build fails with `log` as the build's output."""

    def __init__(self, log: Path) -> None:
        self.log = log

    def build(self, *args, **kwargs):
        raise ImageBuildError("apptainer build failed with exit status 255", self.log)


def test_a_failed_build_names_the_last_step_it_began(tmp_path: Path):
    conversion = converted(tmp_path, "WORKDIR /app\nRUN make\n")
    log = tmp_path / "build.log"
    log.write_text(f"+ {step(2, 'WORKDIR')}\n#prorl-step 2 WORKDIR\n#prorl-step 3 RUN\nmake: no rule\n")
    with pytest.raises(DockerfileError, match=f"^{tmp_path / 'Dockerfile'}:3: RUN failed the build: apptainer"):
        build_dockerfile(FailingBuilder(log), conversion)  # type: ignore[arg-type]
    log.write_text(log.read_text() + "#prorl-step end\nthe image has no python3\n")
    with pytest.raises(ImageBuildError, match=r"^apptainer build failed") as failure:
        build_dockerfile(FailingBuilder(log), conversion)  # type: ignore[arg-type]
    assert not isinstance(failure.value, DockerfileError)


def test_cli_explains_a_dockerfile_build_and_refuses_template_flags(tmp_path: Path, capsys):
    path = dockerfile(tmp_path, "FROM debian:bookworm\nARG A\nEXPOSE 80\n")
    argv = ["build-image", "--dockerfile", str(path), "--cache-dir", str(tmp_path), "--build-arg", "A=1"]
    cli.main([*argv, "--explain"])
    captured = capsys.readouterr()
    shown = json.loads(captured.out)
    assert (
        shown["inputs"]["variables"]["steps"] == ["export A=1"] and shown["inputs"]["variables"]["suite"] == "bookworm"
    )
    assert "EXPOSE ignored" in captured.err
    with pytest.raises(SystemExit, match="a template, --lockfile: for templates only"):
        cli.main([*argv, "python", "--lockfile", str(path)])
    with pytest.raises(SystemExit, match="--build-arg 'A' is not NAME=VALUE"):
        cli.main([*argv[:-1], "A", "--explain"])
    path.write_text("FROM debian:bookworm\nONBUILD RUN true\n")
    with pytest.raises(SystemExit, match=f"{path}:2: ONBUILD: not supported"):
        cli.main([*argv, "--explain"])


# --- a real build ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def build_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One image cache for the module's builds (under /tmp, where apptainer sees it); the cleaned base is shared."""
    return tmp_path_factory.mktemp("dockerfile-cache")


async def test_the_example_dockerfile_builds_runs_in_a_sandbox_and_is_cached(base: Path, build_cache: Path, capsys):
    builder = ImageBuilder(cache_dir=build_cache)
    conversion = convert(EXAMPLE, base_map={"debian:bookworm": base}, build_args={"GREETING": "hi"})
    image = build_dockerfile(builder, conversion)
    assert not image.cached and image.path.is_file() and not list((build_cache / "tmp").iterdir())
    argv = ["build-image", "--dockerfile", str(EXAMPLE), "--cache-dir", str(build_cache), "--build-arg", "GREETING=hi"]
    cli.main([*argv, "--base-map", f"debian:bookworm={base}"])
    printed = capsys.readouterr().out.splitlines()
    path, how = printed[0].split("  (")
    assert path == str(image.path) and how.startswith("reused in") and printed[1] == "workdir /srv/task"

    runtime = ApptainerRuntime(new_owner_id(), host_tools=False, cache_dir=build_cache)
    sandbox = await runtime.start(SandboxSpec(image=str(image.path), workdir=conversion.workdir))
    try:
        observation = await sandbox.bash('pwd; cat built.txt; echo "$TASK_MODE"; head -1 task.md; ls -d logs')
        assert observation.output.splitlines() == [
            "/srv/task",
            "hi from the build",
            "read only",
            (EXAMPLE.parent / "task.md").read_text().splitlines()[0],
            "logs",
        ]
    finally:
        await sandbox.close()
        shutil.rmtree(runtime.base_dir / runtime.owner, ignore_errors=True)


def test_a_failing_build_names_the_log_and_leaves_nothing_in_the_cache(base: Path, build_cache: Path, tmp_path: Path):
    builder = ImageBuilder(cache_dir=build_cache)
    path = dockerfile(tmp_path, "FROM debian:bookworm\nRUN echo breaking\nRUN echo broken; exit 3\nRUN true\n")
    conversion = convert(path, base_map={"debian:bookworm": base})
    target = build_cache / f"dockerfile-{builder.key(explain_dockerfile(builder, conversion))}.sif"
    with pytest.raises(DockerfileError, match=f"^{path}:3: RUN failed the build: apptainer build") as failure:
        build_dockerfile(builder, conversion)
    assert "broken" in str(failure.value) and "full log" in str(failure.value) and failure.value.log.is_file()
    assert (
        not target.exists() and not target.with_suffix(".json").exists() and not list((build_cache / "tmp").iterdir())
    )


def test_links_in_a_copied_directory_stay_links(base: Path, build_cache: Path, tmp_path: Path):
    """As Docker keeps them; apptainer's %files would copy what they point to, even a host file outside the context."""
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "target.txt").write_text("t\n")
    (tmp_path / "data" / "relative").symlink_to("target.txt")
    (tmp_path / "data" / "absolute").symlink_to("/etc/hostname")
    path = dockerfile(tmp_path, "FROM debian:bookworm\nCOPY data /data\n")
    image = build_dockerfile(ImageBuilder(cache_dir=build_cache), convert(path, base_map={"debian:bookworm": base}))
    shown = subprocess.run(
        [str(find_apptainer()), "exec", str(image.path), "readlink", "/data/relative", "/data/absolute"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert shown.stdout.split() == ["target.txt", "/etc/hostname"]
