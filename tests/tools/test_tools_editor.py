"""The editor action in-process: every command, every refusal message, undo history."""

from __future__ import annotations

from pathlib import Path

import pytest

from prorl_server.tool_server.editor import EditError, Editor


@pytest.fixture
def editor(tmp_path: Path) -> Editor:
    """An editor rooted at an empty directory."""
    return Editor(str(tmp_path))


@pytest.fixture
def sample(tmp_path: Path) -> Path:
    """A five-line file."""
    path = tmp_path / "sample.py"
    path.write_text("one\ntwo\nthree\nfour\nfive\n")
    return path


def refusal(editor: Editor, command: str, path: str, **args: object) -> str:
    """The message of an edit that must be refused."""
    with pytest.raises(EditError) as caught:
        editor.run(command, path, **args)
    return str(caught.value)


def test_view_numbers_lines_like_cat_n(editor: Editor, sample: Path) -> None:
    output = editor.run("view", "sample.py")["output"]
    assert output == (
        f"Here's the result of running `cat -n` on {sample}:\n"
        "     1\tone\n     2\ttwo\n     3\tthree\n     4\tfour\n     5\tfive\n"
    )


def test_view_range_shows_the_lines_asked_for(editor: Editor, sample: Path) -> None:
    assert editor.run("view", "sample.py", view_range=[2, 3])["output"].endswith("     2\ttwo\n     3\tthree\n")
    assert editor.run("view", "sample.py", view_range=[4, -1])["output"].endswith("     4\tfour\n     5\tfive\n")


@pytest.mark.parametrize(
    ("view_range", "message"),
    [
        ([1], "It should be a list of two integers."),
        (["1", 2], "It should be a list of two integers."),
        ([0, 2], "Its first element `0` should be within the range of lines of the file: [1, 5]."),
        ([6, -1], "Its first element `6` should be within the range of lines of the file: [1, 5]."),
        ([3, 2], "Its second element `2` should be -1 (the end of the file) or within [3, 5]"),
        ([1, 9], "Its second element `9` should be -1 (the end of the file) or within [1, 5]"),
    ],
)
def test_bad_view_range_is_refused(editor: Editor, sample: Path, view_range: list, message: str) -> None:
    assert message in refusal(editor, "view", "sample.py", view_range=view_range)


def test_view_of_a_directory_lists_two_levels_without_hidden_entries(editor: Editor, tmp_path: Path) -> None:
    (tmp_path / "a/b/c").mkdir(parents=True)
    (tmp_path / "a/b/c/deep.txt").write_text("")
    (tmp_path / "a/top.txt").write_text("")
    (tmp_path / ".hidden").mkdir()
    output = editor.run("view", ".")["output"]
    assert output.startswith(f"Here's the files and directories up to 2 levels deep in {tmp_path}, excluding hidden")
    assert f"{tmp_path}/a/\n{tmp_path}/a/b/\n{tmp_path}/a/top.txt\n" in output
    assert "deep.txt" not in output and "c/" not in output and ".hidden" not in output
    message = refusal(editor, "view", ".", view_range=[1, 2])
    assert message == "The `view_range` parameter is not allowed when `path` points to a directory."


def test_missing_path_and_directory_misuse_are_refused(editor: Editor, tmp_path: Path) -> None:
    missing = refusal(editor, "view", "nope.txt")
    assert missing == f"The path {tmp_path}/nope.txt does not exist. Please provide a valid path."
    (tmp_path / "dir").mkdir()
    on_dir = refusal(editor, "str_replace", "dir", old_str="a", new_str="b")
    assert on_dir == f"The path {tmp_path}/dir is a directory and only the `view` command can be used on directories."


def test_unknown_command_and_missing_parameters_are_refused(editor: Editor, sample: Path) -> None:
    unknown = refusal(editor, "delete", "sample.py")
    assert (
        unknown
        == "Unrecognized command delete. The allowed commands are: view, create, str_replace, insert, undo_edit."
    )
    assert refusal(editor, "create", "new.py") == "Parameter `file_text` is required for command: create."
    assert refusal(editor, "str_replace", "sample.py") == "Parameter `old_str` is required for command: str_replace."
    assert (
        refusal(editor, "insert", "sample.py", new_str="x")
        == "Parameter `insert_line` is required for command: insert."
    )
    assert refusal(editor, "insert", "sample.py", insert_line="2", new_str="x") == (
        "Parameter `insert_line` must be of type int, got str."
    )
    assert (
        refusal(editor, "insert", "sample.py", insert_line=1) == "Parameter `new_str` is required for command: insert."
    )
    assert refusal(editor, "str_replace", "sample.py", old_str="one", new_str=1) == (
        "Parameter `new_str` must be of type str, got int."
    )


def test_create_makes_parents_and_refuses_to_overwrite(editor: Editor, tmp_path: Path) -> None:
    output = editor.run("create", "pkg/sub/new.py", file_text="print('hi')\n")["output"]
    assert output == f"File created successfully at: {tmp_path}/pkg/sub/new.py"
    assert (tmp_path / "pkg/sub/new.py").read_text() == "print('hi')\n"
    message = refusal(editor, "create", "pkg/sub/new.py", file_text="other")
    assert (
        message == f"File already exists at: {tmp_path}/pkg/sub/new.py. Cannot overwrite files using command `create`."
    )


def test_str_replace_replaces_the_unique_occurrence_and_shows_a_snippet(editor: Editor, sample: Path) -> None:
    output = editor.run("str_replace", "sample.py", old_str="three\n", new_str="THREE\n3b\n")["output"]
    assert sample.read_text() == "one\ntwo\nTHREE\n3b\nfour\nfive\n"
    assert output.startswith(f"The file {sample} has been edited. Here's the result of running `cat -n` on a snippet")
    assert "     1\tone\n     2\ttwo\n     3\tTHREE\n     4\t3b\n     5\tfour\n     6\tfive\n" in output
    assert output.endswith("Review the changes and make sure they are as expected. Edit the file again if necessary.")


def test_str_replace_refusals_say_what_to_do(editor: Editor, sample: Path) -> None:
    missing = refusal(editor, "str_replace", "sample.py", old_str="six", new_str="6")
    assert missing == f"No replacement was performed, old_str `six` did not appear verbatim in {sample}."
    sample.write_text("x = 1\ny = 2\nx = 1\n")
    repeated = refusal(editor, "str_replace", "sample.py", old_str="x = 1", new_str="x = 3")
    assert repeated == (
        f"No replacement was performed, old_str `x = 1` appears 2 times in {sample} (lines 1, 3); "
        "make it unique by including more surrounding lines."
    )
    empty = refusal(editor, "str_replace", "sample.py", old_str="", new_str="z")
    assert empty == "No replacement was performed: `old_str` is empty. Give the exact text to replace."
    same = refusal(editor, "str_replace", "sample.py", old_str="y = 2", new_str="y = 2")
    assert same == "No replacement was performed: `old_str` and `new_str` are identical."
    assert sample.read_text() == "x = 1\ny = 2\nx = 1\n"


def test_str_replace_without_new_str_deletes(editor: Editor, sample: Path) -> None:
    editor.run("str_replace", "sample.py", old_str="two\n")
    assert sample.read_text() == "one\nthree\nfour\nfive\n"


def test_insert_puts_whole_lines_after_the_given_line(editor: Editor, sample: Path) -> None:
    editor.run("insert", "sample.py", insert_line=0, new_str="zero")
    editor.run("insert", "sample.py", insert_line=3, new_str="two and a half\n")
    output = editor.run("insert", "sample.py", insert_line=7, new_str="six")["output"]
    assert sample.read_text() == "zero\none\ntwo\ntwo and a half\nthree\nfour\nfive\nsix\n"
    assert "     8\tsix\n" in output


def test_insert_at_the_end_of_a_file_without_final_newline(editor: Editor, tmp_path: Path) -> None:
    (tmp_path / "f.txt").write_text("a\nb")
    editor.run("insert", "f.txt", insert_line=2, new_str="c")
    assert (tmp_path / "f.txt").read_text() == "a\nb\nc\n"


def test_insert_line_out_of_range_is_refused(editor: Editor, sample: Path) -> None:
    for line in (-1, 6):
        message = refusal(editor, "insert", "sample.py", insert_line=line, new_str="x")
        assert message == (
            f"Invalid `insert_line` parameter: {line}. It should be within the range of lines of the file: [0, 5]."
        )


def test_undo_restores_edits_one_by_one_then_refuses(editor: Editor, sample: Path) -> None:
    original = sample.read_text()
    editor.run("str_replace", "sample.py", old_str="one", new_str="ONE")
    editor.run("insert", "sample.py", insert_line=1, new_str="between")
    editor.run("undo_edit", "sample.py")
    assert sample.read_text() == "ONE\ntwo\nthree\nfour\nfive\n"
    output = editor.run("undo_edit", "sample.py")["output"]
    assert sample.read_text() == original
    assert output.startswith(f"Last edit to {sample} undone successfully.")
    assert refusal(editor, "undo_edit", "sample.py") == f"No edit history found for {sample}."


def test_undo_of_create_removes_the_file(editor: Editor, tmp_path: Path) -> None:
    editor.run("create", "made.txt", file_text="x")
    editor.run("undo_edit", "made.txt")
    assert not (tmp_path / "made.txt").exists()


def test_files_are_edited_verbatim(editor: Editor, tmp_path: Path) -> None:
    path = tmp_path / "crlf.txt"
    path.write_bytes(b"a\r\n\tb\r\n")
    editor.run("str_replace", "crlf.txt", old_str="\tb", new_str="\tc")
    assert path.read_bytes() == b"a\r\n\tc\r\n"


def test_binary_files_are_refused(editor: Editor, tmp_path: Path) -> None:
    (tmp_path / "blob").write_bytes(b"\xff\xfe\x00")
    message = refusal(editor, "str_replace", "blob", old_str="a", new_str="b")
    assert message == f"The file {tmp_path}/blob is not UTF-8 text; the editor only works on text files."


def test_long_views_are_capped(editor: Editor, tmp_path: Path) -> None:
    (tmp_path / "long.txt").write_text("".join(f"line {i}\n" for i in range(10_000)))
    output = editor.run("view", "long.txt", max_output=2000)["output"]
    assert "[... output truncated:" in output and len(output) < 2100
