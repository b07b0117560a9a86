"""Datasets of encoded images: torchvision's ImageFolder read by the
workers, each sample's crop box and flip drawn from (seed, epoch, index),
decoded there with Pillow or handed on encoded for a GPU stage to decode.
Imports no torch, and Pillow only when an image is read.

May import: ``fastq._make`` and every layer below it.
"""

from ._decode import decode_on_cpu
from ._files import ImageFiles
from ._folder import IMG_EXTENSIONS, ImageFolder
from ._header import KIND_HW_JPEG, KIND_OTHER, image_header
from ._plan import DecodePlan, read_transform

__all__ = [
    "IMG_EXTENSIONS",
    "KIND_HW_JPEG",
    "KIND_OTHER",
    "DecodePlan",
    "ImageFiles",
    "ImageFolder",
    "decode_on_cpu",
    "image_header",
    "read_transform",
]
