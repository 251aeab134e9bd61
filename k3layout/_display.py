"""How a record shows itself in a terminal, a notebook and rich: one line, or one table.

A plan's own ``repr`` (pydantic's: every field, the model's layers and every group) runs to
some 17,000 characters, and a capacity or memory budget to about a thousand. A record that
mixes in :class:`Displayed` says two things of itself, and every view follows from them:

- :meth:`~Displayed.display_head`: one line that tells it from its siblings (the model, the
  engine, the deployment's settings, the numbers a reader asks first). ``repr`` and ``str``
  are ``TypeName(line)``; rich's pretty printer shows the same where the record sits inside
  a container (``__rich_repr__``).
- :meth:`~Displayed.display_rows`: (label, value) rows, the record's own ``rows()`` or
  ``summary()``. ``_repr_html_`` (Jupyter) and ``__rich__`` (``rich.print``, rich's REPL
  hook) draw them as a two-column table under the one-line head.

Only the views change: fields, equality, hashing and JSON are pydantic's, and ``model_dump``
still lists every field. rich is imported when a table is drawn, never on import.
"""

from __future__ import annotations

from collections.abc import Iterator
from html import escape
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.table import Table


class _Shown:
    """Text that rich's pretty printer shows as it is (its ``repr`` is the text, unquoted)."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


class Displayed:
    """A record's short ``repr``, its HTML table and its rich table (see the module)."""

    __slots__ = ()

    def display_head(self) -> str:
        """The one-line view, most telling first."""
        raise NotImplementedError

    def display_rows(self) -> list[tuple[str, str]]:
        """The table's (label, value) rows."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.display_head()})"

    def __str__(self) -> str:
        return repr(self)

    def __rich_repr__(self) -> Iterator[_Shown]:
        # rich shows a record inside a list or dict as TypeName(line), not field by field.
        yield _Shown(self.display_head())

    def __rich__(self) -> Table:
        from rich.table import Table  # noqa: PLC0415 - drawn on demand, not on import

        table = Table(title=repr(self), show_header=False, title_justify="left")
        table.add_column(style="bold")
        table.add_column()
        for label, value in self.display_rows():
            table.add_row(label, value)
        return table

    def _repr_html_(self) -> str:
        rows = "".join(
            f'<tr><th style="text-align:left">{escape(label)}</th>'
            f'<td style="text-align:left">{escape(value)}</td></tr>'
            for label, value in self.display_rows()
        )
        caption = f'<caption style="text-align:left">{escape(repr(self))}</caption>'
        return f'<table class="k3layout">{caption}<tbody>{rows}</tbody></table>'


def listed(numbers: tuple[int, ...], most: int = 8) -> str:
    """Module layers as text, the middle of a long run cut: ``3, 7, 11, ..., 91, 92 (24)``."""
    if len(numbers) <= most:
        return ", ".join(str(n) for n in numbers)
    head, tail = numbers[: most - 2], numbers[-2:]
    return f"{', '.join(map(str, head))}, ..., {', '.join(map(str, tail))} ({len(numbers)})"
