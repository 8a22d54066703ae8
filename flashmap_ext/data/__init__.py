"""The self-answered corpus: prompts (`prompts`), the refill-batch engine (`engine`) and the `flashmap data
generate` command (`generate`); its jsonl.gz shards are written and read by `train.store`."""
