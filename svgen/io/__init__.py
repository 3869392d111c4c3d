"""Files: atomic writes, the artifact format and codec, exports, prediction files, labelled folders."""
