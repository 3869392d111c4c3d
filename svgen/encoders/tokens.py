"""Prompts to tokens, each prompt's BPE ids computed once.

open_clip's tokenizer cleans every prompt with ftfy before its BPE: most of a prompt's tokenisation. svgen looks at
the ids twice — which prompts exceed the context (:meth:`svgen.encoders.clip.ClipEncoder.too_long`), then the
tokens to encode — so the ids are kept in a memo the encoder drops once the prompts are encoded.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence

import torch


def token_ids(tokenizer, prompts: Sequence[str], memo: Dict[str, List[int]]) -> Optional[List[List[int]]]:
    """BPE ids of each prompt (from ``memo`` where known) for open_clip's own tokenizer; ``None`` for any other
    (the caller then calls it as it is)."""
    from open_clip.tokenizer import SimpleTokenizer

    if not isinstance(tokenizer, SimpleTokenizer) or tokenizer.reduction_fn is not None:
        return None
    return [memo[p] if p in memo else memo.setdefault(p, tokenizer.encode(p)) for p in prompts]


def tokenize(tokenizer, prompts: Sequence[str], memo: Dict[str, List[int]]) -> torch.Tensor:
    """``tokenizer(prompts)``, built from :func:`token_ids` where it is open_clip's tokenizer."""
    ids = token_ids(tokenizer, prompts, memo)
    if ids is None:
        return tokenizer(list(prompts))
    n = tokenizer.context_length
    out = torch.zeros(len(ids), n, dtype=torch.long)
    for i, t in enumerate(ids):   # as SimpleTokenizer.__call__: start, ids, end; cut to n with the end kept
        t = [tokenizer.sot_token_id, *t[:n - 2], tokenizer.eot_token_id]
        out[i, :len(t)] = torch.tensor(t)
    return out
