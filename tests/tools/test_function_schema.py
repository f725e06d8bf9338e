"""verl.tools.function_schema: docstring parsing, type mapping and every inference error."""

from __future__ import annotations

from typing import Annotated, Any, Literal, Optional, Union

import pytest

from verl.tools.function_schema import FunctionToolSchemaError, infer_function_tool_schema, parse_google_docstring


def _params(fn) -> dict:
    return infer_function_tool_schema(fn, fn.__name__).model_dump(exclude_none=True)["function"]["parameters"]


def test_docstring_description_args_and_continuations():
    doc = """Summary line.

    More detail.

    Args:
        a: first
            continued here.
        b (int): second, with a type in parentheses.

    Returns:
        a: not an argument.
    """
    description, args = parse_google_docstring(doc)
    assert description == "Summary line.\n\nMore detail."
    assert args == {"a": "first continued here.", "b": "second, with a type in parentheses."}


def test_names_types_required_descriptions_and_defaults():
    def search(query: str, limit: int = 5, score: float = 0.5, exact: bool = False, tags: list[str] = ()) -> str:
        """Search.

        Args:
            query: words to find.
            limit: how many hits.
            score: minimum score.
            exact: exact match only.
            tags: filter tags.
        """

    schema = infer_function_tool_schema(search, "web_search").model_dump(exclude_none=True)
    function = schema["function"]
    assert schema["type"] == "function" and function["name"] == "web_search"
    assert function["description"] == "Search."
    props = function["parameters"]["properties"]
    assert {name: p["type"] for name, p in props.items()} == {
        "query": "string",
        "limit": "integer",
        "score": "number",
        "exact": "boolean",
        "tags": "array",
    }
    assert props["limit"]["description"] == "how many hits."
    assert function["parameters"]["required"] == ["query"]  # only the parameter without a default


def test_unions_literals_optional_annotated_and_containers():
    def f(
        n: int | float,
        u: Union[int, str],  # noqa: UP007 (the typing spelling is what is tested)
        o: Optional[int],  # noqa: UP045
        lit: Literal["a", "b"],
        num: Literal[1, 2, 3],
        ann: Annotated[str, "meta"],
        d: dict[str, int],
        t: tuple[int, int],
        c: str = "x",
    ) -> None:
        """F.

        Args:
            n: n.
            u: u.
            o: o.
            lit: lit.
            num: num.
            ann: ann.
            d: d.
            t: t.
            c: pick one (choices: ["x", "y"])
        """

    props = _params(f)["properties"]
    assert props["n"]["type"] == ["integer", "number"]
    assert props["u"]["type"] == ["integer", "string"]
    assert props["o"]["type"] == "integer"  # Optional[X] -> X
    assert (props["lit"]["type"], props["lit"]["enum"]) == ("string", ["a", "b"])
    assert (props["num"]["type"], props["num"]["enum"]) == ("integer", [1, 2, 3])
    assert props["ann"]["type"] == "string"
    assert (props["d"]["type"], props["t"]["type"]) == ("object", "array")
    assert props["c"] == {"type": "string", "description": "pick one", "enum": ["x", "y"]}
    assert _params(f)["required"] == ["n", "u", "o", "lit", "num", "ann", "d", "t"]


def test_no_parameters_gives_empty_object():
    def ping() -> str:
        """Ping."""

    assert _params(ping) == {"type": "object", "properties": {}, "required": []}


def test_string_annotations_are_resolved():
    def later(x: "int") -> str:  # noqa: UP037 (a string annotation is what is tested)
        """Later.

        Args:
            x: x.
        """

    assert _params(later)["properties"]["x"]["type"] == "integer"


def _no_doc(x: int) -> int:
    return x


def _untyped(x) -> int:
    """Doc.

    Args:
        x: x.
    """


def _undescribed(x: int, y: int) -> int:
    """Doc.

    Args:
        x: only x.
    """


def _variadic(x: int, *rest: int) -> int:
    """Doc.

    Args:
        x: x.
    """


def _keywords(**kw: int) -> int:
    """Doc."""


def _any_hint(x: Any) -> int:
    """Doc.

    Args:
        x: x.
    """


class _Custom:
    pass


def _custom_hint(x: _Custom) -> int:
    """Doc.

    Args:
        x: x.
    """


def _bad_forward_ref(x: "NoSuchName") -> int:  # noqa: F821, UP037
    """Doc.

    Args:
        x: x.
    """


@pytest.mark.parametrize(
    ("fn", "words"),
    [
        (_no_doc, "no docstring"),
        (_untyped, "missing a type hint"),
        (_undescribed, "no description for the argument 'y'"),
        (_variadic, "variadic parameter"),
        (_keywords, "variadic parameter"),
        (_any_hint, "Couldn't parse this type hint"),
        (_custom_hint, "Couldn't parse this type hint"),
        (_bad_forward_ref, "cannot be resolved"),
    ],
)
def test_inference_errors(fn, words):
    with pytest.raises(FunctionToolSchemaError, match=words) as info:
        infer_function_tool_schema(fn, "t")
    assert isinstance(info.value, ValueError)
    assert fn.__qualname__ in str(info.value)  # the message names the function
