"""The recall towers with their four tables sharded over the torchrun ranks by TorchRec.

As DIN's sharded trainer (training.sharded) and sharing its machinery (training.sharded.ShardedTables):
the towers' candidate tables E (items, categories) and behaviour tables X are a TorchRec
``EmbeddingCollection`` under ``DistributedModelParallel`` with FBGEMM's fused row-wise Adagrad; the
dense part — the recency weights and the MLP, models.towers — is replicated under DDP with Adam. Each
step looks up the batch's behaviours, its targets and the shared sampled negatives (the softmax is always
sampled: the whole catalog is never scored per step) and trains as training.towers_train's unsharded
trainer does with ``table_optimizer=rowwise_adagrad`` — the same samples, negatives and initial rows.

Validation and test HR@n score every item, so rank 0 gathers the tables into a plain Towers for them
(the other ranks wait) and for the bundle; that keeps whole tables in rank 0's host memory at each
epoch's end (the training steps never need them).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import torch
import torch.distributed as dist
from torch import nn

from dinrec.models.din import table_rows
from dinrec.models.towers import TABLES, Towers
from dinrec.training.samples import Split
from dinrec.training.sharded import ShardCheckpoints, ShardedTables, join_group, refuse_unsupported
from dinrec.training.towers_train import TowersTrainer, hit_rate_at, sampled_softmax

# feature → table: behaviours look up X, targets and negatives look up E
FEATURES = {"hist_items": "hist_item_emb", "hist_cats": "hist_cat_emb", "cand_items": "item_emb",
            "cand_cats": "cat_emb"}


class ShardedTowersLoss(nn.Module):
    """The towers' sampled-softmax loss with the tables in a TorchRec EmbeddingCollection (built on the
    meta device: TorchRec's planner places them); the dense part is models.towers.Towers' own."""

    item_category: torch.Tensor  # (I,) a buffer: each item's category index

    def __init__(self, dense: Towers, n_items: int, n_categories: int, item_category: torch.Tensor) -> None:
        super().__init__()
        from torchrec import EmbeddingCollection, EmbeddingConfig

        self.dense = dense
        rows = {"item_emb": n_items, "hist_item_emb": n_items, "cat_emb": n_categories, "hist_cat_emb": n_categories}
        self.tables = EmbeddingCollection(tables=[
            EmbeddingConfig(name=table, embedding_dim=dense.cfg.dim, num_embeddings=rows[table], feature_names=[f])
            for f, table in FEATURES.items()], device=torch.device("meta"))
        self.register_buffer("item_category", item_category, persistent=False)

    def forward(self, hist: torch.Tensor, cats: torch.Tensor, target: torch.Tensor,
                neg: torch.Tensor | None) -> torch.Tensor:
        from torchrec import KeyedJaggedTensor

        assert neg is not None  # always sampled
        b, length = hist.shape
        cand = torch.cat([target, neg])  # (B + M,) targets, then the negatives the batch shares
        cand_cats = self.item_category[cand]
        # One KJT, every key B samples long: L behaviours each; one target each, the negatives on the last.
        hist_lengths = torch.full((b,), length, dtype=torch.long, device=hist.device)
        cand_lengths = torch.ones(b, dtype=torch.long, device=hist.device)
        cand_lengths[-1] += len(neg)
        kjt = KeyedJaggedTensor(keys=list(FEATURES), values=torch.cat([hist.reshape(-1), cats.reshape(-1), cand,
                                                                       cand_cats]),
                                lengths=torch.cat([hist_lengths, hist_lengths, cand_lengths, cand_lengths]))
        out = self.tables(kjt)

        def rows(feature: str, idx: torch.Tensor) -> torch.Tensor:
            # Index 0 is padding / unknown: a zero vector with no gradient, as nn.Embedding(padding_idx=0) has.
            return out[feature].values() * (idx != 0).unsqueeze(1)  # (N, D)

        h = (rows("hist_items", hist.reshape(-1)) + rows("hist_cats", cats.reshape(-1))).reshape(b, length, -1)
        users = self.dense.users_from(h, (hist != 0) | (cats != 0))  # (B, D)
        items = nn.functional.normalize(rows("cand_items", cand) + rows("cand_cats", cand_cats), dim=-1)  # (B+M, D)
        return sampled_softmax(users, items[:b], items[b:], target, neg, self.dense.cfg.temperature)


class ShardedTowersTrainer(ShardCheckpoints, TowersTrainer):
    """training.towers_train.TowersTrainer with the four tables sharded (see the module docstring)."""

    def _build_model(self, init: Callable[[Towers], dict] | None) -> dict | None:
        refuse_unsupported(init)
        join_group(self.info)
        # The dense part: Towers with one-row tables, dropped (its dense layers draw from the generator exactly
        # as whole towers' do, and table_seed after them).
        self.model = Towers(replace(self.cfg, n_items=1, n_categories=1))
        for table in TABLES:
            setattr(self.model, table, None)
        self.model.to(self.device)
        loss = ShardedTowersLoss(self.model, self.cfg.n_items, self.cfg.n_categories, self.item_category)
        self.tables = ShardedTables(loss, TABLES, device=self.device, world_size=self.info.world_size,
                                    lr=self.s.table_lr or self.s.lr, sharding=self.s.sharding)
        self.step_fn = self.tables.module
        seed = self.model.table_seed
        self.tables.init(lambda name, start, stop, dim: table_rows(seed, f"towers.{name}", start, stop, dim))
        self._whole: Towers | None = None  # rank 0's gathered towers (evaluation, the best epoch, the bundle)
        return None

    def _optimizers(self) -> list[torch.optim.Optimizer]:
        """Adam for the dense part; the tables' fused optimizer runs inside the backward pass."""
        return [torch.optim.Adam(self.model.dense_parameters(), lr=self.s.lr, weight_decay=self.s.weight_decay)]

    def _gather(self) -> Towers | None:
        """The towers whole on rank 0 (every rank takes part); None elsewhere."""
        full = self.tables.gather(self.info.is_main)
        if full is None:
            return None
        if self._whole is None:
            with torch.random.fork_rng(devices=[]):  # building them must not move the run's generator
                self._whole = Towers(self.cfg)
        dense = {k: v for k, v in self.model.state_dict().items()}
        self._whole.load_state_dict({**dense, **{f"{t}.weight": full[t] for t in TABLES}})
        return self._whole.to(self.device).eval()

    def _hit_rate(self, split: Split) -> float:
        return self._hit_rate_of(self._gather(), split)

    def _hit_rate_of(self, model: Towers | None, split: Split) -> float:
        """Scored on rank 0 (which holds the gathered towers), the same figure on every rank."""
        hr = [hit_rate_at(model, self.samples, split, self.s.eval_n, self.item_category) if model else 0.0]
        if self.info.enabled:
            dist.broadcast_object_list(hr, src=0)  # every rank takes the same early-stopping decision
        return hr[0]

    def _snapshot(self) -> dict | None:
        """Rank 0's towers as the last _hit_rate gathered them (this epoch's)."""
        if self._whole is None:
            return None
        return {k: v.detach().clone() for k, v in self._whole.state_dict().items()}

    def _final_model(self) -> Towers | None:
        whole = self._gather()  # (collective) the last epoch's, replaced by the best epoch's below
        if whole is not None and self.best_state is not None:
            whole.load_state_dict(self.best_state)
        return whole

