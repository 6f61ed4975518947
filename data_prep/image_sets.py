"""Loaders of large image sets a user downloads: ImageNet32 and a folder of images (CelebA).

**ImageNet32** (``--dataset imagenet32``): the official downsampled ImageNet, 32x32 RGB, from
https://image-net.org/download-images.php ("Downsampled ImageNet 32x32", an account is
needed): ``Imagenet32_train_npz.zip`` and ``Imagenet32_val_npz.zip``. Unzip both into
``$MPIFC_DATA/imagenet32/`` (or give the folder with ``--path``); it then holds
``train_data_batch_1.npz`` .. ``train_data_batch_10.npz`` and ``val_data.npz``. Each file has
``data`` (N x 3072 uint8, channel-major: all red, then green, then blue values, each
row-major) and ``labels`` (1..1000). ``imagenet32:K`` reads only the first K training batches
(each about 128k images, 394 MB as bytes); ``val_data`` is the test set.

**A folder of images** (``--dataset image-folder --path DIR``, e.g. CelebA's
``img_align_celeba/`` from https://mmlab.ie.cuhk.edu.hk/projects/CelebA.html): every
``.png``, ``.npy``, ``.jpg``/``.jpeg`` file in ``DIR``, sorted by name. Images in sub-folders
of ``DIR`` get the sub-folder's name as their class (``DIR/<class>/<image>``); a flat folder is
unlabelled. ``image-folder:S`` center-crops each image to a square and shrinks it to ``SxS``
by area averaging (the paper's CelebA is 64x64); without ``:S`` all images must share one
shape. PNG is read by matplotlib, NPY by numpy (uint8, ``HxW`` or ``HxWxC``); JPEG needs
Pillow (installed with matplotlib), and without it a JPEG is named in a clear error.

Pixels are uint8 levels 0..255. Grayscale images get features ``px_r_c`` (so ``--patches``
works); colour images get ``<ch>_px_r_c`` for ``ch`` in ``r, g, b`` in channel-major order,
the ImageNet32 file order.
"""
from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np

from mpifc.errors import UserError

from .files import locate
from .table import RawTable, pixel_names

IMAGENET32_TRAIN = [f"train_data_batch_{i}.npz" for i in range(1, 11)]
IMAGENET32_VAL = "val_data.npz"
IMAGE_SUFFIXES = (".png", ".npy", ".jpg", ".jpeg")
CHANNELS = ("r", "g", "b")


def rgb_names(height: int, width: int, channels: int = 3) -> list[str]:
    """Channel-major pixel names ``<ch>_px_r_c`` (``px_r_c`` alone for one channel)."""
    if channels == 1:
        return pixel_names(height, width)
    return [f"{CHANNELS[k]}_{p}" for k in range(channels) for p in pixel_names(height, width)]


# ----------------------------------------------------------------------------- ImageNet32
def _suffix_int(name: str, what: str) -> int | None:
    _, sep, arg = name.partition(":")
    if not sep:
        return None
    try:
        k = int(arg)
    except ValueError:
        raise UserError(f"dataset {name!r}: {what} after ':' must be a positive integer") from None
    if k < 1:
        raise UserError(f"dataset {name!r}: {what} after ':' must be a positive integer")
    return k


def read_imagenet32_batch(file: Path, side: int = 32) -> tuple[np.ndarray, np.ndarray]:
    """One official ``.npz`` batch: ``(data (N, 3*side*side) uint8, labels (N,) int64, 0-based)``.

    Raises:
        UserError: unreadable file, missing keys, wrong shapes or labels outside 1..1000.
    """
    try:
        with np.load(file, allow_pickle=False) as z:
            keys = set(z.files)
            if not {"data", "labels"} <= keys:
                raise UserError(f"{file}: not an ImageNet32 batch (keys {sorted(keys)}, need 'data' and 'labels')")
            data, labels = z["data"], np.asarray(z["labels"]).reshape(-1)
    except UserError:
        raise
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as exc:
        raise UserError(f"{file}: cannot read as .npz ({exc})") from None
    d = 3 * side * side
    if data.ndim != 2 or data.shape[1] != d:
        raise UserError(f"{file}: 'data' has shape {data.shape}, expected (N, {d}) for {side}x{side} RGB")
    if data.shape[0] != labels.shape[0]:
        raise UserError(f"{file}: {data.shape[0]} images but {labels.shape[0]} labels")
    if data.dtype != np.uint8:
        if data.size and (data.min() < 0 or data.max() > 255 or not np.all(np.mod(data, 1) == 0)):
            raise UserError(f"{file}: 'data' must hold pixel levels 0..255, got dtype {data.dtype}")
        data = data.astype(np.uint8)
    if labels.size and (labels.min() < 1 or labels.max() > 1000):
        raise UserError(f"{file}: labels must be 1..1000 (the official files are 1-based), "
                        f"got {int(labels.min())}..{int(labels.max())}")
    return data, labels.astype(np.int64) - 1


def load_imagenet32(name: str, path: Path | None, data_root: Path) -> RawTable:
    """ImageNet32 from the official ``.npz`` batches (see the module docstring)."""
    n_batches = _suffix_int(name, "the number of training batches")
    where = locate(path, data_root, "imagenet32")
    folder = where.parent if where.is_file() else where
    train = [folder / f for f in IMAGENET32_TRAIN if (folder / f).is_file()]
    val = folder / IMAGENET32_VAL
    if not train:
        raise UserError(f"{folder}: no ImageNet32 training batch found (looked for "
                        f"{IMAGENET32_TRAIN[0]} .. {IMAGENET32_TRAIN[-1]}); download Imagenet32_train_npz.zip "
                        "from https://image-net.org/download-images.php and unzip it there")
    if not val.is_file():
        raise UserError(f"{folder}: {IMAGENET32_VAL} not found (Imagenet32_val_npz.zip from "
                        "https://image-net.org/download-images.php)")
    if n_batches is not None:
        want = [folder / f for f in IMAGENET32_TRAIN[:n_batches]]
        missing = [str(p) for p in want if not p.is_file()]
        if missing:
            raise UserError(f"dataset {name!r}: {missing[0]} not found")
        train = want
    parts = [read_imagenet32_batch(f) for f in [*train, val]]
    sizes = [p[0].shape[0] for p in parts]
    x = np.concatenate([p[0] for p in parts])
    y = np.concatenate([p[1] for p in parts])
    del parts
    n_train = int(sum(sizes[:-1]))
    own_test = np.zeros(x.shape[0], dtype=bool)
    own_test[n_train:] = True
    return RawTable(name=name, x=x, features=rgb_names(32, 32), meta_types=["discrete"] * x.shape[1], y=y,
                    target="label", classes=list(range(1000)), own_test=own_test,
                    source_splits={"train": [0, n_train], "val": [n_train, int(x.shape[0])]},
                    pixel={"levels": 256, "file_scale": 1.0, "shape": [32, 32, 3], "layout": "CHW"},
                    standardize_default=False, source_files=[str(f) for f in [*train, val]])


# ----------------------------------------------------------------------------- image folder
def read_image(file: Path) -> np.ndarray:
    """One image as uint8 ``(H, W)`` or ``(H, W, 3)`` (alpha dropped).

    Raises:
        UserError: unsupported suffix, unreadable file, JPEG without Pillow, bad NPY content.
    """
    suffix = file.suffix.lower()
    try:
        if suffix == ".npy":
            img = np.load(file, allow_pickle=False)
            if not (np.issubdtype(img.dtype, np.integer) or np.issubdtype(img.dtype, np.floating)):
                raise UserError(f"{file}: NPY image must be numeric, got dtype {img.dtype}")
            if img.size and (np.nanmin(img) < 0 or np.nanmax(img) > 255):
                raise UserError(f"{file}: NPY image must hold levels 0..255")
            img = np.rint(img).astype(np.uint8)
        elif suffix == ".png":
            from matplotlib.image import imread

            img = imread(file)
            if np.issubdtype(img.dtype, np.floating):  # matplotlib gives PNG as floats in [0, 1]
                img = np.rint(img * 255.0).astype(np.uint8)
        elif suffix in (".jpg", ".jpeg"):
            try:
                from PIL import Image
            except ImportError:
                raise UserError(f"{file}: reading JPEG needs Pillow (pip install pillow), or convert the "
                                "images to PNG/NPY") from None
            with Image.open(file) as im:
                img = np.asarray(im.convert("RGB") if im.mode not in ("L", "RGB") else im, dtype=np.uint8)
        else:
            raise UserError(f"{file}: unsupported image type (use {', '.join(IMAGE_SUFFIXES)})")
    except UserError:
        raise
    except Exception as exc:  # noqa: BLE001 - any decoder error is the file's fault
        raise UserError(f"{file}: cannot read image ({type(exc).__name__}: {exc})") from None
    if img.ndim == 3 and img.shape[2] in (2, 4):
        img = img[:, :, :-1] if img.shape[2] == 4 else img[:, :, :1]
    if img.ndim == 3 and img.shape[2] == 1:
        img = img[:, :, 0]
    if img.ndim not in (2, 3) or (img.ndim == 3 and img.shape[2] != 3) or min(img.shape[:2]) < 1:
        raise UserError(f"{file}: expected an HxW or HxWx3 image, got shape {img.shape}")
    return img


def _bins(n_in: int, n_out: int) -> np.ndarray:
    return np.linspace(0, n_in, n_out + 1).round().astype(int)[:-1]


def square_resize(img: np.ndarray, side: int) -> np.ndarray:
    """Center-crop to the largest square, then shrink to ``side x side`` by area averaging
    (nearest-neighbour repetition when enlarging)."""
    h, w = img.shape[:2]
    s = min(h, w)
    r0, c0 = (h - s) // 2, (w - s) // 2
    sq = img[r0:r0 + s, c0:c0 + s].astype(np.float64)
    if s >= side:
        b = _bins(s, side)
        sq = np.add.reduceat(np.add.reduceat(sq, b, axis=0), b, axis=1)
        sizes = np.diff(np.append(b, s))
        area = sizes[:, None] * sizes[None, :]
        sq = sq / (area[:, :, None] if sq.ndim == 3 else area)
    else:
        idx = (np.arange(side) * s) // side
        sq = sq[idx][:, idx]
    return np.clip(np.rint(sq), 0, 255).astype(np.uint8)


def _image_files(folder: Path) -> tuple[list[Path], list[str] | None]:
    direct = sorted(p for p in folder.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)
    subdirs = sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))
    if direct or not subdirs:
        return direct, None
    files, labels = [], []
    for d in subdirs:
        found = sorted(p for p in d.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)
        files += found
        labels += [d.name] * len(found)
    return files, labels


def load_image_folder(name: str, path: Path | None, data_root: Path) -> RawTable:
    """Every image of a folder as one row (see the module docstring)."""
    side = _suffix_int(name, "the image side")
    if path is None:
        where = data_root / "celeba"
        if not where.exists():
            raise UserError(f"{where}: not found; give the image folder with --path DIR (e.g. CelebA's "
                            "img_align_celeba/ from https://mmlab.ie.cuhk.edu.hk/projects/CelebA.html)")
    else:
        where = path
    if not where.is_dir():
        raise UserError(f"{where}: not a folder of images")
    files, labels = _image_files(where)
    if not files:
        raise UserError(f"{where}: no images found (looked for {', '.join(IMAGE_SUFFIXES)})")
    first = read_image(files[0])
    if side is not None:
        first = square_resize(first, side)
    shape = first.shape
    x = np.empty((len(files), first.size), dtype=np.uint8)
    for i, f in enumerate(files):
        img = first if i == 0 else read_image(f)
        if side is not None and i:
            img = square_resize(img, side)
        if img.shape != shape:
            raise UserError(f"{f}: image shape {img.shape} differs from {shape} of {files[0]} "
                            f"(use --dataset {name.partition(':')[0]}:SIDE to crop and resize)")
        # channel-major, as ImageNet32's files
        x[i] = (img.transpose(2, 0, 1) if img.ndim == 3 else img).reshape(-1)
    h, w = shape[:2]
    channels = 1 if len(shape) == 2 else shape[2]
    y = classes = target = None
    if labels is not None:
        classes = sorted(set(labels))
        code = {c: k for k, c in enumerate(classes)}
        y = np.array([code[c] for c in labels], dtype=np.int64)
        target = "label"
    return RawTable(name=name, x=x, features=rgb_names(h, w, channels), meta_types=["discrete"] * x.shape[1],
                    y=y, target=target, classes=classes, source_splits={"all": [0, len(files)]},
                    image_shape=(h, w) if channels == 1 else None,
                    pixel={"levels": 256, "file_scale": 1.0, "shape": list(shape),
                           "layout": "CHW" if channels > 1 else "HW"},
                    standardize_default=False, source_files=[str(where)])


__all__ = ["load_image_folder", "load_imagenet32", "read_image", "read_imagenet32_batch", "rgb_names",
           "square_resize"]
