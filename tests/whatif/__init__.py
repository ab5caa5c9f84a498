"""The what-if corpus: generated Megatron-style jobs (``generate``), their reference replay
(``oracle``) and the named jobs (``corpus``). ``README.md`` beside this file specifies the
format and the semantics."""
