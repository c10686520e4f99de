"""A small Llama-style model (built from a config, no downloads) fine-tuned with PyTorch
Lightning, measured by flopmeter's Lightning callback: ``callbacks=[FlopMeterCallback()]``.

Gradient accumulation, padding and validation during training are in the run; every training
batch is counted once, validation is not. The running compute goes to the trainer's logger
(CSV here) as ``flopmeter/flops``, ``flopmeter/tokens`` and ``flopmeter/ratio_to_threshold``.

Run it with ``python examples/lightning_loop.py --output out/lightning``; on two CPU processes
with ``torchrun --nproc_per_node 2 examples/lightning_loop.py --devices 2``. Add
``--ckpt-path PATH`` to resume from a checkpoint (the counts continue).
"""

from __future__ import annotations

import argparse

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger
from transformers import LlamaConfig, LlamaForCausalLM

from flopmeter.integrations.lightning import FlopMeterCallback

PAD_ID = 0


def padded_batches(n_rows: int, vocab: int, max_len: int, seed: int) -> list[dict]:
    """Right-padded batches of 4 random rows each, with attention masks and labels."""
    g = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(n_rows // 4):
        lengths = torch.randint(max_len // 4, max_len + 1, (4,), generator=g).tolist()
        ids = torch.full((4, max(lengths)), PAD_ID, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for row, k in enumerate(lengths):
            ids[row, :k] = torch.randint(1, vocab, (k,), generator=g)
            mask[row, :k] = 1
        batches.append(
            {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}
        )
    return batches


class CausalLM(pl.LightningModule):
    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.model = LlamaForCausalLM(config)

    def training_step(self, batch, batch_idx):
        loss = self.model(**batch).loss
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        self.log("val_loss", self.model(**batch).loss)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", default="out/lightning", help="default_root_dir")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument("--ckpt-path", default=None, help="checkpoint to resume from")
    args = parser.parse_args()

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=1024,
        hidden_size=128,
        intermediate_size=344,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        pad_token_id=PAD_ID,
    )
    callback = FlopMeterCallback(model_name="example/tiny-llama-lightning")
    trainer = pl.Trainer(
        default_root_dir=args.output,
        max_epochs=args.epochs,
        accumulate_grad_batches=2,
        val_check_interval=4,
        accelerator="cpu",
        devices=args.devices,
        strategy="ddp" if args.devices > 1 else "auto",
        logger=CSVLogger(args.output),
        log_every_n_steps=2,
        callbacks=[callback, ModelCheckpoint(dirpath=f"{args.output}/checkpoints", save_top_k=-1)],
        enable_progress_bar=False,
    )
    train = padded_batches(64, config.vocab_size, 128, seed=1)
    val = padded_batches(8, config.vocab_size, 128, seed=2)
    # each element is already a batch: batch_size=None hands it through unchanged
    trainer.fit(
        CausalLM(config),
        torch.utils.data.DataLoader(train, batch_size=None),
        torch.utils.data.DataLoader(val, batch_size=None),
        ckpt_path=args.ckpt_path,
    )
    if trainer.is_global_zero:
        print(callback.meter.report().to_text())
        print(f"\nwrote {callback.meter.output}")


if __name__ == "__main__":
    main()
