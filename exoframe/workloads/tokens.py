"""Token streams from files, cut into training windows.

- a nanoGPT token file (`.bin`: uint16 or uint32 tokens, nothing else), opened once in the
  launcher as a read-only np.memmap (its length and dtype) whose windows each rank reads
  with pread: the ranks share the operating system's page cache, and no node copies or
  maps the file;
- a text file, byte-level (its bytes, read the same way) or character-level (its
  characters, numbered in sorted order, encoded once in the launcher and shared copy-on-write);
- a dataset saved with Hugging Face `datasets`' save_to_disk (its `input_ids` lists, or a
  text column encoded as above): the `hf` extra, imported only when used.

Nothing here reaches the network.
"""
from __future__ import annotations

import os
import weakref
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from ..errors import ExoframeError
from ..host_memory import check_fits, gigabytes

TOKEN_DTYPES = ("uint16", "uint32")
TOKENIZERS = ("char", "byte")
SCAN_CHUNK = 1 << 24  # tokens read at a time to find the largest (not mapped: no resident pages)
# Bytes of memory per byte of text numbered by character (the text, its UTF-32 codes, their
# sorted copy, their 8-byte places) and per byte of a saved dataset's token ids (the lists,
# joined, narrowed).
CHAR_TEXT_FACTOR, IDS_FACTOR = 24, 3


class TokenWindows(Dataset):
    """Windows of block_size + 1 tokens of a 1-D token array, starting every block_size
    tokens from `start` (window i: tokens[start + i*block_size : ... + block_size + 1]),
    the last ending at or before `stop`. Reads only the windows asked for."""

    def __init__(self, tokens: np.ndarray, block_size: int, start: int = 0, stop=None):
        self.tokens, self.block_size = tokens, block_size
        self.start = start
        self.stop = len(tokens) if stop is None else stop
        self.offsets = np.arange(block_size + 1)
        self.file = FileWindows(tokens, block_size + 1) if isinstance(tokens, np.memmap) else None

    def __len__(self):
        return max(0, (self.stop - self.start - 1) // self.block_size)

    def position(self, i: int) -> int:
        """Where window i starts in the token array."""
        return self.start + i * self.block_size

    def __getitem__(self, i):
        return self.__getitems__([i])[0]

    def __getitems__(self, indices):
        starts = self.start + np.asarray(indices, dtype=np.int64) * self.block_size
        if self.file is not None:
            windows = self.file.read(starts)
        else:
            windows = self.tokens[starts[:, None] + self.offsets]
        return [(row,) for row in torch.from_numpy(windows.astype(np.int64))]


class FileWindows:
    """Windows of a token file read with pread, not through its mapping: a mapped page read
    by a rank stays in that process's resident memory (and the kernel's read-ahead maps
    whole neighbourhoods), so 64 nodes reading random windows of a 1 GB file would come to
    hold most of it. Each process opens the file once, on its first read (ranks are forked)."""

    def __init__(self, tokens: np.memmap, length: int):
        self.path, self.offset = tokens.filename, tokens.offset
        self.dtype, self.length = tokens.dtype, length
        self.fd, self.pid = None, None

    def read(self, starts: np.ndarray) -> np.ndarray:
        if self.pid != os.getpid():
            self.fd, self.pid = os.open(self.path, os.O_RDONLY), os.getpid()
            weakref.finalize(self, os.close, self.fd)  # closed with the reader
        width = self.dtype.itemsize
        windows = [os.pread(self.fd, self.length * width, self.offset + int(start) * width)
                   for start in starts]
        if any(len(window) < self.length * width for window in windows):
            raise ExoframeError(
                f"the token file '{self.path}' shrank while the run read it (now "
                f"{os.fstat(self.fd).st_size} bytes): leave a data file unchanged during a "
                "run (write a new one under another name).")
        return np.stack([np.frombuffer(window, self.dtype) for window in windows])

    def __getstate__(self):
        return {**self.__dict__, "fd": None, "pid": None}


def load_tokens(path: str, what: str, dtype: str, tokenizer: str, column=None,
                vocab=None) -> tuple[np.ndarray, object]:
    """(1-D token array, vocabulary) of a token file, text file or saved dataset folder.
    The vocabulary is None, except for character-level text: the sorted characters, which
    `vocab` (another file's) extends so that train and validation share one numbering."""
    file = Path(path)
    if not file.exists():
        raise ExoframeError(f"{what}: no such file or folder '{path}'; give a nanoGPT token "
                            "file (.bin), a text file or a folder saved by datasets' "
                            "save_to_disk.")
    if file.is_dir():
        return dataset_tokens(file, what, tokenizer, column, vocab)
    if file.suffix == ".bin":
        return token_file(file, what, dtype), None
    if tokenizer == "byte":
        return np.memmap(file, dtype=np.uint8, mode="r") if file.stat().st_size else \
            np.zeros(0, np.uint8), None
    size = file.stat().st_size
    check_fits(f"{what}: numbering the characters of '{path}' ({gigabytes(size)}) takes",
               CHAR_TEXT_FACTOR * size, "read it byte by byte (-w tokenizer=byte) or give a "
               "nanoGPT token file (.bin)")
    return encode_chars(file.read_text(encoding="utf-8", errors="replace"), vocab)


def token_file(file: Path, what: str, dtype: str) -> np.ndarray:
    if dtype not in TOKEN_DTYPES:
        raise ExoframeError(f"dtype: nanoGPT token files hold uint16 or uint32 tokens, got "
                            f"'{dtype}'.")
    size, width = file.stat().st_size, np.dtype(dtype).itemsize
    if size % width:
        raise ExoframeError(f"{what}: '{file}' has {size} bytes, not a whole number of {dtype} "
                            f"tokens ({width} bytes each): is it a token file, and is the dtype "
                            f"right (-w dtype={'uint32' if dtype == 'uint16' else 'uint16'})?")
    if size == 0:
        return np.zeros(0, dtype)
    return np.memmap(file, dtype=dtype, mode="r")


def largest_token(tokens: np.ndarray, path: str) -> int:
    """The largest token, read in chunks from the file (for a memmap) so that the scan
    leaves no mapped pages resident in the launcher."""
    if not isinstance(tokens, np.memmap):
        return int(tokens.max()) if len(tokens) else -1
    largest = -1
    with open(path, "rb") as f:
        f.seek(tokens.offset)
        while True:
            chunk = np.fromfile(f, dtype=tokens.dtype, count=SCAN_CHUNK)
            if not len(chunk):
                return largest
            largest = max(largest, int(chunk.max()))


def encode_chars(text: str, vocab=None) -> tuple[np.ndarray, np.ndarray]:
    """Characters numbered by their place in the sorted vocabulary (text's own, with `vocab`)."""
    codes = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
    chars = np.unique(codes) if vocab is None else np.union1d(vocab, codes)
    dtype = np.uint16 if len(chars) <= 1 << 16 else np.uint32
    return np.searchsorted(chars, codes).astype(dtype), chars


def dataset_tokens(folder: Path, what: str, tokenizer: str, column, vocab):
    """A save_to_disk folder: a Dataset, or a DatasetDict's "train" split."""
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        import datasets
    except ImportError:
        raise ExoframeError(f"{what}: '{folder}' is a folder, read as a Hugging Face dataset, "
                            "which needs the hf extra: pip install 'exoframe[hf]'.") from None
    try:
        data = datasets.load_from_disk(str(folder))
    except (FileNotFoundError, ValueError) as e:
        raise ExoframeError(f"{what}: '{folder}' is not a dataset saved by save_to_disk "
                            f"({str(e).splitlines()[0]}).") from None
    if isinstance(data, datasets.DatasetDict):
        if "train" not in data:
            raise ExoframeError(f"{what}: '{folder}' holds the splits {sorted(data)}, no "
                                "'train'; save the split to read on its own.")
        data = data["train"]
    names = data.column_names
    column = column or ("input_ids" if "input_ids" in names else "text")
    if column not in names:
        raise ExoframeError(f"column: '{folder}' has no column '{column}'; it has "
                            f"{', '.join(names)} (-w column=NAME).")
    size = data.data.column(column).nbytes  # (memory-mapped: nothing read yet)
    check_fits(f"{what}: reading column '{column}' of '{folder}' ({gigabytes(size)} on disk) "
               "takes", (IDS_FACTOR if column == "input_ids" else CHAR_TEXT_FACTOR) * size,
               "give a smaller dataset, or write its tokens to a nanoGPT token file (.bin), "
               "which is read window by window")
    values = data.with_format("numpy")[column] if column == "input_ids" else data[column]
    if column == "input_ids" or not isinstance(values[0] if len(values) else "", str):
        tokens = np.concatenate([np.asarray(v).ravel() for v in values]) if len(values) \
            else np.zeros(0, np.int64)
        if len(tokens) and tokens.min() < 0:
            raise ExoframeError(f"column: '{column}' of '{folder}' holds negative token ids.")
        return tokens.astype(np.uint32 if len(tokens) and tokens.max() >= 1 << 16
                             else np.uint16), None
    text = "\n".join(values)
    if tokenizer == "byte":
        return np.frombuffer(text.encode("utf-8"), dtype=np.uint8), None
    return encode_chars(text, vocab)


def token_windows(data: str, val_data, block_size: int, dtype: str, tokenizer: str,
                  column, vocab_size):
    """(train windows, val windows, vocabulary size) of the files a workload names; without
    val_data the last tenth of data's windows are validation."""
    if tokenizer not in TOKENIZERS:
        raise ExoframeError(f"tokenizer: read text as 'char' or 'byte', got '{tokenizer}'.")
    train, chars = load_tokens(data, "data", dtype, tokenizer, column)
    val = None
    if val_data is not None:
        val, chars = load_tokens(val_data, "val_data", dtype, tokenizer, column, chars)
        if chars is not None:  # one numbering for both: encode train again with the union
            train, _ = load_tokens(data, "data", dtype, tokenizer, column, chars)
    for tokens, name, path in ((train, "data", data), (val, "val_data", val_data)):
        if tokens is not None and len(tokens) < block_size + 1:
            raise ExoframeError(f"{name}: '{path}' has {len(tokens)} tokens, fewer than one "
                                f"window of block_size + 1 = {block_size + 1}; give more data "
                                "or a smaller block_size (-w block_size=N).")
    largest = max(largest_token(t, p) for t, p in ((train, data), (val, val_data))
                  if t is not None)
    if chars is not None:
        largest = max(largest, len(chars) - 1)
    elif tokenizer == "byte" and not Path(data).suffix == ".bin":
        largest = max(largest, 255)
    if vocab_size is None:
        vocab_size = largest + 1
    elif largest >= vocab_size:
        raise ExoframeError(f"vocab_size: the data holds token {largest}, beyond the "
                            f"vocabulary of {vocab_size}; give at least {largest + 1} or leave "
                            "vocab_size out (read from the data).")
    if val is None:
        windows = (len(train) - 1) // block_size
        split = (windows - max(1, windows // 10)) * block_size
        if split <= 0:
            raise ExoframeError(f"data: '{data}' has {windows} window(s) of {block_size + 1} "
                                "tokens, too few to hold some back for validation; give more "
                                "data, val_data, or a smaller block_size.")
        return TokenWindows(train, block_size, 0, split + 1), \
            TokenWindows(train, block_size, split), vocab_size
    return TokenWindows(train, block_size), TokenWindows(val, block_size), vocab_size
