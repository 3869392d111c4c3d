"""The kernel machine's math: kernels and random Fourier features, the support vector generator, its
losses, the text metric, the support set, and bounded-memory solves for many classes."""
