"""Image classification data for ``tools/train_deit.py``: ImageFolder trees read by ``timm.data``, and an embedded,
procedurally rendered dataset that needs no download.

=======================  ==========================================================================================
name (:data:`DATASETS`)  what it reads
=======================  ==========================================================================================
``synthetic``            :class:`SyntheticImages`, 10 shape and texture classes rendered on the fly (the default)
``imagefolder``          an ImageNet-layout tree ``<root>/{train,val}/<class>/*.JPEG`` (or ``test/`` as the held-out
                         split, or folder names of your own) through ``timm.data.create_dataset`` (timm's
                         ``ImageDataset`` and folder reader)
=======================  ==========================================================================================

Both return PIL images before the transform, so the *same* timm transforms (``timm.data.create_transform``:
random resized crop, flip, RandAugment, random erasing, normalization) serve both: the synthetic data exercises the
exact ImageNet pipeline. Each dataset exposes ``classes`` (names in label order) and ``num_classes``.

**The synthetic classes.** Every image is a pure function of ``(seed, split, index)``; label ``index % num_classes``
(balanced, interleaved). One object on a background, the class given by the object's shape or texture only:

=====  ==============  =============================================================================================
label  name            object
=====  ==============  =============================================================================================
0      ``disk``        filled disk
1      ``ring``        annulus of random thickness
2      ``square``      filled square
3      ``triangle``    filled equilateral triangle
4      ``cross``       plus sign of random arm thickness
5      ``star``        five-pointed star of random depth
6      ``stripes``     disk or square patch filled with parallel stripes
7      ``checker``     disk or square patch filled with a checkerboard
8      ``dots``        disk or square patch filled with a grid of dots
9      ``target``      disk filled with concentric rings
=====  ==============  =============================================================================================

Nuisances, all random per image: object position, size (radius 40-65% of the half-width), rotation, a mild
anisotropic stretch, foreground and background colour (any hue; only a minimum luminance contrast is enforced, since
RandAugment's ``Invert`` and ``Solarize`` change colours anyway), a background gradient, 0-2 thin clutter lines and
Gaussian pixel noise. Texture period, ring and arm thickness and star depth vary too. Confusable pairs keep it from
being trivial: disk / ring / target, square / checker patch, star / cross at low resolution, any solid shape / a
coarse texture patch.
All classes are invariant to rotation and flips, so the standard augmentations never change the label.

**Data root.** For ``imagefolder``: the ``root`` argument, else ``$CENTROID_DATA``, else ``./datasets``; either the
image folder itself (holding ``train/`` and ``val/`` or ``test/``) or a data root holding ``imagenet/``. The held-out
split is the first of :data:`EVAL_FOLDERS` present, unless ``eval_folder`` names one (``train_folder`` likewise). A
missing tree raises a ``FileNotFoundError`` naming the searched folders and :data:`IMAGEFOLDER_TREE`.
"""

from __future__ import annotations

import functools
import logging
import math
import operator
from collections.abc import Callable
from os import PathLike
from pathlib import Path

import numpy as np
from PIL import Image, ImageOps
from torch.utils.data import Dataset

from engine.data import DATA_ROOT_ENV, data_root

__all__ = [
    "DATASETS",
    "IMAGEFOLDER_TREE",
    "SYNTHETIC_CLASSES",
    "SyntheticImages",
    "build_dataset",
    "check_image_files",
    "find_imagefolder",
    "patch_posterize",
    "render_synthetic",
]

_logger = logging.getLogger(__name__)

DATASETS = ("synthetic", "imagefolder")
SPLITS = ("train", "val")
#: Folder names tried, in order, for the held-out split of an ImageFolder tree (the ``val`` role).
EVAL_FOLDERS = ("val", "test", "validation")

IMAGEFOLDER_TREE = """\
<data root>/imagenet/            (or pass this folder itself as the root)
  train/<class>/<image>          e.g. train/n01440764/n01440764_10026.JPEG (any PIL-readable image: JPEG, PNG, ...)
  val/<class>/<image>            the same class folders: ILSVRC2012 val sorted into class folders, as DeiT expects
                                 (labels follow the sorted train class folder names); or test/ instead of val/"""

SYNTHETIC_CLASSES = ("disk", "ring", "square", "triangle", "cross", "star", "stripes", "checker", "dots", "target")
_SPLIT_IDS = {"train": 0, "val": 1}


# --------------------------------------------------------------------------------------------------------------------
# Synthetic images: signed distance functions on normalized object coordinates
# --------------------------------------------------------------------------------------------------------------------


def _sd_box(u: np.ndarray, v: np.ndarray, hu: float, hv: float) -> np.ndarray:
    """Signed distance to an axis-aligned box of half sizes (hu, hv) (negative inside)."""
    du, dv = np.abs(u) - hu, np.abs(v) - hv
    outside = np.hypot(np.maximum(du, 0.0), np.maximum(dv, 0.0))
    return outside + np.minimum(np.maximum(du, dv), 0.0)


def _sd_triangle(u: np.ndarray, v: np.ndarray, r: float) -> np.ndarray:
    """Signed distance to an equilateral triangle of circumradius ``r`` centred on its centroid (I. Quilez)."""
    k = math.sqrt(3.0)
    h = r * k / 2.0  # half the side length
    p = np.abs(u) - h
    q = v + h / k
    flip = p + k * q > 0.0
    p, q = np.where(flip, (p - k * q) / 2.0, p), np.where(flip, (-k * p - q) / 2.0, q)
    p = p - np.clip(p, -2.0 * h, 0.0)
    return -np.hypot(p, q) * np.sign(q)


def _sd_star(u: np.ndarray, v: np.ndarray, depth: float) -> np.ndarray:
    """Approximate signed distance to a 5-pointed star of outer radius 1 and inner radius ``depth``."""
    angle = np.arctan2(v, u)
    radius = np.hypot(u, v)
    sector = 2.0 * np.pi / 5.0
    t = np.abs(((angle + np.pi / 2.0) % sector) / sector - 0.5) * 2.0  # 1 at a tip, 0 between tips
    edge = depth + (1.0 - depth) * t  # piecewise-linear outline in polar form
    return (radius - edge) * (0.55 + 0.45 * depth)  # rough scale to a distance


def _region(u: np.ndarray, v: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """The patch a texture fills: a disk or a square, chosen at random."""
    if rng.random() < 0.5:
        return np.hypot(u, v) - 1.0
    return _sd_box(u, v, 0.85, 0.85)


def _bands(t: np.ndarray, period: float, duty: float) -> np.ndarray:
    """Signed distance to periodic bands along ``t`` (bands of width ``duty * period``)."""
    phase = np.abs((t / period) % 1.0 - 0.5)  # 0 at band centre
    return (phase - duty / 2.0) * period


def _sdf(label: int, u: np.ndarray, v: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Signed distance (object units, radius ~1) of class ``label``; textures intersect a pattern with a region."""
    name = SYNTHETIC_CLASSES[label]
    if name == "disk":
        return np.hypot(u, v) - 1.0
    if name == "ring":
        width = rng.uniform(0.12, 0.28)
        return np.abs(np.hypot(u, v) - (1.0 - width)) - width
    if name == "square":
        return _sd_box(u, v, 0.85, 0.85)
    if name == "triangle":
        return _sd_triangle(u, v, 1.15)
    if name == "cross":
        t = rng.uniform(0.2, 0.34)
        return np.minimum(_sd_box(u, v, 1.0, t), _sd_box(u, v, t, 1.0))
    if name == "star":
        return _sd_star(u, v, rng.uniform(0.38, 0.55))
    period = rng.uniform(0.38, 0.6)
    if name == "stripes":
        return np.maximum(_region(u, v, rng), _bands(u, period, 0.5))
    if name == "checker":
        w = np.pi / period
        checker = -np.sin(w * u) * np.sin(w * v) / w  # negative on the "black" cells; ~distance near edges
        return np.maximum(_region(u, v, rng), checker)
    if name == "dots":
        du = (u / period) % 1.0 - 0.5
        dv = (v / period) % 1.0 - 0.5
        dots = np.hypot(du, dv) * period - period * rng.uniform(0.22, 0.32)
        return np.maximum(_region(u, v, rng), dots)
    if name == "target":
        return np.maximum(np.hypot(u, v) - 1.0, _bands(np.hypot(u, v), period * 0.9, 0.5))
    raise AssertionError(name)


def _colours(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Background and foreground RGB in [0, 1] with a luminance difference of at least 0.25."""
    weights = np.array([0.299, 0.587, 0.114])
    while True:
        bg, fg = rng.random(3), rng.random(3)
        if abs(float(weights @ bg) - float(weights @ fg)) >= 0.25:
            return bg, fg


def render_synthetic(label: int, rng: np.random.Generator, size: int = 64) -> np.ndarray:
    """Renders one image of class ``label`` (see the module docstring) as uint8 ``(size, size, 3)``.

    Args:
        label: Class index in ``[0, len(SYNTHETIC_CLASSES))``.
        rng: The generator every random choice is drawn from (the image is a pure function of its state).
        size: Side length in pixels.
    """
    if not 0 <= label < len(SYNTHETIC_CLASSES):
        raise ValueError(f"label must be in [0, {len(SYNTHETIC_CLASSES)}), got {label}")
    if size < 8:
        raise ValueError(f"size must be >= 8 pixels, got {size}")
    coords = (np.arange(size, dtype=np.float64) + 0.5) / size * 2.0 - 1.0  # pixel centres in [-1, 1]
    y, x = np.meshgrid(coords, coords, indexing="ij")
    bg, fg = _colours(rng)
    # background: colour + linear gradient in a random direction
    g = rng.uniform(-0.2, 0.2)
    phi = rng.uniform(0, 2 * np.pi)
    image = bg[None, None, :] + g * (np.cos(phi) * x + np.sin(phi) * y)[..., None]  # (S, S, 3)
    # object pose: centre, radius, rotation, mild anisotropic stretch
    radius = rng.uniform(0.4, 0.65)
    cx, cy = rng.uniform(-(0.95 - radius), 0.95 - radius, size=2)
    theta = rng.uniform(0, 2 * np.pi)
    stretch = rng.uniform(0.85, 1.15)
    c, s = np.cos(theta), np.sin(theta)
    dx, dy = (x - cx) / radius, (y - cy) / radius
    u, v = (c * dx + s * dy) * stretch, (-s * dx + c * dy) / stretch
    sdf = _sdf(label, u, v, rng)
    pixels_per_unit = radius * size / 2.0
    alpha = np.clip(0.5 - sdf * pixels_per_unit, 0.0, 1.0)[..., None]  # anti-aliased coverage
    image = image * (1.0 - alpha) + fg[None, None, :] * alpha
    # clutter: thin random lines
    for _ in range(int(rng.integers(0, 3))):
        p0, p1 = rng.uniform(-1, 1, size=2), rng.uniform(-1, 1, size=2)
        d = p1 - p0
        t = np.clip(((x - p0[0]) * d[0] + (y - p0[1]) * d[1]) / max(float(d @ d), 1e-9), 0.0, 1.0)
        dist = np.hypot(x - p0[0] - t * d[0], y - p0[1] - t * d[1]) * size / 2.0
        line_alpha = np.clip(1.0 - dist, 0.0, 1.0)[..., None] * rng.uniform(0.3, 0.8)
        image = image * (1.0 - line_alpha) + rng.random(3)[None, None, :] * line_alpha
    image = image + rng.normal(0.0, rng.uniform(0.02, 0.08), size=image.shape)
    return (np.clip(image, 0.0, 1.0) * 255.0 + 0.5).astype(np.uint8)


class SyntheticImages(Dataset):
    """The embedded dataset: ``samples_per_class * num_classes`` images rendered on the fly, deterministically.

    Image ``index`` of ``split`` is ``render_synthetic(index % num_classes, default_rng([seed, split_id, index]))``
    (train and val never share an image), optionally cached; ``transform`` (timm's, reading PIL images) is applied
    on every access.

    Args:
        split: ``"train"`` or ``"val"``.
        num_classes: 2 to 10 (the first classes of :data:`SYNTHETIC_CLASSES`).
        samples_per_class: Images per class.
        image_size: Rendered side length in pixels (the transform then crops / resizes to the model's size).
        seed: Dataset seed.
        transform: Called on the PIL image.
        cache: Keep rendered images (uint8) in memory after the first access.

    Shapes:
        ``dataset[i]``: ``(transform(PIL image), label int)``.
    """

    def __init__(
        self,
        split: str = "train",
        num_classes: int = 10,
        samples_per_class: int = 500,
        image_size: int = 64,
        seed: int = 0,
        transform: Callable | None = None,
        cache: bool = True,
    ) -> None:
        if split not in _SPLIT_IDS:
            raise ValueError(f"split must be one of {tuple(_SPLIT_IDS)}, got {split!r}")
        if not 2 <= num_classes <= len(SYNTHETIC_CLASSES):
            raise ValueError(f"num_classes must be in [2, {len(SYNTHETIC_CLASSES)}], got {num_classes}")
        if samples_per_class < 1:
            raise ValueError(f"samples_per_class must be >= 1, got {samples_per_class}")
        if seed < 0:
            raise ValueError(f"seed must be non-negative, got {seed}")
        self.split = split
        self.classes = list(SYNTHETIC_CLASSES[:num_classes])
        self.samples_per_class = samples_per_class
        self.image_size = image_size
        self.seed = seed
        self.transform = transform
        self.cache = cache
        self._cache: dict[int, np.ndarray] = {}

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    def __len__(self) -> int:
        return self.samples_per_class * self.num_classes

    def label(self, index: int) -> int:
        return index % self.num_classes

    def render(self, index: int) -> np.ndarray:
        """The untransformed image ``index`` as uint8 ``(image_size, image_size, 3)``."""
        index = operator.index(index)
        if not 0 <= index < len(self):
            raise IndexError(f"index {index} out of range for {len(self)} images")
        cached = self._cache.get(index)
        if cached is not None:
            return cached
        rng = np.random.default_rng([self.seed, _SPLIT_IDS[self.split], index])
        image = render_synthetic(self.label(index), rng, self.image_size)
        if self.cache:
            self._cache[index] = image
        return image

    def __getitem__(self, index: int):
        index = operator.index(index)
        if index < 0:
            index += len(self)
        image = Image.fromarray(self.render(index))
        if self.transform is not None:
            image = self.transform(image)
        return image, self.label(index)


# --------------------------------------------------------------------------------------------------------------------
# ImageFolder trees (ImageNet layout) through timm.data
# --------------------------------------------------------------------------------------------------------------------


def _class_folders(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))


def find_imagefolder(
    root: str | PathLike | None = None, train_folder: str = "train", eval_folder: str | None = None
) -> tuple[Path, str]:
    """The image folder and the name of its held-out split folder.

    The image folder is ``root`` itself or ``root/imagenet``, whichever holds class folders in ``train_folder`` and
    in the held-out folder: ``eval_folder``, or by default the first of :data:`EVAL_FOLDERS` that has class folders.

    Raises:
        FileNotFoundError: Neither candidate holds both splits; the message lists the subfolders each one has and
            :data:`IMAGEFOLDER_TREE`.
    """
    base = data_root(root)
    candidates = [base, base / "imagenet"]
    held_out = (eval_folder,) if eval_folder else EVAL_FOLDERS
    problems = []
    for cand in candidates:
        if not cand.is_dir():
            problems.append(f"{cand}: no such folder")
            continue
        has_classes = {s for s in (train_folder, *held_out) if (cand / s).is_dir() and _class_folders(cand / s)}
        found = next((s for s in held_out if s in has_classes), None)
        if train_folder in has_classes and found is not None:
            return cand, found
        subfolders = ", ".join(f"{p.name}/" for p in sorted(cand.iterdir()) if p.is_dir()) or "none"
        wanted = f"{train_folder}/ and {' or '.join(f'{s}/' for s in held_out)}"
        problems.append(f"{cand}: needs class folders in {wanted}; its subfolders: {subfolders}")
    raise FileNotFoundError(
        f"ImageFolder dataset not found. Searched {[str(c) for c in candidates]} ({'; '.join(problems)}). The data "
        f"root is --data-root (the `root` argument), else ${DATA_ROOT_ENV}, else ./datasets; other split folder names "
        f"are the config keys train_folder / eval_folder. Expected tree:\n{IMAGEFOLDER_TREE}\nSee datasets/README.md."
    )


def _imagefolder(
    root: str | PathLike | None,
    split: str,
    transform: Callable | None,
    train_folder: str = "train",
    eval_folder: str | None = None,
):
    """timm's ``ImageDataset`` for one split; the held-out split uses train's class -> index map, so labels agree."""
    from timm.data import create_dataset
    from timm.utils.misc import natural_key

    folder, held_out = find_imagefolder(root, train_folder, eval_folder)
    name = train_folder if split == "train" else held_out
    train_classes = _class_folders(folder / train_folder)
    if split == "val":
        unknown = sorted(set(_class_folders(folder / held_out)) - set(train_classes))
        if unknown:
            raise ValueError(
                f"{folder / held_out} has class folders that {folder / train_folder} lacks: {unknown[:5]}"
                f"{' ...' if len(unknown) > 5 else ''}; the held-out split must use the train class names (ImageNet: "
                "sort the validation images into their synset folders)"
            )
    # One class -> index map for both splits: train's class folders in timm's natural sort order (what timm's folder
    # reader would build for train alone), so a held-out split missing a class keeps the right labels.
    class_map = {c: i for i, c in enumerate(sorted(train_classes, key=natural_key))}
    ds = create_dataset("", root=str(folder), split=name, class_map=class_map, transform=transform)
    class_to_idx = ds.reader.class_to_idx
    ds.classes = sorted(class_to_idx, key=class_to_idx.__getitem__)
    ds.num_classes = len(ds.classes)
    ds.check_files = functools.partial(check_image_files, [path for path, _ in ds.reader.samples])
    _logger.info("%s: %d images in %d classes (%s)", folder / name, len(ds), ds.num_classes, split)
    return ds


#: File signatures of the image formats Pillow reads in ImageNet-style trees.
_IMAGE_MAGIC = {
    ".jpeg": (b"\xff\xd8\xff",),
    ".jpg": (b"\xff\xd8\xff",),
    ".png": (b"\x89PNG\r\n\x1a\n",),
    ".gif": (b"GIF87a", b"GIF89a"),
    ".bmp": (b"BM",),
    ".webp": (b"RIFF",),
}


def check_image_files(paths: list[str | PathLike]) -> None:
    """Checks every image cheaply (not empty; the signature its extension promises) without decoding it.

    Raises:
        ValueError: The first bad file, named (an empty or truncated download, an HTML error page saved as .JPEG).
    """
    for path in paths:
        path = Path(path)
        with open(path, "rb") as f:
            head = f.read(8)
        if not head:
            raise ValueError(f"{path}: empty image file")
        magic = _IMAGE_MAGIC.get(path.suffix.lower())
        if magic is not None and not head.startswith(magic):
            raise ValueError(f"{path}: not a {path.suffix[1:].upper()} file (starts with {head!r})")


def build_dataset(
    name: str,
    split: str = "train",
    root: str | PathLike | None = None,
    transform: Callable | None = None,
    **kwargs,
):
    """A dataset of :data:`DATASETS` returning ``(transform(PIL image), label)``, with ``classes``/``num_classes``.

    Args:
        name: ``"synthetic"`` or ``"imagefolder"``.
        split: ``"train"`` or ``"val"``.
        root: Data root for ``imagefolder`` (see :func:`find_imagefolder`); ignored by ``synthetic``.
        transform: Applied to the PIL image (e.g. ``timm.data.create_transform(...)``).
        **kwargs: ``synthetic``: :class:`SyntheticImages` arguments (``num_classes``, ``samples_per_class``,
            ``image_size``, ``seed``, ``cache``); ``imagefolder``: ``train_folder``, ``eval_folder`` (the folder
            names of the two splits, see :func:`find_imagefolder`).
    """
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    if name == "synthetic":
        return SyntheticImages(split=split, transform=transform, **kwargs)
    if name == "imagefolder":
        extra = sorted(set(kwargs) - {"train_folder", "eval_folder"})
        if extra:
            raise ValueError(f"dataset 'imagefolder' takes train_folder and eval_folder only, got {extra}")
        return _imagefolder(root, split, transform, **kwargs)
    raise ValueError(f"unknown dataset {name!r}; choices: {', '.join(DATASETS)}")


# --------------------------------------------------------------------------------------------------------------------
# Pillow >= 13 and timm's RandAugment
# --------------------------------------------------------------------------------------------------------------------


def _posterize(img: Image.Image, bits_to_keep: int, **_) -> Image.Image:
    """timm's ``posterize`` op with Pillow < 13's result for 0 bits (an all-black image) instead of an error."""
    if bits_to_keep >= 8:
        return img
    if bits_to_keep < 1:
        return Image.new(img.mode, img.size)  # what ImageOps.posterize(img, 0) returned before Pillow 13
    return ImageOps.posterize(img, bits_to_keep)


def patch_posterize(transform: Callable) -> Callable:
    """Makes the RandAugment / AutoAugment ops inside ``transform`` survive Pillow >= 13; returns ``transform``.

    timm's ``PosterizeIncreasing`` keeps ``4 - int(level / 10 * 4)`` bits, i.e. 0 bits at level 10, which
    ``rand-m9-mstd0.5`` reaches whenever the sampled magnitude clips at 10 (about 2% of the draws). Pillow 13's
    ``ImageOps.posterize`` raises ``ValueError: bits must be between or equal to 1 and 8`` for 0 bits, where older
    Pillow returned a black image; with timm 1.0.31 and ``rand-m9-mstd0.5-inc1`` that is 0.15% of the images
    (measured), about 2,000 times per ImageNet epoch, and the first one kills the run.
    This swaps the op's function, on this transform's instances only, for one with the old result.
    """
    from timm.data import auto_augment

    stack = [transform]
    while stack:
        t = stack.pop()
        stack.extend(getattr(t, "transforms", None) or [])
        for op in getattr(t, "ops", None) or []:
            if getattr(op, "aug_fn", None) is auto_augment.posterize:
                op.aug_fn = _posterize
    return transform
