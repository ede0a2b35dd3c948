"""Builds a BlendedDataset of three GPTDatasets with megatron-core (its own helpers, or
croupier's under ``croupier.compat.megatron.patch()``) and prints, as JSON, a digest of every
sample read and of every cached index file. Run by tests/test_compat_megatron_helpers.py:

    python megatron_build.py DATA_DIR PORT {megatron,croupier,index-free} CACHE_DIR

``index-free`` builds under ``patch(index_free=True)`` and also prints, per split, the
``(dataset, sample)`` of every blended position and each GPTDataset's shuffle index.
"""

import hashlib
import json
import os
import sys
import warnings

warnings.simplefilter("ignore")
import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from megatron.core.datasets.blended_megatron_dataset_builder import (  # noqa: E402
    BlendedMegatronDatasetBuilder,
)
from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig  # noqa: E402
from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder  # noqa: E402

work = sys.argv[1]
cache_dir = sys.argv[4]
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{sys.argv[2]}", rank=0, world_size=1)
rng = np.random.default_rng(0)
prefixes = []
for k in range(3):
    prefix = os.path.join(work, f"data{k}")
    prefixes.append(prefix)
    if os.path.exists(prefix + ".idx"):
        continue
    b = IndexedDatasetBuilder(prefix + ".bin", dtype=np.int32)
    for _ in range(200 + 100 * k):
        b.add_item(
            torch.from_numpy(rng.integers(2, 1000, size=int(rng.integers(1, 90))).astype(np.int32))
        )
        b.end_document()
    b.finalize(prefix + ".idx")


class Tok:
    """The little of a tokenizer GPTDataset reads."""

    def __init__(self) -> None:
        self.vocab_size = 1000
        self.eod = 0
        self.pad = 1
        self.unique_identifiers = {"class": "Tok"}


def build(cache):
    config = GPTDatasetConfig(
        random_seed=1234,
        sequence_length=64,
        blend=(prefixes, [0.5, 0.3, 0.2]),
        split="90,5,5",
        path_to_cache=cache,
        tokenizer=Tok(),
        reset_position_ids=False,
        reset_attention_mask=False,
        eod_mask_loss=False,
        mid_level_dataset_surplus=0.5,
    )
    return BlendedMegatronDatasetBuilder(GPTDataset, [2000, 100, 50], lambda: True, config).build()


patched = False
if sys.argv[3] in ("croupier", "index-free"):
    import croupier.compat.megatron as cm

    with cm.patch(index_free=sys.argv[3] == "index-free"):
        patched = cm._patched()
        datasets = build(cache_dir)
    assert not cm._patched()
else:
    datasets = build(cache_dir)
digest = {}
for split, ds in zip(["train", "valid", "test"], datasets, strict=True):
    h = hashlib.sha256()
    for i in range(len(ds)):
        h.update(ds[i]["tokens"].numpy().tobytes())
    digest[split] = (len(ds), h.hexdigest())
files = {}
for root, _, names in os.walk(cache_dir):
    for n in sorted(names):
        with open(os.path.join(root, n), "rb") as f:
            files[n] = hashlib.sha256(f.read()).hexdigest()
blends = {}
if sys.argv[3] == "index-free":
    for split, ds in zip(["train", "valid", "test"], datasets, strict=True):
        blends[split] = {
            "positions": [
                [int(ds.dataset_index[i]), int(ds.dataset_sample_index[i])] for i in range(len(ds))
            ],
            "weights": [float(w) for w in ds.weights],
            "sizes": [len(d) for d in ds.datasets],
            "shuffles": [
                [d.shuffle_index[:].tolist(), len(d.sample_index) - 1] for d in ds.datasets
            ],
            # Sample (d, s) of the blend is GPTDataset d's sample s.
            "same": all(
                np.array_equal(
                    ds[i]["tokens"],
                    ds.datasets[ds.dataset_index[i]][int(ds.dataset_sample_index[i])]["tokens"],
                )
                for i in range(0, len(ds), 7)
            ),
        }
print(json.dumps({"samples": digest, "files": files, "patched": patched, "blends": blends}))
dist.destroy_process_group()
