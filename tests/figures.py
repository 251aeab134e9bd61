"""Reading a drawn figure back: its elements by gid, the bytes a cell's height stands for."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.artist import Artist
    from matplotlib.figure import Figure
    from matplotlib.image import AxesImage
    from matplotlib.patches import Rectangle
    from matplotlib.text import Text


def by_gid(figure: Figure, prefix: str) -> dict[str, Artist]:
    """Every artist of ``figure`` whose gid starts with ``prefix + "."``, by gid."""
    found: dict[str, Artist] = {}
    for artist in figure.findobj():
        gid = artist.get_gid()
        if gid is not None and gid.startswith(prefix + "."):
            found[gid] = artist
    return found


def rectangles(figure: Figure, prefix: str) -> dict[str, Rectangle]:
    """The rectangles whose gid starts with ``prefix + "."``, by the rest of the gid."""
    from matplotlib.patches import Rectangle  # noqa: PLC0415 - matplotlib is optional

    return {
        gid[len(prefix) + 1 :]: artist
        for gid, artist in by_gid(figure, prefix).items()
        if isinstance(artist, Rectangle)
    }


def texts(figure: Figure, prefix: str) -> dict[str, str]:
    """The text of every text artist whose gid starts with ``prefix + "."``, by the rest."""
    from matplotlib.text import Text  # noqa: PLC0415 - matplotlib is optional

    found: dict[str, Text] = {
        gid[len(prefix) + 1 :]: artist
        for gid, artist in by_gid(figure, prefix).items()
        if isinstance(artist, Text)
    }
    return {key: artist.get_text() for key, artist in found.items()}


def column(rect: Rectangle) -> int:
    """The plane (column) a cell is drawn in: columns are one unit wide from 0."""
    return int(rect.get_x())


def image_values(figure: Figure, gid: str, fill: float = 0) -> list[list[float]]:
    """The data of the image drawn with ``gid``, masked cells read as ``fill``."""
    import numpy as np  # noqa: PLC0415 - with matplotlib only

    data: np.ma.MaskedArray[Any, Any] = np.ma.asarray(_image(figure, gid).get_array())
    values: list[list[float]] = np.ma.filled(data, fill).astype(float).tolist()
    return values


def image_mask(figure: Figure, gid: str) -> list[list[bool]]:
    """Which cells of the image drawn with ``gid`` are masked (left blank)."""
    import numpy as np  # noqa: PLC0415 - with matplotlib only

    data: np.ma.MaskedArray[Any, Any] = np.ma.asarray(_image(figure, gid).get_array())
    mask: list[list[bool]] = np.ma.getmaskarray(data).tolist()
    return mask


def _image(figure: Figure, gid: str) -> AxesImage:
    from matplotlib.image import AxesImage  # noqa: PLC0415 - matplotlib is optional

    found = [a for a in figure.findobj(AxesImage) if a.get_gid() == gid]
    if len(found) != 1:
        raise LookupError(f"{len(found)} images drawn with gid {gid!r}")
    image: AxesImage = found[0]
    return image
