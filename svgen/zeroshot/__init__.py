"""The zero-shot fit: train the support vector generator from text, then solve the vote weights."""
