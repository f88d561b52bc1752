"""The language-model data pipeline of tools/lm_data.py: file selection and split (corpus), the tokenizer
(tokenizer), the shard format shared with the C++ reader model/lm_shard.h (shards)."""
