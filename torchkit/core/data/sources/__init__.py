"""The one data resolver: what `--data` (or IMAGES) names, for every command that reads images.

The grammar, the same for every command: an image folder `ROOT/<class>/<image>`; a split root
whose subfolders are `train/`, `val/` and/or `test/`, each an image folder; a CSV index
`path,label` with an optional `split` column (paths relative to the CSV's folder; UTF-8 with or
without BOM); or `digits`. A CSV with a `split` column is split data everywhere, like a split root.
Data in container files is asked first (`containers.READERS`): `parquet` reads Hugging Face
datasets stored as parquet (HF's folder layout, a folder of `.parquet` files, one file; ids
`FILE/ROW`), each image a `stored.StoredImage` read by row group; `shards` reads WebDataset tar
shards (a brace pattern `DIR/train-{000000..000127}.tar`, `::` lists, a folder of shards, which
is split data when they are all `{train,val,test}-NNNNNN.tar`; ids `SHARD/KEY.EXT`) and a `.tar`
of an image folder or split root (ids the member paths), indexing the tar headers once and
reading each image by offset and size.

One path convention: `Samples.ids[i]` is the `path` column of every output that names image i,
relative to `DataSource.root` (a split root's include the split folder, `train/cat/1.png`; a CSV
index's are exactly as the CSV writes them; digits' are `digits/0042`). Outputs record the root
beside the CSV (JSON/meta), so joining two outputs on `path` just works.

API
---
    open_data(spec, *, classes=None, allow_unlabelled=False) -> DataSource
        Read the data once. `classes`: label by a model's class names. `allow_unlabelled`:
        also a folder of images without class folders and a CSV without labels (class "").
    open_labelled(spec, refused=None) -> (DataSource, InputError | None)
        open_data with labels; split data with an unlabelled split beside labelled ones
        (HF's test split of label -1, a split root's test/ without class folders) read with
        that split unlabelled, and the error it is refused with where labels are needed (eval,
        train). `refused(source)`: the caller refuses such data (no warning of it given).
    select_split(source, split, *, default, recorded=None, default_reason="")
            -> (Samples, notes)
        The samples `--split` names: train | val | test | all | None (the whole of unsplit data,
        the `default` split of split data). `all`: every split, `Samples.splits` telling each
        sample's. `recorded` (a checkpoint's `data` entry) makes the split a training run held
        out itself selectable on data that has none. A split that cannot apply is a
        UsageError, never ignored. Print the notes on stderr.
    training_splits(source, *, val_split, seed, recorded=None) -> (splits, notes)
        train's train/val(/test): the data's own, or a stratified seeded share held out.
    split_record(source, splits) -> dict       the checkpoint's `data` entry
    write_split_csv(path, splits)               RUN/split.csv: path,label,split (atomic)
    warn_empty_splits(source)                   a warning per split folder holding no image
                                                (`DataSource.empty_splits`, read as no split)
    warn_stray_images(source, fate="")         a warning per folder with images beside its class
                                                folders, which are not read (`DataSource.strays`)
    non_image_files(source, splits=None)        what a folder source leaves out
    csv_samples(path, *, classes=None, allow_unlabelled=False) -> Samples
        every row of a CSV index in file order, labels as class names or mapped onto `classes`

How each command uses it:
    train             open_labelled(--data); training_splits(..., recorded=resumed checkpoint's
                      `data`); writes split.csv and checkpoint["data"] = split_record(...)
    dataset-stats     open_data(ROOT, allow_unlabelled=True) inside samples.partial_labels_kept;
                      select_split(..., default="train"): statistics of training data
    split             open_data(ROOT, allow_unlabelled=True) inside samples.partial_labels_kept;
                      refuses data already split, and partly labelled data
    eval              open_labelled(--data), labelled by the model's classes;
                      select_split(..., default="test", recorded=checkpoint.get("data"))
    extract-features  open_data(IMAGES, allow_unlabelled=True) inside partial_labels_kept;
                      select_split(..., default="all"): `split` column from Samples.splits,
                      `label` the class name, `path` from Samples.ids
    predict           open_data(IMAGES, allow_unlabelled=True) inside partial_labels_kept;
                      select_split(..., default="all")
    convert shards    open_data(SRC, allow_unlabelled=True) inside samples.partial_labels_kept:
                      partly labelled data written with the labels it has

Modules beneath it, each imported directly: `samples` (the `Samples` record every reader gives),
`discovery` (image files and folders on disk), `digits` (the built-in `digits`), `splitting`
(split names and the seeded stratified split), `csv_index` (reading a CSV index), `source`,
`select` and `record` (the API above); `containers`, `stored` and the container readers
(`parquet`, `shards`).
"""

from torchkit.core.data.sources.record import (
    SPLIT_CSV,
    SPLIT_CSV_COLUMNS,
    recorded_splits,
    split_record,
    write_split_csv,
)
from torchkit.core.data.sources.select import (
    ALL,
    DEFAULT_VAL_SPLIT,
    SPLIT_CHOICES,
    select_split,
    training_splits,
    warn_empty_splits,
    warn_stray_images,
)
from torchkit.core.data.sources.source import (
    KINDS,
    DataSource,
    concatenate,
    csv_samples,
    non_image_files,
    open_data,
    open_labelled,
)

__all__ = [
    "ALL",
    "DEFAULT_VAL_SPLIT",
    "KINDS",
    "SPLIT_CHOICES",
    "SPLIT_CSV",
    "SPLIT_CSV_COLUMNS",
    "DataSource",
    "concatenate",
    "csv_samples",
    "non_image_files",
    "open_data",
    "open_labelled",
    "recorded_splits",
    "select_split",
    "split_record",
    "training_splits",
    "warn_empty_splits",
    "warn_stray_images",
    "write_split_csv",
]
