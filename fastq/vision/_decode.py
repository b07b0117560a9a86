"""An image decoded on the CPU with Pillow, as torchvision's ImageFolder and
transforms make it from a PIL image: the workers' decode when nothing
decodes on a GPU, and the reference a GPU stage's pixels are checked
against."""

from __future__ import annotations

import io
from typing import Any

import numpy as np

from ..errors import ImageError
from ._plan import DecodePlan


def load_rgb(data: Any) -> Any:
    """A PIL image of the encoded bytes, in RGB, as torchvision's default
    loader makes it (``convert("RGB")``: gray, CMYK and palette images
    become RGB). Raises Pillow's error for a corrupt or truncated file."""
    from PIL import Image

    with Image.open(io.BytesIO(data)) as image:
        return image.convert("RGB")


def decode_error(path: str, index: int, exc: Exception) -> ImageError:
    """The error for a file Pillow cannot decode, naming its path and
    dataset index, wherever it is decoded (a worker, the GPU stage)."""
    return ImageError(
        f"image {path!r} (sample {index}) cannot be decoded: "
        f"{type(exc).__name__}: {exc}",
        path=path,
        index=index,
    )


def decode_on_cpu(
    data: Any, box: Any, flip: Any, plan: DecodePlan
) -> np.ndarray[Any, np.dtype[np.float32]]:
    """One image decoded, cropped, resized, flipped and normalized with
    Pillow, as torchvision makes it.

    Parameters
    ----------
    data : bytes-like
        The encoded file.
    box : sequence of 4 ints
        ``(top, left, height, width)`` in the original image, as
        ``RandomResizedCrop.get_params`` returns it. Ignored for a
        validation plan (``plan.resize`` set), which resizes the whole
        image and crops its centre, as torchvision does.
    flip : bool
        Whether to flip the result horizontally.
    plan : DecodePlan
        The output size, normalization and pipeline.

    Returns
    -------
    numpy.ndarray
        float32, (3, height, width): ToTensor's 0-1 scale, normalized.

    Raises
    ------
    OSError
        Pillow's error for a file it cannot identify or decode (a truncated
        file's included).
    """
    from PIL import Image

    image = load_rgb(data)
    out_h, out_w = plan.size
    if plan.resize is None:
        top, left, h, w = (int(v) for v in box)
        # torchvision's resized_crop on a PIL image: crop, then resize
        # (Pillow's bilinear filter widens with the scale: antialiased).
        image = image.crop((left, top, left + w, top + h))
        image = image.resize((out_w, out_h), Image.Resampling.BILINEAR)
    else:
        image = _resize_centre_crop(image, plan.resize, (out_h, out_w))
    if flip:
        image = image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    pixels = np.asarray(image, dtype=np.uint8).transpose(2, 0, 1)
    # ToTensor divides by 255 and Normalize subtracts then divides, all in
    # float32: the same operations, so the same bits.
    out = pixels.astype(np.float32) / np.float32(255)
    mean = np.asarray(plan.mean, np.float32)[:, None, None]
    std = np.asarray(plan.std, np.float32)[:, None, None]
    out -= mean
    out /= std
    return out


def _resize_centre_crop(image: Any, resize: int, crop: tuple[int, int]) -> Any:
    """torchvision's Resize(resize) (shorter edge) then CenterCrop(crop),
    zero-padded where the crop is larger, on a PIL image."""
    from PIL import Image

    width, height = image.size
    short, long = min(height, width), max(height, width)
    new_short, new_long = resize, int(resize * long / short)
    new_h, new_w = (new_short, new_long) if height <= width else (new_long, new_short)
    if (new_h, new_w) != (height, width):
        image = image.resize((new_w, new_h), Image.Resampling.BILINEAR)
    crop_h, crop_w = crop
    if crop_h > new_h or crop_w > new_w:
        pad_left = (crop_w - new_w) // 2 if crop_w > new_w else 0
        pad_top = (crop_h - new_h) // 2 if crop_h > new_h else 0
        padded = Image.new("RGB", (max(crop_w, new_w), max(crop_h, new_h)))
        padded.paste(image, (pad_left, pad_top))
        image, (new_w, new_h) = padded, padded.size
    top = round((new_h - crop_h) / 2.0)
    left = round((new_w - crop_w) / 2.0)
    return image.crop((left, top, left + crop_w, top + crop_h))
