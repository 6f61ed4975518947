"""The dataset registry: names, what they are, where to get them, and their loaders.

A loader takes the path given with ``--path`` (a file or a folder) or, when that is None,
looks in its default folder under the data root (env ``MPIFC_DATA``, else
``<repo>/../shared/data``). Loaders do no preprocessing: they parse, name the features, give
their raw meta-types and the dataset's own train/test split where it has one. To add a
dataset, write a loader (``tabular.py``, ``images.py``) and register it here.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from mpifc.errors import UserError

from .files import default_data_root
from .image_sets import load_image_folder, load_imagenet32
from .images import load_digits, load_mnist
from .table import RawTable
from .tabular import load_adult, load_breast_cancer, load_credit, load_debd


@dataclass(frozen=True)
class DatasetInfo:
    """A registry entry: what the dataset is and where to get it."""

    name: str
    summary: str
    folder: str | None
    source: str
    load: Callable[[str, Path | None, Path], RawTable]


def _load_csv(name: str, path: Path | None, data_root: Path, target: str | None = None,
              schema: Path | None = None) -> RawTable:
    from .usercsv import load_user_table

    if path is None:
        raise UserError("--dataset csv needs --path FILE (a .csv, or a .npy with a schema)")
    return load_user_table(name, path, target, schema)


DATASETS: dict[str, DatasetInfo] = {
    d.name: d for d in [
        DatasetInfo("breast-cancer", "Wisconsin breast cancer, 569 x 30 real, binary "
                    "(the embedded default)", None, "shipped with scikit-learn",
                    load_breast_cancer),
        DatasetInfo("digits", "8x8 digit images, 1797 rows, 10 classes (embedded image "
                    "default)", None, "shipped with scikit-learn", load_digits),
        DatasetInfo("adult", "UCI Adult / income, 48842 x 14 mixed, binary (>50K)", "adult",
                    "https://archive.ics.uci.edu/dataset/2/adult", load_adult),
        DatasetInfo("credit", "Give Me Some Credit, 150000 x 10, binary (SeriousDlqin2yrs)",
                    "credit", "https://www.kaggle.com/c/GiveMeSomeCredit (cs-training.csv)",
                    load_credit),
        DatasetInfo("mnist", "MNIST 28x28 digits, 60k train / 10k test, 10 classes", "mnist",
                    "mnist.pkl.gz (deeplearning.net) or the idx files", load_mnist),
        DatasetInfo("imagenet32", "downsampled ImageNet 32x32 RGB, 1.28M train / 50k val, 1000 "
                    "classes (imagenet32:K reads K train batches)", "imagenet32",
                    "https://image-net.org/download-images.php (Imagenet32_train_npz.zip, "
                    "Imagenet32_val_npz.zip)", load_imagenet32),
        DatasetInfo("image-folder", "a folder of PNG/NPY/JPEG images, e.g. CelebA (sub-folders = "
                    "classes; image-folder:S crops and resizes to SxS)", "celeba",
                    "your images; CelebA: https://mmlab.ie.cuhk.edu.hk/projects/CelebA.html",
                    load_image_folder),
        DatasetInfo("debd", "binary density-estimation sets, e.g. debd:nltcs", "debd",
                    "https://github.com/arranger1044/DEBD", load_debd),
        DatasetInfo("csv", "your own CSV (--path FILE --target COLUMN; column types inferred, or "
                    "from a JSON schema) or NPY file with a schema", None,
                    "your own data", _load_csv),
    ]
}


def load_dataset(name: str, path: str | Path | None = None,
                 data_root: str | Path | None = None, *, target: str | None = None,
                 schema: str | Path | None = None) -> RawTable:
    """Load dataset ``name`` (``debd:SET`` for a DEBD set) from ``path`` or the data root.

    ``target`` and ``schema`` (``--target``, ``--schema``) apply to ``csv`` alone.

    Raises:
        UserError: unknown dataset, missing file, or malformed content.
    """
    key = name.partition(":")[0]
    info = DATASETS.get(key)
    if info is None:
        raise UserError(f"unknown dataset {name!r} (known: {', '.join(DATASETS)}; "
                        "see python -m data_prep --list)")
    root = Path(data_root) if data_root is not None else default_data_root()
    path = None if path is None else Path(path)
    if key == "csv":
        return _load_csv(name, path, root, target, None if schema is None else Path(schema))
    for flag, value in (("--target", target), ("--schema", schema)):
        if value is not None:
            raise UserError(f"{flag} is for --dataset csv (your own table); {name} names its own columns")
    return info.load(name, path, root)
