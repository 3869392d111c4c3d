"""The heads (kernel vote, linear, cosine): their scores, logits and probabilities."""
