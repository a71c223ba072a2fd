"""Data: from the immutable raw files to the batches' bytes, and pretrained weights.

The raw-data guard (`rawdata`, `manifest`, `rawdata_hook`), the record of the files streams
read from elsewhere (`sources`), processed data written all-or-nothing and staged to
node-local disk (`processed`), shards of many small files (`shards`), streams that resume
exactly (`streams`; tar shards in `tars`, Hugging Face streams in `hf_streams`), pretrained
weights (`pretrained`) and the file-digest cache (`hashcache`).

May import: the seam (`task`, `config`, `errors`, `settings`). Never: `engine`, `observe`,
`experiments`, `ops`, `tasks`.
"""
