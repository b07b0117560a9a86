"""fastq.vision.image_header reads an image's size and kind from a JPEG's
frame header or a PNG's IHDR without decoding, asks Pillow about other
formats, and says what is wrong with a file that has no size."""

from __future__ import annotations

import io

import numpy as np
import pytest
import vision_fixtures as vf

from fastq.errors import ImageError
from fastq.vision import KIND_HW_JPEG, KIND_OTHER, image_header


def saved(**how: object) -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.fromarray(vf.pixels(30, 40, 0), "RGB").save(out, **how)
    return out.getvalue()


@pytest.mark.parametrize("name", sorted(vf.READABLE))
def test_sizes_and_kinds_of_the_fixture_files(name: str) -> None:
    from PIL import Image

    data = vf.encode(name)
    height, width, kind = image_header(data)
    assert Image.open(io.BytesIO(data)).size == (width, height)
    assert (height, width) == vf.READABLE[name][:2]
    assert kind == (KIND_HW_JPEG if name in vf.HARDWARE else KIND_OTHER)


def test_any_bytes_like_object_is_read() -> None:
    data = vf.encode("baseline_375x500_q90")
    for view in (bytearray(data), memoryview(data), np.frombuffer(data, np.uint8)):
        assert image_header(view) == (375, 500, KIND_HW_JPEG)


def test_an_rgb_jpeg_is_not_the_hardware_engines() -> None:
    # Adobe's APP14 marker, transform 0: three components stored as RGB.
    assert image_header(saved(format="JPEG", keep_rgb=True)) == (30, 40, KIND_OTHER)


def test_padding_between_segments_is_skipped() -> None:
    data = saved(format="JPEG")
    # 0xFF fill bytes may precede any marker.
    padded = data[:2] + b"\xff\xff\xff" + data[2:]
    assert image_header(padded) == (30, 40, KIND_HW_JPEG)


@pytest.mark.parametrize("fmt", ["BMP", "WEBP", "TIFF", "GIF"])
def test_other_formats_are_read_by_pillow(fmt: str) -> None:
    assert image_header(saved(format=fmt)) == (30, 40, KIND_OTHER)


@pytest.mark.parametrize(
    "data,says",
    [
        (vf.truncated_in_header(), "truncated"),
        (b"\xff\xd8", "truncated"),
        (saved(format="PNG")[:20], "truncated"),
        (b"", "not an image"),
        (b"plain text, not an image", "not an image"),
        (b"\xff\xd8\xff\xda\x00\x02", "no frame header"),
    ],
    ids=["jpeg-cut", "jpeg-soi-only", "png-cut", "empty", "text", "jpeg-no-sof"],
)
def test_a_file_without_a_size_says_why(data: bytes, says: str) -> None:
    with pytest.raises(ImageError, match=says):
        image_header(data)
