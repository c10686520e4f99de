"""An unmodified Hugging Face Trainer run (a tiny Llama built from a config): the optimizer is
built inside the Trainer, so the raw-loop attach leaves it to the Trainer's own path."""

import torch
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

torch.manual_seed(0)
config = LlamaConfig(
    vocab_size=97,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
    pad_token_id=0,
)
model = LlamaForCausalLM(config)
rows = [{"input_ids": torch.randint(1, 97, (16,)).tolist()} for _ in range(8)]


def collate(batch):
    ids = torch.tensor([row["input_ids"] for row in batch])
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}


args = TrainingArguments(
    output_dir="trainer_out",
    max_steps=2,
    per_device_train_batch_size=2,
    report_to=[],
    use_cpu=True,
    disable_tqdm=True,
    save_strategy="no",
)
Trainer(model=model, args=args, train_dataset=rows, data_collator=collate).train()
print("trained")
