"""An image's size and kind from its first bytes: a JPEG's frame header
(SOF) or a PNG's IHDR, read without decoding; Pillow for anything else."""

from __future__ import annotations

import io
import struct
from typing import Any

from ..errors import ImageError

KIND_HW_JPEG = 0
"""A baseline, 8-bit, 3-component (YCbCr) JPEG: what a GPU's hardware JPEG
engine decodes."""
KIND_OTHER = 1
"""Any other readable image (progressive or lossless JPEG, grayscale, CMYK or
YCCK, PNG, ...): decoded another way, one image at a time."""

_PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
# Frame headers: SOF0..SOF15 less DHT (C4), JPG (C8) and DAC (CC), which
# share the range without being frames.
_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
_BASELINE = 0xC0
# Markers with no length field after them: TEM, RST0..RST7 (SOI and EOI
# cannot stand between the segments read here).
_STANDALONE = frozenset([0x01, *range(0xD0, 0xD8)])
_SOS, _EOI, _APP14 = 0xDA, 0xD9, 0xEE


def image_header(data: Any) -> tuple[int, int, int]:
    """An encoded image's ``(height, width, kind)``, read from its header.

    Parameters
    ----------
    data : bytes-like
        The file's bytes (at least up to its size: a JPEG's frame header, a
        PNG's IHDR chunk).

    Returns
    -------
    tuple of int
        Height and width in pixels, and ``KIND_HW_JPEG`` for a baseline
        8-bit 3-component JPEG or ``KIND_OTHER`` for anything else readable.

    Raises
    ------
    ImageError
        The bytes are no image Pillow can identify, or end before the size.
    """
    view = memoryview(data).cast("B")
    if view[:2] == b"\xff\xd8":
        return _jpeg_header(view)
    if view[:8] == _PNG_MAGIC:
        return _png_header(view)
    return _pillow_header(view)


def _jpeg_header(view: memoryview) -> tuple[int, int, int]:
    pos, end = 2, len(view)
    adobe_transform = -1  # APP14's colour transform: 0 means RGB, not YCbCr
    while True:
        # A marker is 0xFF then a code; any number of 0xFF may pad before it.
        while pos < end and view[pos] != 0xFF:
            pos += 1  # tolerated garbage between segments, as libjpeg does
        while pos < end and view[pos] == 0xFF:
            pos += 1
        if pos >= end:
            raise _truncated("JPEG")
        code = view[pos]
        pos += 1
        if code in _STANDALONE:
            continue
        if code in (_SOS, _EOI):
            raise ImageError(
                "JPEG has no frame header (SOF) before its scan data, so it has "
                "no size; the file is corrupt"
            )
        if pos + 2 > end:
            raise _truncated("JPEG")
        length = (view[pos] << 8) | view[pos + 1]
        if code in _SOF:
            if pos + 8 > end:
                raise _truncated("JPEG")
            precision = view[pos + 2]
            height, width = struct.unpack(">HH", view[pos + 3 : pos + 7])
            components = view[pos + 7]
            if height == 0 or width == 0:
                # A zero height is legal (a DNL marker after the first scan
                # gives it) but too rare to look for: an error, never a
                # wrong size.
                raise ImageError(f"JPEG frame header gives size {height}x{width}")
            hardware = (
                code == _BASELINE
                and precision == 8
                and components == 3
                and adobe_transform != 0
            )
            return height, width, KIND_HW_JPEG if hardware else KIND_OTHER
        # APP14: length, "Adobe", version, two flag words, then the transform.
        adobe = code == _APP14 and length >= 14 and pos + 14 <= end
        if adobe and view[pos + 2 : pos + 7] == b"Adobe":
            adobe_transform = view[pos + 13]
        pos += length


def _png_header(view: memoryview) -> tuple[int, int, int]:
    # Signature, then the IHDR chunk: length, type, width, height.
    if len(view) < 24:
        raise _truncated("PNG")
    if view[12:16] != b"IHDR":
        raise ImageError("PNG's first chunk is not IHDR; the file is corrupt")
    width, height = struct.unpack(">II", view[16:24])
    if height == 0 or width == 0:
        raise ImageError(f"PNG header gives size {height}x{width}")
    return height, width, KIND_OTHER


def _pillow_header(view: memoryview) -> tuple[int, int, int]:
    # Other formats (BMP, WebP, TIFF, ...): Pillow's open reads only the
    # header; the pixels are not decoded here.
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(view)) as image:
            width, height = image.size
    except UnidentifiedImageError as exc:
        raise ImageError(
            "not an image Pillow can identify (neither JPEG nor PNG, "
            f"{len(view)} bytes starting {bytes(view[:8])!r})"
        ) from exc
    except (OSError, SyntaxError, ValueError) as exc:
        raise ImageError(f"image header unreadable: {exc}") from exc
    return height, width, KIND_OTHER


def _truncated(kind: str) -> ImageError:
    return ImageError(f"{kind} file ends before its size is given: it is truncated")
