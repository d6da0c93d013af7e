"""The one reader of operators' YAML files: numbers as a user writes them, and the refusals
each with one line naming the file."""

from __future__ import annotations

import pathlib

import pytest
import yaml

from llmfabric.yamlfile import YAMLFileError, read_yaml, unknown_key

pytestmark = pytest.mark.unit


def _file(tmp_path: pathlib.Path, text: str) -> pathlib.Path:
    path = tmp_path / "in.yaml"
    path.write_text(text)
    return path


def test_exponents_without_a_dot_are_numbers(tmp_path: pathlib.Path) -> None:
    # YAML 1.1 read `1e6` as the text '1e6': `rate: 1e6` was refused as "not a number".
    doc = read_yaml(_file(tmp_path, "a: 1e6\nb: -2.5E-3\nc: 1.0e+6\nd: 10\ne: '1e6'\n"
                                    "f: 1_000\ng: e6\nh: 1e\n"))
    assert doc == {"a": 1e6, "b": -2.5e-3, "c": 1e6, "d": 10, "e": "1e6", "f": 1000,
                   "g": "e6", "h": "1e"}
    assert isinstance(doc["d"], int)
    assert yaml.safe_load("a: 1e6") == {"a": "1e6"}  # (PyYAML's own loader is unchanged)


@pytest.mark.parametrize(("text", "says"), [
    ("a: 1\na: 2\n", "appears twice"),
    ("a: [1\n", "not valid YAML"),
    ("a: &x [1, *x]\n", "contains it"),
    ("a: &a [1,1,1,1,1,1,1,1,1,1]\nb: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a,*a]\n"
     "c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b,*b]\nd: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c,*c]\n"
     "e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d,*d]\nf: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e,*e]\n"
     "g: [*f,*f,*f,*f,*f,*f,*f,*f,*f,*f]\n", "expand it past"),
])
def test_refusals_are_one_line_naming_the_file(tmp_path: pathlib.Path, text: str,
                                               says: str) -> None:
    path = _file(tmp_path, text)
    with pytest.raises(YAMLFileError) as err:
        read_yaml(path)
    message = str(err.value)
    assert says in message and str(path) in message and "\n" not in message


def test_unknown_key_names_the_first_one() -> None:
    assert unknown_key({"rate": 1, "rat": 5, "x": 1}, ("rate",)) == "rat"
    assert unknown_key({"rate": 1}, ("rate", "mean_in")) is None
