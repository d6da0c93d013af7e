"""YAML files an operator hands to a command (cluster, workload, topology, GPU specs).

`read_yaml(path)` is `yaml.safe_load` of the file with every failure as one `YAMLFileError`
whose message names the file and fits on one line:
- a file that is not UTF-8 text (a binary file passed by mistake) says so, where
  `Path.read_text()` raised a bare UnicodeDecodeError;
- a syntax error is its problem and line/column, not PyYAML's five-line excerpt;
- a value PyYAML cannot construct (an integer of 5000 digits, a date 2020-13-45) is an
  error too, where it raised a bare ValueError;
- a key written twice in one mapping is an error (PyYAML keeps the last one silently);
- `1e6` and `2.5E-3` are numbers, as in YAML 1.2 and JSON (YAML 1.1 reads them as text);
- aliases may not expand the document past `MAX_NODES` nodes (and never into a cycle): a few
  hundred bytes of nested anchors ("billion laughs") stand for 10**9 strings, and `safe_load`
  shares them, but whatever walks, validates or prints the result (`str()` of a list, a
  pydantic model) expands them and runs for hours. Files without aliases are never refused.

Rank 0 (no llmfabric imports): every layer may use it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

MAX_NODES = 1_000_000  # nodes of the expanded document when aliases repeat parts of it


class _Loader(yaml.SafeLoader):
    """`yaml.SafeLoader` that also reads `1e6` and `2.5E-3` as numbers, as YAML 1.2 and
    JSON do: YAML 1.1 wants a dot (`1.0e+6`), and `rate: 1e6` was the text '1e6', refused as
    "not a number" with no hint why."""


_Loader.add_implicit_resolver(  # (copies SafeLoader's table: safe_load is unchanged)
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"))


class YAMLFileError(ValueError):
    """A YAML file could not be read or parsed; the message names the file, on one line."""


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


def _unique_keys(node: yaml.MappingNode, path: str | Path) -> None:
    """Refuse a key written twice in one mapping: YAML keeps the last silently, so a second
    `Z900:` (or `rate:`) replaced the first without a word."""
    seen: set[str] = set()
    for k, _ in node.value:
        if isinstance(k, yaml.ScalarNode) and k.tag != "tag:yaml.org,2002:merge":
            if k.value in seen:
                raise YAMLFileError(f"{path}: the key {k.value[:40]!r} appears twice in one "
                                    f"mapping (line {k.start_mark.line + 1})")
            seen.add(k.value)


def _check_size(root: yaml.Node, path: str | Path) -> None:
    """Refuse a node graph whose expansion (each alias counted as a copy) exceeds MAX_NODES
    and ten times the nodes written, or that contains itself. Counts shared nodes once, so
    this costs the size of the file, not of its expansion."""
    sizes: dict[int, int] = {}
    on_path: set[int] = set()  # the nodes whose subtree is being counted (the ancestors)
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        key = id(node)
        if done:
            on_path.discard(key)
            sizes[key] = 1 + sum(sizes[id(c)] for c in _children(node))
            if sizes[key] > max(MAX_NODES, 10 * len(sizes)):
                raise YAMLFileError(
                    f"{path}: its aliases (*name) expand it past {MAX_NODES} values; write "
                    "the values out or use fewer aliases")
            continue
        if key in sizes:
            continue
        if key in on_path:
            raise YAMLFileError(f"{path}: an alias (*name) refers to a mapping or list that "
                                "contains it")
        if isinstance(node, yaml.MappingNode):
            _unique_keys(node, path)
        on_path.add(key)
        stack.append((node, True))
        stack.extend((c, False) for c in _children(node) if id(c) not in sizes)


def unknown_key(doc: Mapping[Any, Any], keys: Iterable[str]) -> str | None:
    """The first key of `doc` not in `keys`, clipped for an error message (None: none). A
    loader that ignored a typo (`rat: 5`, `ttft: 1.5`) planned without it, silently."""
    known = set(keys)
    return next((str(k)[:40] for k in doc if k not in known), None)


def read_yaml(path: str | Path) -> Any:
    """The document of the YAML file `path` (None when empty), as `yaml.safe_load` gives it."""
    try:
        text = Path(path).read_bytes().decode("utf-8")
    except OSError as exc:
        raise YAMLFileError(f"cannot read {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise YAMLFileError(f"{path} is not a YAML file: not UTF-8 text (byte {exc.start} "
                            f"is 0x{exc.object[exc.start]:02x})") from None
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_size(node, path)
        return loader.construct_document(node)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        what = exc.problem or exc.context or "syntax error"
        raise YAMLFileError(f"{path} is not valid YAML: {what}{where}") from None
    except yaml.YAMLError as exc:
        raise YAMLFileError(f"{path} is not valid YAML: {' '.join(str(exc).split())}") from None
    except RecursionError:  # PyYAML composes and constructs recursively
        raise YAMLFileError(f"{path}: nested too deeply") from None
    except YAMLFileError:
        raise
    except ValueError as exc:  # int()/date() of a scalar: a 5000-digit number, 2020-13-45
        what = "a number of over 4300 digits" if "digits" in str(exc) else str(exc)[:200]
        raise YAMLFileError(f"{path}: a value cannot be read ({what})") from None
    finally:
        loader.dispose()
