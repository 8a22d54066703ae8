"""The self-answered corpus: prompts (`prompts`), the refill-batch engine (`engine`), jsonl.gz shards
(`store`) and the `flashmap data generate` command (`generate`)."""
